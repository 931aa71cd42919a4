"""Admissions per second through ``nvplugin admit`` on dgx-2 (16 GPUs, 2 NUMA nodes).

Each run is the whole command: a Python process that starts the real plugin (``nvplugin serve``,
another process), the fake kubelet, and admits single-GPU pods in file order with
``single-numa-node`` and the static CPU manager. dgx-2 has 16 GPUs, so of 200 pods the first 16
are admitted (GetPreferredAllocation + Allocate over the plugin's socket) and the other 184 are
rejected by the topology manager (no GPU left on any NUMA node). Start-up is measured with a
1-pod file and taken off, so the rates are for admission alone:

- all 200 pods: admissions attempted per second (16 admitted, 184 rejected);
- 16 pods: admitted pods per second (every one gets a GPU).
"""

from __future__ import annotations

import os
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
    fd, path = tempfile.mkstemp(dir="/tmp", suffix=".yaml")
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


def run() -> None:
    one = _time_admit(1)
    sixteen = _time_admit(16)
    all_ = _time_admit(200)
    print(f"nvplugin admit on {NODE}, single-numa-node + static CPUs (best of 3 runs)")
    print(f"  1 pod (start-up: plugin process, registration, one admission): {one:6.2f} s")
    print(f"  16 pods (all admitted):                                     {sixteen:6.2f} s")
    print(f"  200 pods (16 admitted, 184 rejected):                       {all_:6.2f} s")
    rate_admitted = 15 / max(sixteen - one, 1e-9)
    rate_all = 199 / max(all_ - one, 1e-9)
    print(f"  admitted pods per second (start-up taken off):       {rate_admitted:8.0f}")
    print(f"  admissions attempted per second, 200 pods:           {rate_all:8.0f}")
