"""The daemon in-process: NVML failing at start (retry, or fail), and shutdown."""

from __future__ import annotations

import asyncio
import os
import tempfile

import pytest
from grpc_health.v1 import health_pb2

from nvplugin.config import load_config
from nvplugin.errors import NvpluginError
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.nodesession import NodeSession, open_node
from nvplugin.plugin.daemon import Daemon
from tests.support.service import health_check
from tests.support.waiting import WAIT_S

GPU = "nvidia.com/gpu"


class FlakyNvml:
    """An opener whose first ``failures`` calls fail as NVML does when the driver is missing."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, simulate: str | None) -> NodeSession:
        self.calls += 1
        if self.calls <= self.failures:
            raise NvpluginError("NVML: driver not loaded")
        return open_node(simulate)


def test_without_fail_on_init_error_it_retries_and_registers_once_gpus_appear() -> None:
    async def body() -> None:
        directory = tempfile.mkdtemp()
        config = load_config(
            None, flags={"nvplugin.devicePluginDir": directory, "flags.failOnInitError": False}
        )
        opener = FlakyNvml(failures=3)
        daemon = Daemon(config, simulate="workstation-4gpu", discovery_retry_s=0.05, opener=opener)
        async with FakeKubelet(directory) as kubelet:
            task = asyncio.create_task(daemon.run(handle_signals=False))
            await kubelet.wait_registered(GPU, WAIT_S)
            assert opener.calls == 4
            await kubelet.observer.wait_for(lambda m: len(m.devices(GPU)) == 4, WAIT_S, "4 GPUs")
            daemon.stop()
            assert await task == 0
        assert not os.path.exists(os.path.join(directory, "nvplugin-gpu.sock"))

    asyncio.run(asyncio.wait_for(body(), 30))


def test_with_fail_on_init_error_the_error_propagates() -> None:
    async def body() -> None:
        directory = tempfile.mkdtemp()
        config = load_config(None, flags={"nvplugin.devicePluginDir": directory})
        daemon = Daemon(config, simulate="workstation-4gpu", opener=FlakyNvml(failures=1))
        with pytest.raises(NvpluginError, match="driver not loaded"):
            await daemon.run(handle_signals=False)
        assert os.listdir(directory) == []

    asyncio.run(asyncio.wait_for(body(), 30))


def test_stop_while_waiting_for_gpus() -> None:
    """While NVML fails, the socket answers the health service NOT_SERVING (liveness probes see
    a live plugin), is served again when a kubelet restart removes it, and goes at stop."""

    async def body() -> None:
        directory = tempfile.mkdtemp()
        config = load_config(
            None, flags={"nvplugin.devicePluginDir": directory, "flags.failOnInitError": False}
        )
        daemon = Daemon(config, discovery_retry_s=30, opener=FlakyNvml(failures=100))
        task = asyncio.create_task(daemon.run(handle_signals=False))
        path = os.path.join(directory, "nvplugin-gpu.sock")
        for _ in range(200):
            if os.path.exists(path):
                break
            await asyncio.sleep(0.01)
        status, reason = await health_check(path)
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert reason.startswith("not registered with the kubelet")
        async with FakeKubelet(directory):  # deletes every socket, as the kubelet's start does
            assert not os.path.exists(path)
            for _ in range(300):
                if os.path.exists(path):
                    break
                await asyncio.sleep(0.01)
            status, _ = await health_check(path)
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        daemon.stop()
        assert await asyncio.wait_for(task, WAIT_S) == 0
        assert not os.path.exists(path)

    asyncio.run(asyncio.wait_for(body(), 30))
