"""Admissions per second through ``nvplugin admit`` on dgx-2 (16 GPUs, 2 NUMA nodes).

Each run is the whole command: a Python process that starts the real plugin (``nvplugin serve``,
another process), the fake kubelet, and admits single-GPU pods in file order with
``single-numa-node`` and the static CPU manager. dgx-2 has 16 GPUs, so of 200 pods the first 16
are admitted (GetPreferredAllocation + Allocate over the plugin's socket) and the other 184 are
rejected by the topology manager (no GPU left on any NUMA node). The whole command is dominated
by start-up, so the admission rates are timed inside one process around the admissions alone
(``Admission.admit``, the plugin already registered):

- admitted pods per second (each one's GetPreferredAllocation and Allocate over the socket);
- rejected pods per second (the topology manager's hints and merge, no Allocate).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time

NODE = "dgx-2"
FLAGS = (
    "--simulate",
    NODE,
    "--topology-manager-policy",
    "single-numa-node",
    "--cpu-manager-policy",
    "static",
    "--reserved-cpus",
    "0-1",
    "--output",
    "json",
)


def _pods(n: int) -> str:
    docs = [
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: pod-{i:03d}}}\nspec:\n  containers:\n"
        "    - name: main\n      resources:\n"
        "        limits: {nvidia.com/gpu: 1, cpu: '2', memory: 1Gi}\n"
        for i in range(n)
    ]
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write("---\n".join(docs))
    return path


def _time_admit(n: int, repeat: int = 3) -> float:
    path = _pods(n)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
    best = float("inf")
    try:
        for _ in range(repeat):
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "nvplugin", "admit", *FLAGS, path],
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
            )
            elapsed = time.perf_counter() - started
            if done.returncode != 0:
                raise RuntimeError(f"nvplugin admit failed: {done.stderr}")
            admitted = done.stdout.count('"admitted": true')
            if admitted != min(n, 16):
                raise RuntimeError(f"expected {min(n, 16)} admitted, got {admitted}")
            best = min(best, elapsed)
    finally:
        os.unlink(path)
    return best


async def _time_admissions(path: str, rounds: int = 3) -> tuple[list[float], list[float]]:
    """Seconds per admitted and per rejected pod, each admission timed on its own, over
    ``rounds`` fresh kubelets (a new plugin each: every round starts with 16 free GPUs)."""
    from nvplugin.admit.admission import Admission, AdmitSettings
    from nvplugin.fakekubelet.pods import load_pod_file
    from nvplugin.log import configure
    from nvplugin.nodesession import load_topology

    configure("json", "warning")  # the in-process fake kubelet's lines stay out of the figures
    settings = AdmitSettings(
        simulate=NODE,
        topology_manager_policy="single-numa-node",
        cpu_manager_policy="static",
        reserved_cpus="0-1",
    )
    pods = load_pod_file(path)
    topology = load_topology(NODE)
    admitted: list[float] = []
    rejected: list[float] = []
    for _ in range(rounds):
        async with Admission(settings, topology) as admission:
            for pod in pods:
                started = time.perf_counter()
                result = await admission.admit(pod)
                elapsed = time.perf_counter() - started
                (admitted if result.admitted else rejected).append(elapsed)
    if len(admitted) != 16 * rounds:
        raise RuntimeError(f"expected {16 * rounds} admitted, got {len(admitted)}")
    return admitted, rejected


def _rate_line(label: str, times: list[float]) -> str:
    per_s = len(times) / sum(times)
    p50 = statistics.median(times) * 1e3
    worst = max(times) * 1e3
    return f"  {label}: {per_s:6.0f}/s  (p50 {p50:.2f} ms, max {worst:.2f} ms, {len(times)} pods)"


def run() -> None:
    one = _time_admit(1)
    sixteen = _time_admit(16)
    all_ = _time_admit(200)
    print(f"nvplugin admit on {NODE}, single-numa-node + static CPUs (best of 3 runs)")
    print(f"  1 pod (start-up: plugin process, registration, one admission): {one:6.2f} s")
    print(f"  16 pods (all admitted):                                     {sixteen:6.2f} s")
    print(f"  200 pods (16 admitted, 184 rejected):                       {all_:6.2f} s")
    path = _pods(200)
    try:
        admitted, rejected = asyncio.run(_time_admissions(path))
    finally:
        os.unlink(path)
    print("in one process, the plugin registered, each admission timed alone (3 rounds of 200):")
    print(_rate_line("admitted pods (GetPreferredAllocation + Allocate)", admitted))
    print(_rate_line("rejected pods (topology manager)                 ", rejected))
