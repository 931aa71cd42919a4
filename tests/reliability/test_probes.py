"""The kubelet's probes (the chart's httpGet on ``nvplugin.healthProbes.address``): what they
answer in each state of the plugin, and that one probe costs the plugin next to nothing -- no
process, no thread.
The idle-connection attack on the same endpoint is the ``idle_connections`` scenario."""

from __future__ import annotations

import asyncio
import os

from nvplugin.config import Config, load_config
from nvplugin.errors import NvpluginError
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.nodesession import NodeSession, open_node
from nvplugin.plugin.daemon import Daemon
from tests.support.harness import GPU, http_get, rss_kib, running, thread_count
from tests.support.serve import new_dir, node_file, remove_dir

PROBES = 200
MAX_CPU_S = 0.1  # per probe: an exec probe took ~0.6 s
MAX_RSS_KIB = 30 * 1024  # per probe: an exec probe took ~52 MB


class NoNvml:
    """An opener that fails as NVML does when the driver is missing."""

    def __call__(self, simulate: str | None) -> NodeSession:
        raise NvpluginError("NVML: driver not loaded")


def _config(directory: str, **flags: object) -> Config:
    return load_config(
        None,
        flags={
            "nvplugin.devicePluginDir": directory,
            "nvplugin.healthProbes.address": "127.0.0.1:0",
            **flags,
        },
    )


async def _port_of(daemon: Daemon) -> int:
    async with asyncio.timeout(20):
        while daemon.probe_port is None:
            await asyncio.sleep(0.01)
    return daemon.probe_port


def test_live_while_waiting_for_gpus_not_ready() -> None:
    """NVML fails and the plugin waits for GPUs: alive (no restart loop), not ready."""

    async def body() -> None:
        directory = new_dir()
        try:
            config = _config(directory, **{"flags.failOnInitError": False})
            daemon = Daemon(config, discovery_retry_s=30, opener=NoNvml())
            task = asyncio.create_task(daemon.run(handle_signals=False))
            port = await _port_of(daemon)
            status, text = await http_get(port, "/livez")
            assert status == 200 and text.startswith("live\n"), text
            status, text = await http_get(port, "/readyz")
            assert status == 503 and text.startswith("not ready\n"), text
            daemon.stop()
            assert await task == 0
        finally:
            remove_dir(directory)

    asyncio.run(asyncio.wait_for(body(), 60))


def test_ready_only_while_registered_with_a_healthy_gpu_and_live_throughout() -> None:
    async def body() -> None:
        directory, node_dir = new_dir(), new_dir()
        lost = [{"after_s": 4.0, "gpu": gpu, "lost": True} for gpu in range(4)]
        node = node_file(node_dir, "workstation-4gpu", lost)
        try:
            daemon = Daemon(_config(directory), simulate=node, opener=open_node)
            task = asyncio.create_task(daemon.run(handle_signals=False))
            port = await _port_of(daemon)
            # No kubelet yet: served, not registered.
            async with asyncio.timeout(20):
                while not os.path.exists(os.path.join(directory, "nvplugin-gpu.sock")):
                    await asyncio.sleep(0.01)
            status, text = await http_get(port, "/readyz")
            assert status == 503, text
            async with FakeKubelet(directory) as kubelet:
                obs = kubelet.observer
                await kubelet.wait_registered(GPU, timeout=20)
                await obs.wait_for(lambda m: len(m.healthy_devices(GPU)) == 4, 10, "4 healthy")
                status, text = await http_get(port, "/readyz")
                assert status == 200, text
                assert "nvidia.com/gpu: SERVING: registered with the kubelet, 4 of 4" in text
                # Every GPU lost: the kubelet's view and the probes change together.
                await obs.wait_for(lambda m: len(m.unhealthy_devices(GPU)) == 4, 20, "all lost")
                status, text = await http_get(port, "/readyz")
                assert status == 503 and "no healthy GPU (0 of 4 GPUs healthy)" in text, text
                status, text = await http_get(port, "/livez")
                assert status == 200, text
                daemon.stop()
                assert await task == 0
        finally:
            remove_dir(directory)
            remove_dir(node_dir)

    asyncio.run(asyncio.wait_for(body(), 60))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_one_probe_costs_the_plugin_next_to_nothing() -> None:
    """CPU and memory of the plugin process over many probes, per probe; no thread per probe.
    (The bounds are ~100 times what a probe costs: no flake under load.)"""

    async def body() -> None:
        async with running("--simulate", "workstation-4gpu") as (_kubelet, plugin):
            port = await plugin.probe_port()
            for _ in range(20):  # warm: first-use allocations are no per-probe cost
                await http_get(port, "/readyz")
            cpu, rss, threads = _cpu_s(plugin.pid), rss_kib(plugin.pid), thread_count(plugin.pid)
            for number in range(PROBES):
                status, text = await http_get(port, "/readyz" if number % 2 else "/livez")
                assert status == 200, text
            per_probe_cpu = (_cpu_s(plugin.pid) - cpu) / PROBES
            assert per_probe_cpu <= MAX_CPU_S, per_probe_cpu
            assert rss_kib(plugin.pid) - rss <= MAX_RSS_KIB
            assert thread_count(plugin.pid) == threads

    asyncio.run(asyncio.wait_for(body(), 120))
