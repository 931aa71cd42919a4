"""What one Kubernetes probe of the plugin costs (target: <= 0.1 s CPU and <= 30 MB per probe).

The plugin (``nvplugin serve`` on a simulated DGX-2, registered with the fake kubelet) is probed
the two ways a chart can:

- httpGet on its health endpoint (``/livez``, ``/readyz``; what the chart does): the cost is the
  plugin process's CPU time and RSS growth over many probes, per probe (the kubelet's HTTP GET is
  a few syscalls in the kubelet, not counted);
- an exec probe running ``nvplugin probe --socket S`` in the container (what the chart did): a
  whole Python process per probe, measured with ``wait4`` (CPU time, peak RSS).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

NODE = "dgx-2"
GPU = "nvidia.com/gpu"
HTTP_PROBES = 1000
EXEC_PROBES = 5


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def _logged_port(log: Path, event: str) -> int | None:
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == event:
                return int(record["port"])
    return None


def _http_probes(port: int, pid: int) -> tuple[float, float, list[float]]:
    """CPU seconds and RSS KiB growth of the plugin per probe, and each probe's latency (s)."""

    def probe(path: str) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            response.read()

    for _ in range(50):  # warm up: first-use allocations are no per-probe cost
        probe("/readyz")
    cpu, rss = _cpu_s(pid), _rss_kib(pid)
    latencies = []
    for number in range(HTTP_PROBES):
        started = time.perf_counter()
        probe("/readyz" if number % 2 else "/livez")
        latencies.append(time.perf_counter() - started)
    return (_cpu_s(pid) - cpu) / HTTP_PROBES, (_rss_kib(pid) - rss) / HTTP_PROBES, latencies


def _exec_probes(socket_path: str) -> tuple[list[float], list[int]]:
    """CPU seconds and peak RSS (KiB) of each ``nvplugin probe`` process."""
    cpu, peak = [], []
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
    for _ in range(EXEC_PROBES):
        process = subprocess.Popen(
            [sys.executable, "-m", "nvplugin", "probe", "--socket", socket_path],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            raise RuntimeError(f"nvplugin probe exited {process.returncode}")
        cpu.append(usage.ru_utime + usage.ru_stime)
        peak.append(usage.ru_maxrss)
    return cpu, peak


async def _measure() -> tuple[tuple[float, float, list[float]], tuple[list[float], list[int]]]:
    from nvplugin.fakekubelet.kubelet import FakeKubelet

    directory = tempfile.mkdtemp()
    log = Path(tempfile.mkdtemp()) / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
    command = [sys.executable, "-m", "nvplugin", "serve", "--simulate", NODE]
    command += ["--device-plugin-dir", directory, "--log-format", "json"]
    command += ["--health-probe-address", "127.0.0.1:0"]
    async with FakeKubelet(directory) as kubelet:
        with log.open("wb") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            await kubelet.wait_registered(GPU, timeout=30)
            port = _logged_port(log, "serving health probes")
            assert port is not None, log.read_text()
            http = await asyncio.to_thread(_http_probes, port, process.pid)
            socket_path = os.path.join(directory, "nvplugin-gpu.sock")
            exec_ = await asyncio.to_thread(_exec_probes, socket_path)
        finally:
            process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(process.wait, 10)
            shutil.rmtree(log.parent, ignore_errors=True)
            shutil.rmtree(directory, ignore_errors=True)
    return http, exec_


def run() -> None:
    from nvplugin.log import configure

    configure("json", "warning")  # the in-process fake kubelet's lines stay out of the figures
    (cpu, rss, latencies), (exec_cpu, exec_peak) = asyncio.run(_measure())
    ordered = sorted(latencies)
    print(
        f"   httpGet probe (the chart's; {HTTP_PROBES} probes): {cpu * 1000:.2f} ms CPU and "
        f"{rss:+.2f} KiB RSS of the plugin per probe, no process   "
        "(target <= 0.1 s CPU, <= 30 MB)"
    )
    print(
        f"      latency p50 {ordered[len(ordered) // 2] * 1000:.2f} ms, "
        f"p99 {ordered[int(len(ordered) * 0.99)] * 1000:.2f} ms"
    )
    print(
        f"   exec probe (nvplugin probe, {EXEC_PROBES} runs, for comparison): "
        f"median {statistics.median(exec_cpu):.2f} s CPU, "
        f"{statistics.median(exec_peak) / 1024:.0f} MB peak RSS per probe"
    )
