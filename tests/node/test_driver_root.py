"""NVML from the host's driver root mounted in the container (NVIDIA's containerDriverRoot): the
library is found where driver installs put it, and loaded before NVML starts."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvplugin.node.driverfiles import LIBRARY_DIRS
from nvplugin.node.nvml import NVML_LIBRARY, driver_library


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="nvp-driver-root-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("directory", ["usr/lib/x86_64-linux-gnu", "usr/lib64", "lib"])
def test_the_library_is_found_under_the_driver_root(root: Path, directory: str) -> None:
    assert directory in LIBRARY_DIRS
    assert driver_library(str(root)) is None
    target = root / directory / NVML_LIBRARY
    target.parent.mkdir(parents=True)
    target.write_bytes(b"")
    assert driver_library(str(root)) == str(target)


@pytest.mark.process
def test_serve_loads_nvml_from_the_driver_root(root: Path) -> None:
    """A real ``nvplugin serve`` without --simulate, pointed at a driver root whose
    libnvidia-ml.so.1 is some other library: it loads that file (so NVML itself then fails to
    start, with a message), proving the path is the one used."""
    found = ctypes.util.find_library("m")
    assert found is not None
    stand_in = next(
        p
        for p in (
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
            "/lib64",
            "/usr/lib64",
            "/lib",
            "/usr/lib",
        )
        if os.path.exists(f"{p}/{found}")
    )
    target = root / "usr/lib64" / NVML_LIBRARY
    target.parent.mkdir(parents=True)
    shutil.copy(f"{stand_in}/{found}", target)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
    env["CONTAINER_DRIVER_ROOT"] = str(root)
    done = subprocess.run(
        [sys.executable, "-m", "nvplugin", "serve", "--device-plugin-dir", str(root / "dp")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    # The stand-in has no NVML symbols: found and loaded, then "Function Not Found" (without the
    # driver root: "library libnvidia-ml.so.1 not found").
    assert (
        done.stderr.splitlines()[-1] == "error: NVML failed to initialise NVML: Function Not Found"
    )
