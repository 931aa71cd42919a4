"""The driver's files in a simulated driver root: what a real one has for containers, so that the
CDI spec (:mod:`nvplugin.cdi`) is generated and checked without a GPU.

Device nodes cannot be made without root (``mknod``), so the simulation presents each one as an
empty regular file at its path under ``dev/``; what a real node's inode says (character device,
major, minor) comes instead from facts the simulated node carries, exactly where a real node
keeps them: the majors in ``proc/devices`` (``nvidia-frontend`` 195, and the dynamic majors of
``nvidia-uvm`` and ``nvidia-caps``), the minors from NVML (a GPU's minor), the driver's
``mig-minors`` file (MIG's capability nodes) and the driver's fixed control minors. Libraries
are versioned stand-in files with their soname links, as the driver installs them; firmware,
the driver's programs and the persistenced socket are stand-in files; the ``nvidia-cdi-hook``
and ``nvidia-ctk`` programs are optional (``hook=False`` leaves them out).
"""

from __future__ import annotations

import os
from pathlib import Path

from nvplugin.node import driverfiles as facts
from nvplugin.node.mig import caps_minor
from nvplugin.nodefile.spec import NodeSpec

UVM_MAJOR = 508
"""``nvidia-uvm``'s major on the simulated node (the kernel gives it one at module load)."""
CAPS_MAJOR = 511
"""``nvidia-caps``'s major on the simulated node (likewise dynamic)."""
LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
BINARY_DIR = "usr/bin"
HOOK_PROGRAMS = ("nvidia-cdi-hook", "nvidia-ctk")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
_STAND_IN = "#!/bin/sh\n# nvplugin's simulated driver root: a stand-in for {name}\nexit 0\n"


def proc_devices_text(uvm_major: int = UVM_MAJOR, caps_major: int = CAPS_MAJOR) -> str:
    """``/proc/devices`` as a kernel with the NVIDIA modules loaded writes it."""
    return (
        "Character devices:\n  1 mem\n  4 tty\n 10 misc\n"
        f"{facts.NVIDIA_MAJOR} {facts.FRONTEND}\n{uvm_major} {facts.UVM}\n"
        f"{caps_major} {facts.CAPS}\n\nBlock devices:\n  8 sd\n"
    )


def device_nodes(spec: NodeSpec) -> list[str]:
    """The device nodes the simulated node has, relative to its root (``dev/...``)."""
    nodes = [f"dev/nvidia{gpu.index}" for gpu in spec.gpus]  # a simulated GPU's minor = index
    nodes += [f"dev/{name}" for name in facts.CONTROL_NODES]
    if any(gpu.mig is not None for gpu in spec.gpus):
        minors = {1, 2}  # config and monitor
        for gpu in spec.gpus:
            for inst in gpu.mig or ():
                minors.add(caps_minor(gpu.index, inst.gpu_instance))
                minors.add(caps_minor(gpu.index, inst.gpu_instance, inst.compute_instance))
        nodes += [f"dev/{facts.CAPS_DIR}/nvidia-cap{minor}" for minor in sorted(minors)]
    return nodes


def _write(path: Path, text: str = "", mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():  # a program written before (the MPS stand-in) is kept
        path.write_text(text)
        os.chmod(path, mode)


def write_driver_root(spec: NodeSpec, root: Path, *, hook: bool = True) -> None:
    """Write the driver's files of ``spec``'s node under ``root`` (see the module docstring)."""
    version = spec.driver.version
    _write(root / facts.PROC_DEVICES, proc_devices_text())
    for node in device_nodes(spec):
        _write(root / node, mode=0o666)
    libdir = root / LIBRARY_DIR
    for name in facts.LIBRARIES:
        real = f"{name}.{version}"
        _write(libdir / real, f"simulated {real}\n")
        soname = libdir / f"{name}.{facts.SONAME_VERSION}"
        if not soname.is_symlink() and not soname.exists():
            soname.symlink_to(real)
    cuda_dev = libdir / "libcuda.so"
    if not cuda_dev.is_symlink() and not cuda_dev.exists():
        cuda_dev.symlink_to(f"libcuda.so.{facts.SONAME_VERSION}")
    for name in facts.BINARIES:
        _write(root / BINARY_DIR / name, _STAND_IN.format(name=name), 0o755)
    for name in FIRMWARE:
        _write(root / facts.FIRMWARE_DIR / version / name, f"simulated {name}\n")
    _write(root / facts.IPC_SOCKETS[0])
    if hook:
        for name in HOOK_PROGRAMS:
            _write(root / BINARY_DIR / name, _STAND_IN.format(name=name), 0o755)
