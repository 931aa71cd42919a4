"""What the NVIDIA driver puts on a node besides NVML, as facts: its device nodes (names, the
``/proc/devices`` names of their majors, fixed minors), the libraries, programs, firmware and
IPC sockets a CUDA container needs. Both the simulated driver root (:mod:`nvplugin.sim.driverroot`)
and the CDI spec (:mod:`nvplugin.cdi.hostfiles`) read them from here, so the two cannot drift;
the NVML module looks for ``libnvidia-ml.so.1`` in the same library directories.

Paths are relative to a driver root (``/`` on a host-installed driver, ``/run/nvidia/driver``
with the GPU Operator's driver container).
"""

from __future__ import annotations

NVIDIA_MAJOR = 195
"""The major of ``/dev/nvidia<N>``, ``nvidiactl`` and ``nvidia-modeset``: fixed by the driver."""
PROC_DEVICES = "proc/devices"
"""The kernel's list of majors by driver name (relative to ``/``): the dynamic majors of
``nvidia-uvm`` and ``nvidia-caps`` are read there."""
FRONTEND = "nvidia-frontend"
"""The name major 195 has in ``/proc/devices`` (older drivers: ``nvidia``)."""
FRONTEND_NAMES = (FRONTEND, "nvidia")
UVM = "nvidia-uvm"
CAPS = "nvidia-caps"

CONTROL_NODES: dict[str, tuple[str, int]] = {
    "nvidiactl": (FRONTEND, 255),
    "nvidia-uvm": (UVM, 0),
    "nvidia-uvm-tools": (UVM, 1),
    "nvidia-modeset": (FRONTEND, 254),
}
"""The control device nodes under ``/dev`` every CUDA container needs where they exist: the
``/proc/devices`` name of their major and their minor."""
REQUIRED_CONTROL_NODES = ("nvidiactl",)
"""Without these no container can use a GPU (``nvidia-uvm`` appears when its module loads)."""
CAPS_DIR = "nvidia-caps"
"""``/dev/nvidia-caps``: MIG's capability nodes ``nvidia-cap<minor>`` (major ``nvidia-caps``)."""

LIBRARIES = (
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libcudadebugger.so",
    "libnvidia-opencl.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-opticalflow.so",
    "libnvcuvid.so",
    "libnvidia-encode.so",
)
"""The driver's compute and utility libraries, by the name before their version: each is
installed as ``<name>.<driver version>`` with its soname ``<name>.1`` linked to it."""
REQUIRED_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")
"""A container cannot run CUDA or NVML without these: a spec without them is not whole."""
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    "lib",
)
"""Where driver installs put their libraries (distribution packages, the .run installer, the GPU
Operator's driver container), searched in this order; the first holding a library wins."""
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
BINARY_DIRS = ("usr/bin", "usr/local/bin", "bin")
FIRMWARE_DIR = "lib/firmware/nvidia"
"""The GSP firmware: ``<dir>/<driver version>/*.bin``."""
IPC_SOCKETS = (
    "run/nvidia-persistenced/socket",
    "run/nvidia-fabricmanager/socket",
    "tmp/nvidia-mps",
)
"""The driver daemons' sockets a container talks to where they run (the last, MPS's default
pipe directory)."""
SONAME_VERSION = "1"
"""The driver's libraries' soname suffix: ``<name>.1``."""


def parse_proc_devices(text: str) -> dict[str, int]:
    """The character devices' majors by name, from ``/proc/devices``'s text (its block devices
    are left out: a name may be in both lists)."""
    majors: dict[str, int] = {}
    for line in text.splitlines():
        if line.strip().lower().startswith("block devices"):
            break
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and len(parts[0]) <= 9:
            majors.setdefault(parts[1], int(parts[0]))
    return majors
