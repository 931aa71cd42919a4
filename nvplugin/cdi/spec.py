"""The CDI spec of what a node serves: a pure function of the devices Allocate can name and the
driver's files (:mod:`.hostfiles`).

One device per name Allocate can return (a GPU or MIG device by its UUID or index, as
``deviceIDStrategy`` says; replicas and MPS shares are handed out as the device they share, so
they need no name of their own), plus ``all``. A device's edits are its device nodes
(``/dev/nvidia<minor>``; a MIG device's also its GPU and compute instances' capability nodes),
each with type, major, minor and permissions written out. What every container needs is the
spec's common edits: the control nodes, the driver's libraries, programs, firmware and IPC
sockets (host paths under ``nvidiaDriverRoot``, container paths as under the driver root), the
``nvidia-cdi-hook`` hooks when the hook is there, and ``NVIDIA_VISIBLE_DEVICES=void`` so that a
legacy NVIDIA runtime hook does not inject the devices a second time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nvplugin.api.nvidia import NO_DEVICES, VISIBLE_DEVICES_ENV
from nvplugin.cdi.hostfiles import HostFiles
from nvplugin.cdi.validate import minimum_version
from nvplugin.node import driverfiles as facts

ALL = "all"
"""The device that names every device of the spec."""
PERMISSIONS = "rw"
"""The cgroup permissions of each device node (as in the plugin's DeviceSpecs)."""
READ_ONLY = ("ro", "nosuid", "nodev", "bind")
SOCKET_OPTIONS = (*READ_ONLY, "noexec")
HOOK_EVENT = "createContainer"
"""When the nvidia-cdi-hook runs: in the container's namespaces, before pivot_root."""


@dataclass(frozen=True, slots=True)
class SpecDevice:
    """One named device: ``nodes`` its device nodes, by name under ``/dev``."""

    name: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Roots:
    """The host's roots the spec's host paths are written under: ``driver`` (NVIDIA's
    ``nvidiaDriverRoot``) and ``dev`` (``nvidiaDevRoot``, else the driver root)."""

    driver: str = "/"
    dev: str = "/"


def missing(devices: Sequence[SpecDevice], files: HostFiles) -> list[str]:
    """What the spec cannot be whole without, each with where it was looked for: a device's
    nodes, the required control nodes, the driver's CUDA and NVML libraries."""
    lacking: list[str] = []
    wanted = [node for device in devices for node in device.nodes]
    wanted += list(facts.REQUIRED_CONTROL_NODES)
    for node in dict.fromkeys(wanted):
        if node not in files.nodes:
            lacking.append(f"device node {files.where(node)}")
    have = {os.path.basename(lib.path).rsplit(".so.", 1)[0] + ".so" for lib in files.libraries}
    for name in facts.REQUIRED_LIBRARIES:
        if name not in have:
            dirs = ", ".join(facts.LIBRARY_DIRS[:3])
            lacking.append(
                f"library {name}.<driver version> under {files.driver_view} ({dirs}, ...)"
            )
    return lacking


def _node(files: HostFiles, name: str, roots: Roots) -> dict[str, Any]:
    node = files.nodes[name]
    return {
        "path": f"/dev/{name}",
        "hostPath": os.path.join(roots.dev, "dev", name),
        "type": node.kind,
        "major": node.major,
        "minor": node.minor,
        "permissions": PERMISSIONS,
    }


def _mount(rel: str, roots: Roots, options: Sequence[str] = READ_ONLY) -> dict[str, Any]:
    return {
        "hostPath": os.path.join(roots.driver, rel),
        "containerPath": f"/{rel}",
        "options": list(options),
    }


def _hook_args(hook: str, *args: str) -> list[str]:
    """``nvidia-cdi-hook <hook> ...``, or ``nvidia-ctk hook <hook> ...`` for nvidia-ctk."""
    program = os.path.basename(hook)
    return [program, "hook", *args] if program == "nvidia-ctk" else [program, *args]


def common_edits(files: HostFiles, roots: Roots) -> dict[str, Any]:
    """What every container of the spec gets (see the module docstring)."""
    nodes = [_node(files, n, roots) for n in facts.CONTROL_NODES if n in files.nodes]
    mounts = [_mount(lib.path, roots) for lib in files.libraries]
    if files.hook is None:  # no hook to link the sonames: mount them too (the runtime resolves)
        mounts += [_mount(lib.soname, roots) for lib in files.libraries]
    mounts += [_mount(path, roots) for path in (*files.binaries, *files.firmware)]
    mounts += [_mount(path, roots, SOCKET_OPTIONS) for path in files.sockets]
    edits: dict[str, Any] = {"env": [f"{VISIBLE_DEVICES_ENV}={NO_DEVICES}"]}
    if nodes:
        edits["deviceNodes"] = nodes
    if mounts:
        edits["mounts"] = mounts
    if files.hook is not None and files.libraries:
        links = []
        for lib in files.libraries:
            links += ["--link", f"{os.path.basename(lib.path)}::/{lib.soname}"]
        folders = list(dict.fromkeys(f"/{os.path.dirname(lib.path)}" for lib in files.libraries))
        folder_args = [arg for folder in folders for arg in ("--folder", folder)]
        edits["hooks"] = [
            {
                "hookName": HOOK_EVENT,
                "path": files.hook,
                "args": _hook_args(files.hook, "create-symlinks", *links),
            },
            {
                "hookName": HOOK_EVENT,
                "path": files.hook,
                "args": _hook_args(files.hook, "update-ldcache", *folder_args),
            },
        ]
    return edits


def build_spec(
    kind: str, devices: Sequence[SpecDevice], files: HostFiles, roots: Roots
) -> dict[str, Any]:
    """The spec (a JSON-ready mapping) of ``devices`` and ``all``; a device node not in
    ``files`` is left out (:func:`missing` says so first). ``cdiVersion``: the least the fields
    used need."""
    entries = []
    every: list[str] = []
    for device in devices:
        nodes = [_node(files, n, roots) for n in device.nodes if n in files.nodes]
        every += [n for n in device.nodes if n in files.nodes]
        entries.append({"name": device.name, "containerEdits": {"deviceNodes": nodes}})
    if devices:
        nodes = [_node(files, n, roots) for n in dict.fromkeys(every)]
        entries.append({"name": ALL, "containerEdits": {"deviceNodes": nodes}})
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": kind,
        "devices": entries,
        "containerEdits": common_edits(files, roots),
    }
    spec["cdiVersion"] = minimum_version(spec)
    return spec
