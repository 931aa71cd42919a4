"""``FakeKubelet``: the kubelet side of the device-plugin API, in-process, on real unix sockets.

It behaves as the real kubelet does towards a device plugin (docs/kubelet-behaviour.md): it owns
the device-plugin directory (created mode 0750), deletes every socket file in it when it starts
(other files stay), serves ``v1beta1.Registration`` on ``<dir>/kubelet.sock``, dials each
registering plugin back, consumes its ListAndWatch stream and calls it for allocations.

Use (on an asyncio loop; tests wrap a coroutine in ``asyncio.run``)::

    async with FakeKubelet(directory) as kubelet:            # start() ... stop()
        ep = await kubelet.wait_registered("nvidia.com/gpu", timeout=5)   # -> Endpoint
        dm = kubelet.devices                                  # the DeviceManager: all state
        seen = kubelet.observer                               # what it saw, and waiting
        await seen.wait_for(lambda m: len(m.healthy_devices("nvidia.com/gpu")) == 8, 5, "8 GPUs")
        dm.options("nvidia.com/gpu")                          # PluginOptions of the primary
        dm.healthy_devices(r), dm.unhealthy_devices(r)        # frozenset[str] of device IDs
        dm.device_numa(r)                                     # {device ID: (NUMA node, ...)}
        seen.snapshots(r)                                     # every ListAndWatch message
        seen.registrations                                    # every Register request + answer
        await dm.get_preferred_allocation(r, available, must_include, size)  # list[str] | None
        await dm.allocate(r, ids)                             # ContainerAllocateResponse
        await kubelet.restart()      # stop, delete every socket in the dir, serve again

``restart()`` is what the real kubelet does when it restarts: all plugin connections drop,
sockets (the plugin's included) are deleted, ``kubelet.sock`` is created again, and every
resource has no devices until its plugin registers again.
"""

from __future__ import annotations

import contextlib
import os
import stat
from types import TracebackType

import structlog

from nvplugin.api import DEFAULT_DEVICE_PLUGIN_DIR, KUBELET_SOCKET
from nvplugin.fakekubelet.devicemanager.endpoint import DIAL_TIMEOUT_S, Endpoint
from nvplugin.fakekubelet.devicemanager.manager import DeviceManager
from nvplugin.fakekubelet.observer import Observer
from nvplugin.fakekubelet.registration import RegistrationServer

_log = structlog.get_logger("nvplugin.fakekubelet")


def remove_sockets(directory: str) -> list[str]:
    """Delete every socket file in ``directory`` (not directories, not other files).

    As the kubelet does on start; a symlink to a socket counts (the kubelet stats through it).
    Returns the removed names, sorted.
    """
    removed = []
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                mode = os.stat(entry.path).st_mode
            except OSError:
                continue  # dangling link, or gone meanwhile
            if stat.S_ISSOCK(mode):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                removed.append(entry.name)
    return sorted(removed)


class FakeKubelet:
    """The kubelet's device-plugin side for one device-plugin directory (see module doc)."""

    def __init__(
        self,
        directory: str = DEFAULT_DEVICE_PLUGIN_DIR,
        *,
        socket_name: str = KUBELET_SOCKET,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        devices: DeviceManager | None = None,
    ) -> None:
        self.directory = directory
        # Like the kubelet, keep the checkpoint (kubelet_internal_checkpoint) in the
        # device-plugin directory, so a restarted fake kubelet reads its allocations back.
        self.devices = devices if devices is not None else DeviceManager(checkpoint_dir=directory)
        self.observer = Observer(self.devices)
        self._registration = RegistrationServer(
            directory,
            self.devices,
            socket_name=socket_name,
            dial_timeout_s=dial_timeout_s,
            on_register=self.observer.registered,
        )
        self.socket_path = self._registration.socket_path
        self._running = False

    @property
    def running(self) -> bool:
        return self._running

    async def start(self) -> None:
        """Create the directory (0750) if needed, delete its sockets, serve Registration."""
        if self._running:
            return
        if not os.path.isdir(self.directory):
            os.makedirs(self.directory, mode=0o750, exist_ok=True)
            os.chmod(self.directory, 0o750)
        removed = remove_sockets(self.directory)
        self.devices.start()
        await self._registration.start()
        self._running = True
        _log.info("fake kubelet started", directory=self.directory, removed_sockets=removed)

    async def stop(self) -> None:
        """Stop serving and drop every plugin connection (as the kubelet process exiting)."""
        if not self._running:
            return
        self._running = False
        await self._registration.stop()
        await self.devices.stop()
        _log.info("fake kubelet stopped", directory=self.directory)

    async def restart(self) -> None:
        """Stop, then start again: sockets deleted, ``kubelet.sock`` re-created."""
        await self.stop()
        await self.start()

    async def wait_registered(self, resource: str, timeout: float) -> Endpoint:
        """Wait until ``resource`` has a registered plugin with a live stream; its primary."""
        return await self.observer.wait_registered(resource, timeout)

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
