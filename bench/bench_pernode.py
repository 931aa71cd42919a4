"""What per-node configs cost, and how fast they follow (target: a label change or a ConfigMap edit
served within a few seconds; the client library a small part of serve's memory).

- The client library alone: ``import`` time and resident memory added in a fresh process
  (lightkube, as ``nvplugin/kube/`` imports it), and with a client built and one Node read from the
  test API server.
- ``nvplugin serve`` on a simulated DGX A100 with MIG, beside the fake kubelet: its RSS without
  per-node configs, and with them following its Node through the API.
- Latency from a label change (PATCH-equivalent on the test API server) to the kubelet seeing the
  re-served resources (MIG mixed <-> time-sliced whole GPUs), and from a ConfigMap update (the
  kubelet's ``..data`` swap) to the new replica count.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from nvplugin.fakekubelet.devicemanager import DeviceManager
from nvplugin.fakekubelet.kubelet import FakeKubelet
from tests.support.configmap import ConfigMapVolume
from tests.support.kubeapi import KubeApiServer
from tests.support.serve import Serve, new_dir

NODE = "bench-node"
LABEL = "nvidia.com/device-plugin.config"
GPU = "nvidia.com/gpu"
MIG_SMALL = "nvidia.com/mig-1g.5gb"
CHANGES = 6
WAIT_S = 60.0

_IMPORT = """
import sys, time
import nvplugin.log, nvplugin.kube  # what serve has loaded anyway: not the library's cost
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
base, started = rss(), time.perf_counter()
from nvplugin.kube.client import open_client
from nvplugin.kube.node import get_node
imported, rss_imported = time.perf_counter(), rss()
if len(sys.argv) > 1:
    import asyncio
    from nvplugin.kube import ApiAccess
    async def read():
        client = open_client(ApiAccess(kubeconfig=sys.argv[1]))
        await get_node(client, sys.argv[2])
        await client.close()
    asyncio.run(read())
print(f"{(imported - started) * 1000:.0f} {(rss_imported - base) / 1024:.1f} "
      f"{(time.perf_counter() - started) * 1000:.0f} {(rss() - base) / 1024:.1f}")
"""


def _t4(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


CONFIGS = {
    "default": "version: v1\n",
    "a100-40gb": "version: v1\nflags:\n  migStrategy: mixed\n",
    "tesla-t4": _t4(4),
}


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _gpus(count: int) -> Callable[[DeviceManager], bool]:
    return lambda m: m.is_registered(GPU) and len(m.devices(GPU)) == count


def _mig(m: DeviceManager) -> bool:
    return m.is_registered(MIG_SMALL) and len(m.devices(MIG_SMALL)) == 16 and _gpus(2)(m)


async def _library(api: KubeApiServer) -> list[str]:
    lines = []
    for args, what in (((), "import"), ((api.kubeconfig(), NODE), "import + client + GET")):
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", _IMPORT, *args],
            capture_output=True,
            text=True,
            check=True,
        )
        ms, mib, total_ms, total_mib = done.stdout.split()
        if what == "import":
            lines.append(f"   lightkube import: {ms} ms, +{mib} MiB RSS")
        else:
            lines.append(f"   lightkube {what}: {total_ms} ms, +{total_mib} MiB RSS")
    return lines


async def _serve_rss(
    volume: ConfigMapVolume, env: dict[str, str], ready: Callable[..., bool], why: str = ""
) -> float:
    directory = new_dir()
    async with FakeKubelet(directory) as kubelet:
        serve = Serve(directory, "--simulate", "dgx-a100-mig", env=env)
        try:
            await kubelet.observer.wait_for(ready, WAIT_S, "served")
            if "CONFIG_FILE_SRCDIR" in env:
                await serve.wait_log("config selected", where=lambda line: why in line["why"])
            await asyncio.sleep(1.0)  # settle: the policy tables and first streams
            return _rss_mib(serve.pid)
        finally:
            serve.stop()


async def _latencies(
    api: KubeApiServer, volume: ConfigMapVolume, env: dict[str, str]
) -> tuple[list[float], list[float], float]:
    directory = new_dir()
    labels, edits = [], []
    async with FakeKubelet(directory) as kubelet:
        serve = Serve(directory, "--simulate", "dgx-a100-mig", env=env)
        try:
            await kubelet.observer.wait_for(_mig, WAIT_S, "the label's config")
            for number in range(CHANGES):
                value, ready = ("tesla-t4", _gpus(32)) if number % 2 == 0 else ("a100-40gb", _mig)
                started = time.perf_counter()
                api.label(NODE, LABEL, value)
                await kubelet.observer.wait_for(ready, WAIT_S, value)
                labels.append(time.perf_counter() - started)
            api.label(NODE, LABEL, "tesla-t4")
            await kubelet.observer.wait_for(_gpus(32), WAIT_S, "t4")
            for number in range(CHANGES):
                replicas = 2 if number % 2 == 0 else 4
                started = time.perf_counter()
                volume.update({**CONFIGS, "tesla-t4": _t4(replicas)})
                await kubelet.observer.wait_for(_gpus(8 * replicas), WAIT_S, f"x{replicas}")
                edits.append(time.perf_counter() - started)
            rss = _rss_mib(serve.pid)
        finally:
            serve.stop()
    return labels, edits, rss


async def _main() -> None:
    volume = ConfigMapVolume(CONFIGS)
    async with KubeApiServer() as api:
        api.add_node(NODE, {LABEL: "a100-40gb"})
        for line in await _library(api):
            print(line)
        base = {"CONFIG_FILE_SRCDIR": volume.path}
        without = await _serve_rss(volume, {}, _gpus(8))
        off = await _serve_rss(volume, base, _gpus(8))
        following = base | {"NODE_NAME": NODE, "KUBECONFIG": api.kubeconfig()}
        api.label(NODE, LABEL, "default")  # the same config as the two above, through the label
        on = await _serve_rss(volume, following, _gpus(8), why="label")
        api.label(NODE, LABEL, "a100-40gb")
        print(
            f"   serve RSS, one config: {without:.1f} MiB without per-node configs, {off:.1f} MiB "
            f"with a config directory and no API, {on:.1f} MiB following its Node's label"
        )
        labels, edits, after = await _latencies(api, volume, following)
    print(
        "   label change -> resources re-served: median "
        f"{statistics.median(labels) * 1000:.0f} ms, "
        f"max {max(labels) * 1000:.0f} ms ({CHANGES} changes, MIG mixed <-> time-sliced)"
    )
    print(
        f"   ConfigMap update (..data swap) -> new replicas served: median "
        f"{statistics.median(edits) * 1000:.0f} ms, max {max(edits) * 1000:.0f} ms "
        f"({CHANGES} edits)"
    )
    print(f"   serve RSS after {2 * CHANGES} changes: {after:.1f} MiB")


def run() -> None:
    asyncio.run(_main())
