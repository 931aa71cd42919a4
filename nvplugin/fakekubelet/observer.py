"""What the fake kubelet saw, for whoever watches it: every Register request and how it was
answered, every ListAndWatch message, and a way to wait until the kubelet's state satisfies a
condition.

The kubelet itself keeps none of this (its device manager holds the current state only); tests,
``nvplugin kubelet`` and ``nvplugin admit`` need it. So the :class:`Observer` stands beside the
device manager as a :class:`~nvplugin.fakekubelet.devicemanager.manager.Listener` and beside the
Registration service (which reports each request to :meth:`Observer.registered`); it is kept
across kubelet restarts, as the watcher's view. Everything runs on the kubelet's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from nvplugin.fakekubelet.devicemanager.endpoint import DeviceInfo, Endpoint
from nvplugin.fakekubelet.devicemanager.manager import DeviceManager
from nvplugin.fakekubelet.registration import RegistrationRecord


@dataclass(frozen=True)
class Snapshot:
    """One ListAndWatch message, as received (device order kept)."""

    resource: str
    socket_path: str
    devices: tuple[DeviceInfo, ...]
    received_at: float  # time.monotonic()

    @property
    def healthy(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices if d.healthy)

    @property
    def unhealthy(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices if not d.healthy)


class Observer:
    """Records what ``devices`` (and the Registration service) went through; see module doc."""

    def __init__(self, devices: DeviceManager) -> None:
        self.devices = devices
        self._registrations: list[RegistrationRecord] = []
        self._snapshots: dict[str, list[Snapshot]] = {}
        self._changed = asyncio.Event()
        devices.add_listener(self)

    # --- told ----------------------------------------------------------------------------------

    def registered(self, record: RegistrationRecord) -> None:
        """A Register request was answered."""
        self._registrations.append(record)
        self.changed()

    def devices_received(
        self, resource: str, socket_path: str, devices: tuple[DeviceInfo, ...]
    ) -> None:
        self._snapshots.setdefault(resource, []).append(
            Snapshot(resource, socket_path, devices, time.monotonic())
        )

    def changed(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --- what was seen -------------------------------------------------------------------------

    @property
    def registrations(self) -> tuple[RegistrationRecord, ...]:
        """Every Register request received, in order."""
        return tuple(self._registrations)

    def snapshots(self, resource: str) -> tuple[Snapshot, ...]:
        """Every ListAndWatch message received for ``resource``, in order (across restarts)."""
        return tuple(self._snapshots.get(resource, ()))

    def describe(self) -> str:
        """One line of state, for timeout messages."""
        devices = self.devices
        parts = []
        for r in devices.resources():
            parts.append(
                f"{r}: endpoints={[e.socket_path for e in devices.endpoints(r)]} "
                f"healthy={sorted(devices.healthy_devices(r))} "
                f"unhealthy={sorted(devices.unhealthy_devices(r))} "
                f"snapshots={len(self.snapshots(r))}"
            )
        errors = [r.error for r in self._registrations if r.error]
        if errors:
            parts.append(f"register errors={errors}")
        return "; ".join(parts) or "no resources, no registrations"

    # --- waiting -------------------------------------------------------------------------------

    async def wait_for(
        self,
        predicate: Callable[[DeviceManager], bool],
        timeout: float,
        what: str = "condition",
    ) -> None:
        """Wait until ``predicate(devices)`` holds (re-checked on every change: a registration,
        a ListAndWatch message, a disconnect, an allocation).

        Raises :class:`TimeoutError` naming ``what`` and the current state.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(self.devices):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(
                    f"timed out after {timeout:g}s waiting for {what}; state: {self.describe()}"
                )
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    async def wait_registered(self, resource: str, timeout: float) -> Endpoint:
        """Wait until a plugin for ``resource`` is registered with a live stream; the primary."""
        await self.wait_for(
            lambda m: m.is_registered(resource), timeout, f"a registration of {resource}"
        )
        primary = self.devices.primary(resource)
        assert primary is not None
        return primary
