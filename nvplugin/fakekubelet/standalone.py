"""``nvplugin kubelet``: the fake kubelet on its own, for a ``nvplugin serve`` you started.

``nvplugin serve`` waits for a kubelet: it registers on ``<dir>/kubelet.sock``. On a machine
without one, this runs the fake kubelet (:class:`~nvplugin.fakekubelet.kubelet.FakeKubelet`) on the
directory until SIGINT or SIGTERM and prints, one line each, what a kubelet sees: every
registration, and every change of a resource's devices (count, health, NUMA nodes). Start it
before or after the plugin: like the real kubelet it deletes the sockets in the directory when it
starts, and the plugin notices and registers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import stat
from collections.abc import Callable
from typing import TextIO

from nvplugin.api import KUBELET_SOCKET
from nvplugin.errors import NvpluginError
from nvplugin.fakekubelet.devicemanager.manager import DeviceManager
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.fakekubelet.observer import Observer

WAKE_S = 3600.0
"""How long one wait for a change lasts before it is simply started again."""


def describe_resource(devices: DeviceManager, resource: str) -> str:
    """One line of a resource's state: registered or not, devices, health, NUMA nodes."""
    known = devices.devices(resource)
    if not devices.is_registered(resource):
        return f"{resource}: no plugin registered ({len(known)} devices known, none allocatable)"
    healthy = len(devices.healthy_devices(resource))
    per_numa: dict[str, int] = {}
    for info in known.values():
        key = ",".join(map(str, info.numa_nodes)) or "none"
        per_numa[key] = per_numa.get(key, 0) + 1
    numa = ", ".join(f"NUMA {k}: {v}" for k, v in sorted(per_numa.items()))
    return f"{resource}: {len(known)} devices, {healthy} healthy ({numa})"


def check_no_kubelet(directory: str) -> None:
    """Refuse a directory where a kubelet answers on ``kubelet.sock``: starting would delete
    the sockets of that kubelet's plugins, as a kubelet restart does."""
    path = os.path.join(directory, KUBELET_SOCKET)
    if not stat.S_ISSOCK(_mode(path)):
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return  # a stale socket: the kubelet that made it is gone
    raise NvpluginError(
        f"a kubelet already serves {path}; give nvplugin kubelet the --device-plugin-dir of "
        "your nvplugin serve instead (a second kubelet would delete its plugins' sockets)"
    )


def _mode(path: str) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


async def watch(
    directory: str, say: Callable[[str], None], stop: asyncio.Event | None = None
) -> None:
    """Run the fake kubelet on ``directory`` until ``stop`` is set (or SIGINT/SIGTERM)."""
    check_no_kubelet(directory)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)
    async with FakeKubelet(directory) as kubelet:
        devices, seen = kubelet.devices, kubelet.observer
        say(
            f"fake kubelet serving {kubelet.socket_path}; waiting for device plugins "
            "(Ctrl-C to stop)"
        )
        registrations = 0
        lines: dict[str, str] = {}
        while not stop.is_set():
            for record in seen.registrations[registrations:]:
                outcome = f"refused: {record.error}" if record.error else "accepted"
                say(f"register {record.resource_name} from {record.endpoint}: {outcome}")
            registrations = len(seen.registrations)
            for resource in devices.resources():
                if devices.is_registered(resource) and not seen.snapshots(resource):
                    continue  # registered: its device list follows at once
                line = describe_resource(devices, resource)
                if lines.get(resource) != line:
                    lines[resource] = line
                    say(line)
            await _changed_or_stopped(seen, stop, registrations, lines)
    say("fake kubelet stopped")


async def _changed_or_stopped(
    seen: Observer, stop: asyncio.Event, registrations: int, lines: dict[str, str]
) -> None:
    def changed(manager: DeviceManager) -> bool:
        return (
            stop.is_set()
            or len(seen.registrations) != registrations
            or any(lines.get(r) != describe_resource(manager, r) for r in manager.resources())
        )

    stopped = asyncio.ensure_future(stop.wait())
    waiting = asyncio.ensure_future(seen.wait_for(changed, WAKE_S, "a change"))
    try:
        await asyncio.wait({stopped, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (stopped, waiting):
            task.cancel()
        await asyncio.gather(stopped, waiting, return_exceptions=True)


def run(directory: str, out: TextIO) -> None:
    """:func:`watch` with lines printed (and flushed) to ``out``."""

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    try:
        asyncio.run(watch(directory, say))
    except OSError as exc:
        raise NvpluginError(
            f"cannot serve the kubelet in {directory}: {exc.strerror or exc}"
        ) from None
