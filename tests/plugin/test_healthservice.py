"""The gRPC health service: its status rules on a real aio server, and ``nvplugin probe`` against
a real ``nvplugin serve`` before registration, registered, and with every GPU lost."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nvplugin.config import HealthServiceConfig
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.plugin.healthservice import (
    NOT_SERVING,
    SERVICE_UNKNOWN,
    SERVING,
    PluginHealthService,
    add_to_server,
)
from tests.support.serve import Serve, kubelet_with, new_dir, node_file
from tests.support.waiting import WAIT_S, until

GPU = "nvidia.com/gpu"


def run(body: Callable[[], Awaitable[None]], timeout: float = 2 * WAIT_S) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


class Served:
    """A PluginHealthService on a real grpc.aio server and unix socket, and a client stub."""

    def __init__(self, service: PluginHealthService) -> None:
        self.service = service
        self.path = os.path.join(tempfile.mkdtemp(), "health.sock")
        self.server = grpc.aio.server()
        add_to_server(service, self.server)
        self.server.add_insecure_port(f"unix:{self.path}")
        self.channel = grpc.aio.insecure_channel(f"unix:{self.path}")
        self.stub = health_pb2_grpc.HealthStub(self.channel)

    async def check(self, name: str = "") -> tuple[int, str]:
        call = self.stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=WAIT_S)
        answer = await call
        reason = dict(await call.trailing_metadata() or ()).get("nvplugin-reason", "")
        return answer.status, str(reason)


@contextlib.asynccontextmanager
async def serving(service: PluginHealthService) -> AsyncIterator[Served]:
    served = Served(service)
    await served.server.start()
    try:
        yield served
    finally:
        await served.channel.close()
        await served.server.stop(0)


def test_status_follows_registration_and_healthy_gpus() -> None:
    async def body() -> None:
        service = PluginHealthService(GPU)
        async with serving(service) as served:
            assert await served.check() == (
                NOT_SERVING,
                "not registered with the kubelet (0 of 0 GPUs healthy)",
            )
            service.set_health({0: True, 1: True})
            assert (await served.check())[0] == NOT_SERVING  # healthy, but not registered
            service.set_registered(True)
            assert await served.check() == (
                SERVING,
                "registered with the kubelet, 2 of 2 GPUs healthy",
            )
            assert (await served.check(GPU))[0] == SERVING  # the resource name reports the same
            service.set_health({0: False, 1: True})
            assert (await served.check())[0] == SERVING  # one healthy GPU is enough
            service.set_health({0: False, 1: False})
            assert await served.check() == (
                NOT_SERVING,
                "registered, but no healthy GPU (0 of 2 GPUs healthy)",
            )
            service.set_settings(HealthServiceConfig(not_serving_without_healthy_gpus=False))
            assert (await served.check(GPU))[0] == SERVING
            service.set_registered(False)  # a kubelet restart
            assert (await served.check(GPU))[0] == NOT_SERVING

    run(body)


def test_unknown_service_is_not_found_and_list_has_both_names() -> None:
    async def body() -> None:
        async with serving(PluginHealthService(GPU)) as served:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await served.check("x" * 5000)
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert "(5000 characters)" in (caught.value.details() or "")
            listed = await served.stub.List(health_pb2.HealthListRequest(), timeout=WAIT_S)
            assert {name: s.status for name, s in listed.statuses.items()} == {
                "": NOT_SERVING,
                GPU: NOT_SERVING,
            }

    run(body)


def test_watch_streams_every_change_until_closed() -> None:
    async def body() -> None:
        service = PluginHealthService(GPU)
        async with serving(service) as served:
            seen: list[int] = []
            unknown: list[int] = []

            async def watch(name: str, into: list[int]) -> None:
                request = health_pb2.HealthCheckRequest(service=name)
                async for answer in served.stub.Watch(request):
                    into.append(answer.status)

            tasks = [
                asyncio.create_task(watch("", seen)),
                asyncio.create_task(watch("other", unknown)),
            ]
            # Each change only once the stream has sent the state before it: a stream sends the
            # latest state, so two changes between two sends are one message.
            await until(lambda: seen == [NOT_SERVING] and unknown == [SERVICE_UNKNOWN], "1st")
            service.set_health({0: True})
            service.set_registered(True)
            await until(lambda: len(seen) == 2, "SERVING on the stream")
            service.set_health({0: False})
            await until(lambda: len(seen) == 3, "NOT_SERVING on the stream")
            service.close()  # ends both streams cleanly
            await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
            assert seen == [NOT_SERVING, SERVING, NOT_SERVING]
            assert unknown == [SERVICE_UNKNOWN]

    run(body)


def _probe(socket_path: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", "probe", "--socket", socket_path, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.process
def test_probe_a_real_plugin_unregistered_registered_and_without_healthy_gpus() -> None:
    """Readiness says NOT_SERVING before the kubelet is there and once every GPU is lost; the
    liveness form (--live) passes throughout; the plugin answers all along.

    Two plugins, so that no step races the simulated clock: GPU loss is scripted in seconds
    from start, and on a loaded machine "registered, all GPUs healthy" could come after it. The
    first plugin loses no GPU; the second loses all of them with the kubelet already there, and
    whether that happens before or after it registers, it ends registered with none healthy.
    """

    async def body() -> None:
        directory = new_dir()
        serve = Serve(directory, "--simulate", "workstation-4gpu")
        socket_path = os.path.join(directory, "nvplugin-gpu.sock")
        try:
            await serve.wait_log("serving")
            early = await asyncio.to_thread(_probe, socket_path)
            assert early.returncode == 1
            assert "is NOT_SERVING: not registered with the kubelet" in early.stderr
            live = await asyncio.to_thread(_probe, socket_path, "--live")
            assert live.returncode == 0, live.stderr
            async with FakeKubelet(directory) as kubelet:
                await kubelet.wait_registered(GPU, WAIT_S)
                await serve.wait_log(
                    "health service status", where=lambda e: e["status"] == "SERVING"
                )
                ready = await asyncio.to_thread(_probe, socket_path, "--service", GPU)
                assert ready.returncode == 0, ready.stderr
                assert "SERVING: registered with the kubelet, 4 of 4 GPUs healthy" in ready.stdout
        finally:
            assert serve.stop() == 0

        directory = new_dir()
        socket_path = os.path.join(directory, "nvplugin-gpu.sock")
        # After discovery (a GPU lost before it is a start-up error), soon after start.
        events = [{"after_s": 2.0, "gpu": g, "lost": True} for g in range(4)]
        node = node_file(new_dir(), "workstation-4gpu", events)
        async with kubelet_with(directory, "--simulate", node) as (kubelet, serve):
            await serve.wait_log("registered with kubelet")  # the health service knows
            # The plugin updates its health service before it sends the device list.
            await kubelet.observer.wait_for(
                lambda m: len(m.unhealthy_devices(GPU)) == 4, WAIT_S, "every GPU lost"
            )
            lost = await asyncio.to_thread(_probe, socket_path)
            assert lost.returncode == 1
            assert "NOT_SERVING: registered, but no healthy GPU (0 of 4" in lost.stderr
            assert (await asyncio.to_thread(_probe, socket_path, "--live")).returncode == 0

    run(body, 4 * WAIT_S)


@pytest.mark.process
def test_serving_without_healthy_gpus_when_configured() -> None:
    async def body() -> None:
        directory = new_dir()
        node = node_file(
            new_dir(), "workstation-4gpu", [{"after_s": 0.5, "wait_error": True, "for_s": 60}]
        )
        config = Path(new_dir()) / "config.yaml"
        config.write_text("nvplugin:\n  healthService:\n    notServingWithoutHealthyGpus: false\n")
        plugin_args = ("--simulate", node, "--config", str(config))
        async with kubelet_with(directory, *plugin_args) as (kubelet, serve):
            await serve.wait_log("registered with kubelet")  # the health service knows
            await kubelet.observer.wait_for(
                lambda m: len(m.unhealthy_devices(GPU)) == 4, WAIT_S, "every GPU unhealthy"
            )
            done = await asyncio.to_thread(_probe, os.path.join(directory, "nvplugin-gpu.sock"))
            assert done.returncode == 0, done.stderr
            assert "SERVING: registered with the kubelet, 0 of 4 GPUs healthy" in done.stdout

    run(body)
