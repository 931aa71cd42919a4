"""``nvplugin demo``: the real plugin and the fake kubelet on four simulated nodes (one with MIG,
one with MPS shares beside time-slicing)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_demo_tells_the_story_and_exits_0() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
    done = subprocess.run(
        [sys.executable, "-m", "nvplugin", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "== 1. NVSwitch node, NUMA-aligned GPUs and CPUs (dgx-a100) ==" in out
    assert "== 2. NVLink-aware choice inside the NUMA node (dgx-1) ==" in out
    lines = out.splitlines()
    # Fits, with GPUs and exclusive CPUs from one NUMA node.
    assert any(line.split()[:4] == ["trainer", "train", "admitted", "0,1"] for line in lines)
    # One is refused by the topology manager.
    assert (
        "  -> TopologyAffinityError: Resources cannot be allocated with Topology locality" in lines
    )
    assert lines.count("4 of 5 pods admitted") == 2  # acts 1 and 3
    # The NVLink-aware choice, and what first fit would have given.
    assert "  pair-a/train: GPUs 0,3 (GPU0-GPU3 NV2+PHB, score 230)" in lines
    assert (
        "    (first fit on that NUMA node would give 0,1 (GPU0-GPU1 NV1+PIX, score 150))" in lines
    )
    assert "  pair-b/train: GPUs 1,2 (GPU1-GPU2 NV2+PHB, score 230)" in lines
    # MIG: resources per profile, a pod's MIG devices on one parent, one refused.
    assert "== 3. MIG devices as resources (migStrategy mixed) (dgx-a100-mig) ==" in out
    assert any(line.split()[:4] == ["pair", "worker", "admitted", "MIG"] for line in lines)
    assert "  pair/worker: MIG devices 0:0,0:1 on GPU0" in lines
    assert any(line.split()[:3] == ["split", "train", "rejected"] for line in lines)
    # MPS: a share is a quarter of an A100 80GB; two packed shares of one GPU, twice that.
    assert "== 4. MPS shares beside time-slicing (mixed-a100-t4) ==" in out
    assert any(
        line.split()[:3] == ["infer-small", "serve", "admitted"] and "MPS 20480M 25%" in line
        for line in lines
    )
    assert any(line.split()[:1] == ["infer-large"] and "MPS 40960M 50%" in line for line in lines)
    assert any(line.split()[:3] == ["notebook", "lab", "admitted"] for line in lines)
    assert "error" not in out
