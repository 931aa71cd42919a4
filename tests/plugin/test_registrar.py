"""Registration with the fake kubelet, in-process: fields, restarts, the polling fallback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
from structlog.testing import capture_logs

from nvplugin.allocator import make_policy
from nvplugin.api.v1beta1 import api_pb2
from nvplugin.backoff import Backoff
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.nodesession import load_topology
from nvplugin.plugin.registrar import DirWatcher, Registrar, RegistrationError, register
from nvplugin.plugin.server import DevicePluginService, PluginSocket
from tests.support.service import gpus_manager
from tests.support.waiting import WAIT_S, until

RESOURCE = "nvidia.com/gpu"
T = TypeVar("T")


async def start_plugin(
    directory: str, *, inotify: bool = True
) -> tuple[Registrar, PluginSocket, DirWatcher, list[asyncio.Task[None]]]:
    topology = load_topology("workstation-4gpu")
    service = DevicePluginService(
        gpus_manager(RESOURCE, topology.gpus), make_policy("simple", topology)
    )
    sock = PluginSocket(os.path.join(directory, "nvplugin-gpu.sock"), service)
    await sock.start()
    watcher = DirWatcher(directory)
    registrar = Registrar(
        sock,
        service,
        os.path.join(directory, "kubelet.sock"),
        watcher,
        backoff=Backoff(0.05, 0.5),
    )
    tasks = [asyncio.create_task(registrar.run())]
    if inotify:
        tasks.append(asyncio.create_task(watcher.run()))
    return registrar, sock, watcher, tasks


async def stop_plugin(sock: PluginSocket, tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await sock.stop()


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "polling"])
def test_registers_and_follows_kubelet_restarts(inotify: bool) -> None:
    async def body() -> None:
        directory = tempfile.mkdtemp()
        registrar, sock, _, tasks = await start_plugin(directory, inotify=inotify)
        try:
            async with FakeKubelet(directory) as kubelet:
                await kubelet.wait_registered(RESOURCE, WAIT_S)
                record = kubelet.observer.registrations[-1]
                assert (record.version, record.endpoint, record.resource_name) == (
                    "v1beta1",
                    "nvplugin-gpu.sock",
                    RESOURCE,
                )
                assert record.error is None
                assert record.options is not None
                assert record.options.get_preferred_allocation_available
                for n in range(3):
                    await kubelet.restart()
                    await kubelet.wait_registered(RESOURCE, WAIT_S)
                    await until(lambda n=n: registrar.registrations == n + 2)
                    assert sock.intact()
                assert [r.error for r in kubelet.observer.registrations] == [None] * 4
        finally:
            await stop_plugin(sock, tasks)

    asyncio.run(asyncio.wait_for(body(), 60))


def test_waits_for_a_kubelet_started_later() -> None:
    async def body() -> None:
        directory = tempfile.mkdtemp()
        registrar, sock, _, tasks = await start_plugin(directory)
        try:
            await asyncio.sleep(1.0)  # retries with backoff meanwhile
            assert registrar.registrations == 0
            async with FakeKubelet(directory) as kubelet:
                await kubelet.wait_registered(RESOURCE, WAIT_S)
        finally:
            await stop_plugin(sock, tasks)

    asyncio.run(asyncio.wait_for(body(), 60))


def test_register_without_a_kubelet_says_why() -> None:
    directory = tempfile.mkdtemp()
    request = api_pb2.RegisterRequest(version="v1beta1", endpoint="x.sock", resource_name=RESOURCE)
    with pytest.raises(RegistrationError, match="does not exist"):
        asyncio.run(register(os.path.join(directory, "kubelet.sock"), request))


def test_kubelet_errors_are_reported() -> None:
    async def body() -> None:
        directory = tempfile.mkdtemp()
        async with FakeKubelet(directory) as kubelet:
            bad = api_pb2.RegisterRequest(version="v1alpha", endpoint="x", resource_name=RESOURCE)
            with pytest.raises(RegistrationError, match='requested API version "v1alpha"'):
                await register(kubelet.socket_path, bad)

    asyncio.run(asyncio.wait_for(body(), 30))


def test_backoff_is_capped() -> None:
    backoff = Backoff(0.1, 1.0)
    delays = [0.1]
    for _ in range(6):
        delays.append(backoff.after(delays[-1]))
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


# --- the kubelet restarting at the registrar's racy moment ------------------------------------


class _KubeletThread:
    """A fake kubelet on an event loop of its own, in its own thread: it can restart while the
    plugin's loop is held (at the registrar's racy moment) and dial the plugin back meanwhile."""

    def __init__(self, directory: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        # Made on its own loop: its gRPC objects belong there.
        self.kubelet: FakeKubelet = self.call(self._make(directory))

    @staticmethod
    async def _make(directory: str) -> FakeKubelet:
        kubelet = FakeKubelet(directory)  # the real kubelet's 10 s dial timeout
        await kubelet.start()
        return kubelet

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the kubelet's loop and wait for it (blocking this thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(WAIT_S)

    async def wait(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the kubelet's loop and await it from another loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def close(self) -> None:
        self.call(self.kubelet.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(WAIT_S)
        self.loop.close()


class _RestartAfterCheck(PluginSocket):
    """A plugin socket that, once armed, answers ``intact()`` truthfully and then -- before its
    caller's next step -- has the kubelet restart: the kubelet deletes the socket and serves a
    new ``kubelet.sock``. The caller's loop is held meanwhile, as a busy node holds it."""

    def __init__(self, path: str, service: DevicePluginService, restart: Callable[[], None]):
        super().__init__(path, service)
        self.armed = False
        self._restart = restart

    def intact(self) -> bool:
        intact = super().intact()
        if intact and self.armed:
            self.armed = False
            self._restart()
        return intact


