"""Generate the Python code for the kubelet APIs restated in proto/: the device-plugin API
(proto/deviceplugin/v1beta1/api.proto) and the pod resources API (proto/podresources/v1/api.proto).

Each proto is compiled as if it lived in its package (nvplugin/api/v1beta1/,
nvplugin/api/podresources/v1/) so that the generated modules import each other by their package
path. The wire packages stay ``v1beta1`` and ``v1``.
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
PROTOS = (
    (REPO / "proto" / "deviceplugin" / "v1beta1" / "api.proto", Path("nvplugin/api/v1beta1")),
    (REPO / "proto" / "podresources" / "v1" / "api.proto", Path("nvplugin/api/podresources/v1")),
)
"""Each proto and the package its code goes to."""


def generate(out_root: Path) -> list[Path]:
    """Write api_pb2.py, api_pb2.pyi, api_pb2_grpc.py (+ .pyi) of every proto under out_root."""
    written: list[Path] = []
    for source, package_path in PROTOS:
        written += _generate_one(source, package_path, out_root)
    return written


def _generate_one(source: Path, package_path: Path, out_root: Path) -> list[Path]:
    """Write api_pb2.py, api_pb2.pyi, api_pb2_grpc.py (+ .pyi) under out_root/package_path."""
    # protoc finds the mypy plugins (protoc-gen-mypy, protoc-gen-mypy_grpc) on PATH; they are
    # installed beside this interpreter.
    bin_dir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    with tempfile.TemporaryDirectory() as staging:
        proto_copy = Path(staging) / package_path / "api.proto"
        proto_copy.parent.mkdir(parents=True)
        shutil.copyfile(source, proto_copy)
        target = out_root / package_path
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
                str(package_path / "api.proto"),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed with exit code {code}")
    return sorted(p for p in target.iterdir() if p.name.startswith("api_pb2"))


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO
    for path in generate(root):
        print(path)
