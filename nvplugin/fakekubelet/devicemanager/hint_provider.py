"""The device manager as the topology manager's ``HintProvider`` (hints, then allocate), and the
bridge between their threads.

The topology manager's seam is synchronous, as the kubelet's is, while the device manager lives
on one asyncio loop (the one that serves Registration and reads every ListAndWatch stream, so
its state needs no locks). The topology manager therefore runs in a worker thread
(``await asyncio.to_thread(manager.admit, pod)``), and each call of :class:`DeviceHintProvider`
hops onto the device manager's loop and waits there: :func:`call_sync` for a coroutine (an
allocation, which calls the plugin), :func:`call_on_loop` for a synchronous read of the state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from nvplugin.fakekubelet.devicemanager.endpoint import DevicePluginError
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.fakekubelet.topologymanager.policy import ProviderHints
from nvplugin.fakekubelet.topologymanager.scope import AllocationError

T = TypeVar("T")


class HintSource(Protocol):
    """What the provider needs of the device manager."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...

    def container_hints(self, pod: Pod, container: Container) -> ProviderHints: ...

    def pod_hints(self, pod: Pod) -> ProviderHints: ...

    async def allocate_container(self, pod: Pod, container: Container) -> None: ...


class DeviceHintProvider:
    """The device manager as the topology manager sees it.

    A thin adapter, separate only because the name ``allocate`` is taken on the manager by the
    raw Allocate call: each call runs on the device manager's loop; plugin failures
    (:class:`DevicePluginError`) become :class:`AllocationError` (the pod is rejected with
    ``UnexpectedAdmissionError``).
    """

    def __init__(self, manager: HintSource) -> None:
        self.manager = manager

    def get_topology_hints(self, pod: Pod, container: Container) -> ProviderHints:
        return call_on_loop(self.manager.loop, lambda: self.manager.container_hints(pod, container))

    def get_pod_topology_hints(self, pod: Pod) -> ProviderHints:
        return call_on_loop(self.manager.loop, lambda: self.manager.pod_hints(pod))

    def allocate(self, pod: Pod, container: Container) -> None:
        try:
            call_sync(self.manager.loop, self.manager.allocate_container(pod, container))
        except DevicePluginError as exc:
            raise AllocationError(str(exc)) from None


def call_sync(loop: asyncio.AbstractEventLoop | None, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop`` from a synchronous caller and wait for its result.

    From a worker thread it is handed to the loop; with no loop running it runs on a fresh one.
    On the loop's own thread it cannot wait without deadlocking, which is a programming error.
    """
    if _usable(loop):
        assert loop is not None
        if _running_loop() is loop:
            coro.close()
            raise RuntimeError(
                "the topology manager must not run on the device manager's event loop: "
                "call it in a worker thread (await asyncio.to_thread(manager.admit, pod))"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()
    return asyncio.run(coro)


def call_on_loop(loop: asyncio.AbstractEventLoop | None, fn: Callable[[], T]) -> T:
    """Run a synchronous read of the state on ``loop``'s thread (where it is mutated); directly
    when already there, or when no loop runs."""
    if not _usable(loop) or _running_loop() is loop:
        return fn()
    assert loop is not None

    async def call() -> T:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), loop).result()


def _usable(loop: asyncio.AbstractEventLoop | None) -> bool:
    return loop is not None and loop.is_running() and not loop.is_closed()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
