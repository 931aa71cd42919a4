"""MPS on simulated nodes, against the fake kubelet (the control daemon is the simulated node's
``nvidia-cuda-mps-control``, a Python program: each control command starts one process, as the
real program's client does).

Prints, with the load average (the figures grow with it: a command is a process start):
- start -> MPS resource advertised: from spawning ``nvplugin serve`` with ``sharing.mps`` to the
  kubelet holding the registration and every replica Healthy, on dgx-1 (8 GPUs: 10 control
  commands before it is advertised) and dgx-2 (16 GPUs: 18), beside the same node time-sliced
  (no daemon) for what MPS adds;
- daemon killed -> replicas Unhealthy (the kubelet's view) and -> Healthy again (restarted after
  the first backoff step, 0.5 s, and set up), once per run on dgx-1 (kills in a row back off
  further: 1 s, 2 s, ... up to 30 s).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.bench_plugin import spawn, stop

GPU = "nvidia.com/gpu"
RUNS = 3
REPLICAS = 4


def _config(block: str) -> str:
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as out:
        out.write(
            f"version: v1\nsharing:\n  {block}:\n    resources:\n"
            f"    - {{name: {GPU}, replicas: {REPLICAS}}}\n"
        )
    return path


def _spawn(directory: str, node: str, config: str, root: str) -> subprocess.Popen[bytes]:
    return spawn(directory, "--config", config, "--mps-root", root, node=node)


def _stop(process: subprocess.Popen[bytes]) -> None:
    stop(process, 30)


async def _advertised(
    node: str, block: str, gpus: int, kill: bool = False
) -> tuple[list[float], ...]:
    """Spawn -> every replica Healthy, ``RUNS`` times; with ``kill``, then in each run the
    daemon killed: kill -> all Unhealthy, kill -> all Healthy again."""
    from nvplugin.fakekubelet.kubelet import FakeKubelet
    from nvplugin.plugin.mps import daemon_pids

    starts, unhealthy, healthy = [], [], []
    config = _config(block)
    try:
        for _ in range(RUNS):
            directory, root = tempfile.mkdtemp(), tempfile.mkdtemp()
            try:
                async with FakeKubelet(directory) as kubelet:
                    observer = kubelet.observer
                    started = time.perf_counter()
                    process = _spawn(directory, node, config, root)
                    try:
                        await observer.wait_for(
                            lambda m: len(m.healthy_devices(GPU)) == gpus * REPLICAS, 120, "all"
                        )
                        starts.append(time.perf_counter() - started)
                        pipe = os.path.join(root, GPU, "pipe")
                        if kill:
                            (daemon,) = daemon_pids(pipe)
                            started = time.perf_counter()
                            os.kill(daemon, signal.SIGKILL)
                            await observer.wait_for(
                                lambda m: len(m.unhealthy_devices(GPU)) == gpus * REPLICAS,
                                60,
                                "all Unhealthy",
                            )
                            unhealthy.append(time.perf_counter() - started)
                            await observer.wait_for(
                                lambda m: len(m.healthy_devices(GPU)) == gpus * REPLICAS,
                                60,
                                "all Healthy",
                            )
                            healthy.append(time.perf_counter() - started)
                    finally:
                        _stop(process)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
                shutil.rmtree(root, ignore_errors=True)
    finally:
        os.unlink(config)
    return starts, unhealthy, healthy


def _load() -> str:
    one, five, _ = Path("/proc/loadavg").read_text().split()[:3]
    return f"load average {one} (1 min), {five} (5 min) on {os.cpu_count()} CPUs"


def _seconds(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} s, max {max(values):.2f} s ({len(values)} runs)"


def run() -> None:
    from nvplugin.log import configure

    configure("json", "warning")  # the in-process fake kubelet's lines stay out of the figures
    print(f"   {_load()}")
    for node, gpus in (("dgx-1", 8), ("dgx-2", 16)):
        sliced, _, _ = asyncio.run(_advertised(node, "timeSlicing", gpus))
        mps, unhealthy, healthy = asyncio.run(_advertised(node, "mps", gpus, node == "dgx-1"))
        print(f"   {node}: start -> {gpus}x{REPLICAS} MPS replicas advertised: {_seconds(mps)}")
        print(f"   {node}: start -> time-sliced replicas advertised:       {_seconds(sliced)}")
        if unhealthy:
            print(f"   {node}: daemon killed -> replicas Unhealthy: {_seconds(unhealthy)}")
            print(f"   {node}: daemon killed -> replicas Healthy again: {_seconds(healthy)}")
    print(f"   {_load()}")
