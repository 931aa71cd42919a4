"""What a driver root holds for containers, as this process sees it: device nodes (with type,
major and minor), the driver's libraries and their sonames, programs, firmware, IPC sockets and
the ``nvidia-cdi-hook``. Read once per spec, bounded: regular files only where a file is meant,
never a link followed out of its directory, a bounded read of ``/proc/devices``.

A device node that is a character device gives its major and minor from its inode. The simulated
driver root presents device nodes as regular files (:mod:`nvplugin.sim.driverroot`): their major
then comes from ``proc/devices`` and their minor from what the node model knows (NVML's GPU minor,
the driver's ``mig-minors``, the control nodes' fixed minors) -- the same facts a real node has.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from nvplugin.node import driverfiles as facts

MAX_PROC_DEVICES_BYTES = 64 * 1024
MAX_FIRMWARE_FILES = 64


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node present under the dev root: ``name`` relative to ``/dev``."""

    name: str
    major: int
    minor: int
    kind: str = "c"


@dataclass(frozen=True, slots=True)
class Library:
    """A driver library: ``path`` the versioned file, ``soname`` its soname link (both relative
    to the driver root, in the same directory)."""

    path: str
    soname: str


@dataclass(frozen=True)
class HostFiles:
    """What was found (see the module docstring); ``hook``: the hook's host path when present."""

    nodes: dict[str, DeviceNode]
    libraries: tuple[Library, ...]
    binaries: tuple[str, ...]
    firmware: tuple[str, ...]
    sockets: tuple[str, ...]
    hook: str | None
    driver_view: str
    dev_view: str

    def where(self, name: str) -> str:
        """Where device node ``name`` was looked for, as this process sees it."""
        return os.path.join(self.dev_view, "dev", name)


def read_majors(view_root: str) -> dict[str, int]:
    """The character devices' majors by name: ``proc/devices`` under the driver root as seen
    (a simulated node's), else the kernel's ``/proc/devices``."""
    for root in dict.fromkeys((view_root, "/")):
        path = os.path.join(root, facts.PROC_DEVICES)
        try:
            with open(path, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode) and root != "/":
                    continue
                text = handle.read(MAX_PROC_DEVICES_BYTES).decode(errors="replace")
        except OSError:
            continue
        return facts.parse_proc_devices(text)
    return {}


def _major(majors: dict[str, int], driver: str) -> int | None:
    names = facts.FRONTEND_NAMES if driver == facts.FRONTEND else (driver,)
    for name in names:
        if name in majors:
            return majors[name]
    return facts.NVIDIA_MAJOR if driver == facts.FRONTEND else None


def find_nodes(
    dev_view: str, wanted: Iterable[tuple[str, str, int]], majors: dict[str, int]
) -> dict[str, DeviceNode]:
    """The device nodes of ``wanted`` (name under ``/dev``, ``/proc/devices`` name of its major,
    its minor) that exist under ``dev_view``/dev."""
    found: dict[str, DeviceNode] = {}
    for name, driver, minor in wanted:
        try:
            info = os.lstat(os.path.join(dev_view, "dev", name))
        except OSError:
            continue
        if stat.S_ISCHR(info.st_mode):
            found[name] = DeviceNode(name, os.major(info.st_rdev), os.minor(info.st_rdev))
        elif stat.S_ISREG(info.st_mode):  # a simulated node's stand-in: the facts say the rest
            major = _major(majors, driver)
            if major is not None:
                found[name] = DeviceNode(name, major, minor)
    return found


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def find_libraries(view_root: str, version: str) -> tuple[Library, ...]:
    """The driver's libraries of ``version`` (the first library directory holding each)."""
    found = []
    for name in facts.LIBRARIES:
        real = f"{name}.{version}"
        for directory in facts.LIBRARY_DIRS:
            if _regular(os.path.join(view_root, directory, real)):
                soname = f"{name}.{facts.SONAME_VERSION}"
                found.append(Library(f"{directory}/{real}", f"{directory}/{soname}"))
                break
    return tuple(found)


def find_binaries(view_root: str) -> tuple[str, ...]:
    found = []
    for name in facts.BINARIES:
        for directory in facts.BINARY_DIRS:
            if _regular(os.path.join(view_root, directory, name)):
                found.append(f"{directory}/{name}")
                break
    return tuple(found)


def find_firmware(view_root: str, version: str) -> tuple[str, ...]:
    folder = f"{facts.FIRMWARE_DIR}/{version}"
    try:
        names = sorted(os.listdir(os.path.join(view_root, folder)))
    except OSError:
        return ()
    files = [n for n in names if n.endswith(".bin") and _regular(f"{view_root}/{folder}/{n}")]
    return tuple(f"{folder}/{name}" for name in files[:MAX_FIRMWARE_FILES])


def find_sockets(view_root: str) -> tuple[str, ...]:
    return tuple(p for p in facts.IPC_SOCKETS if os.path.lexists(os.path.join(view_root, p)))


def find_hook(view_root: str, hook_path: str) -> str | None:
    """``hook_path`` (a host path) when the program is there under the driver root as seen."""
    local = os.path.join(view_root, hook_path.lstrip("/"))
    return hook_path if os.path.isfile(local) and os.access(local, os.X_OK) else None


def dev_view_of(view_root: str) -> str:
    """Where this process sees the host's ``/dev``: under the driver root as mounted when the
    driver's control node is there (a host-installed driver, the simulation), else ``/``."""
    if os.path.lexists(os.path.join(view_root, "dev", facts.REQUIRED_CONTROL_NODES[0])):
        return view_root
    return "/"


def read_host_files(
    view_root: str, version: str, wanted: Iterable[tuple[str, str, int]], hook_path: str
) -> HostFiles:
    """Everything above, for the driver root this process sees at ``view_root``."""
    dev_view = dev_view_of(view_root)
    return HostFiles(
        nodes=find_nodes(dev_view, wanted, read_majors(view_root)),
        libraries=find_libraries(view_root, version),
        binaries=find_binaries(view_root),
        firmware=find_firmware(view_root, version),
        sockets=find_sockets(view_root),
        hook=find_hook(view_root, hook_path),
        driver_view=view_root,
        dev_view=dev_view,
    )