def test_a_kubelet_restart_right_after_the_socket_check_costs_no_failed_registration() -> None:
    """The restarting kubelet deletes the plugin's socket right after the registrar found it
    intact. The registrar must not register that endpoint with the new kubelet (which would dial
    it for 10 s and fail, leaving the resource without devices): it reads ``kubelet.sock``
    before it checks its own socket, so it serves again first, then registers once."""

    async def body() -> None:
        directory = tempfile.mkdtemp()
        topology = load_topology("workstation-4gpu")
        service = DevicePluginService(
            gpus_manager(RESOURCE, topology.gpus), make_policy("simple", topology)
        )
        side = _KubeletThread(directory)
        sock = _RestartAfterCheck(
            os.path.join(directory, "nvplugin-gpu.sock"),
            service,
            lambda: side.call(side.kubelet.restart()),
        )
        await sock.start()
        watcher = DirWatcher(directory)
        registrar = Registrar(
            sock, service, os.path.join(directory, "kubelet.sock"), watcher, backoff=Backoff(0.05)
        )
        tasks = [asyncio.create_task(registrar.run()), asyncio.create_task(watcher.run())]
        try:
            with capture_logs() as logs:
                await side.wait(side.kubelet.wait_registered(RESOURCE, WAIT_S))
                sock.armed = True
                watcher.poke()  # the registrar's next round checks its socket: the kubelet restarts
                await until(lambda: not sock.armed, "the kubelet to restart")
                await until(lambda: registrar.registrations == 2, "the second registration")
                await side.wait(side.kubelet.wait_registered(RESOURCE, WAIT_S))
            records = side.kubelet.observer.registrations
            assert [r.error for r in records] == [None, None]
            assert sock.intact()
            recreated = "kubelet socket re-created (kubelet restart); registering again"
            assert [e["event"] for e in logs].count(recreated) == 1
        finally:
            await stop_plugin(sock, tasks)
            side.close()

    asyncio.run(asyncio.wait_for(body(), 60))


def test_kubelet_socket_gone_is_not_logged_as_re_created() -> None:
    """The kubelet stops (its socket goes, ours too), and starts again later: one line says it
    went, and "re-created" is never said of a socket that is not there."""

    async def body() -> None:
        directory = tempfile.mkdtemp()
        registrar, sock, _, tasks = await start_plugin(directory)
        try:
            with capture_logs() as logs:
                kubelet = FakeKubelet(directory)
                await kubelet.start()
                await kubelet.wait_registered(RESOURCE, WAIT_S)
                # The kubelet has the registration; the registrar has it once its Register call
                # returns. A kubelet gone before that is one it never registered with as it sees
                # it, and the next kubelet's socket is (rightly) "re-created" to it.
                await until(lambda: registrar.registrations == 1, "the registrar's registration")
                await kubelet.stop()
                with contextlib.suppress(FileNotFoundError):  # gone with the kubelet process
                    os.unlink(kubelet.socket_path)
                await until(lambda: not registrar.registered, "the registrar to notice")
                async with FakeKubelet(directory) as again:
                    await again.wait_registered(RESOURCE, WAIT_S)
                    await until(lambda: registrar.registrations == 2, "the second registration")
                    events = [e["event"] for e in logs]  # before this kubelet goes too
            assert not [e for e in events if "re-created" in e], events
            assert events.count("kubelet socket gone (kubelet restart?); waiting for it") == 1
        finally:
            await stop_plugin(sock, tasks)

    asyncio.run(asyncio.wait_for(body(), 60))
