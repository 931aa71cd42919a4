"""Registration with the fake kubelet, in-process: fields, restarts, the polling fallback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile

import pytest

from nvplugin.allocator import make_policy
from nvplugin.api.v1beta1 import api_pb2
from nvplugin.kubelet.kubelet import FakeKubelet
from nvplugin.node import load_topology
from nvplugin.plugin.registration import Backoff, DirWatcher, Registrar, RegistrationError, register
from nvplugin.plugin.server import DevicePluginService, PluginSocket
from tests import WAIT_S, until
from tests.support.service import gpus_manager

RESOURCE = "nvidia.com/gpu"


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
        delays.append(backoff.next(delays[-1]))
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
