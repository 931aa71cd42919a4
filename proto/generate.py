"""Generate the Python code for proto/deviceplugin/v1beta1/api.proto.

The proto is compiled as if it lived at nvplugin/api/v1beta1/api.proto so that the
generated modules import each other by their package path. The wire package stays ``v1beta1``.
Usage: ``python proto/generate.py [OUTPUT_ROOT]`` (default: the repository root); tests call it
with a temporary root to check that the committed code is not stale.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "proto" / "deviceplugin" / "v1beta1" / "api.proto"
PACKAGE_PATH = Path("nvplugin/api/v1beta1")


def generate(out_root: Path) -> list[Path]:
    """Write api_pb2.py, api_pb2.pyi, api_pb2_grpc.py (+ .pyi) under out_root/PACKAGE_PATH."""
    # protoc finds the mypy plugins (protoc-gen-mypy, protoc-gen-mypy_grpc) on PATH; they are
    # installed beside this interpreter.
    bin_dir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    with tempfile.TemporaryDirectory() as staging:
        proto_copy = Path(staging) / PACKAGE_PATH / "api.proto"
        proto_copy.parent.mkdir(parents=True)
        shutil.copyfile(SOURCE, proto_copy)
        target = out_root / PACKAGE_PATH
        target.mkdir(parents=True, exist_ok=True)
        include = Path(protoc.__file__).parent / "_proto"
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{staging}",
                f"-I{include}",
                f"--python_out={out_root}",
                f"--mypy_out={out_root}",
                f"--grpc_python_out={out_root}",
                f"--mypy_grpc_out={out_root}",
                str(PACKAGE_PATH / "api.proto"),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed with exit code {code}")
    return sorted(p for p in target.iterdir() if p.name.startswith("api_pb2"))


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO
    for path in generate(root):
        print(path)
