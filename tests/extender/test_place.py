"""``nvplugin place`` offline (``--nrt`` files): each node's verdict, reason and score as JSON
on stdout; a malformed NRT object is an input error naming the file and field."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.nrtgen import nrt_object

pytestmark = pytest.mark.process
GPU = "nvidia.com/gpu"
POD = """apiVersion: v1
kind: Pod
metadata: {name: train}
spec:
  containers:
  - name: main
    resources:
      limits: {nvidia.com/gpu: 3, cpu: "8", memory: 8Gi}
"""


def place(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", "place", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def node(name: str, free: tuple[int, int]) -> dict[str, object]:
    zones = {n: {GPU: (4, 4, free[n]), "cpu": (32, 32 - (n == 0), 30)} for n in range(2)}
    return nrt_object(name, zones, policy="single-numa-node", cpu_policy="static")


def test_place_says_where_the_pod_fits_and_why_not_elsewhere() -> None:
    folder = Path(tempfile.mkdtemp())
    (folder / "pod.yaml").write_text(POD)
    (folder / "nrts.json").write_text(
        json.dumps({"kind": "List", "items": [node("fits", (1, 3)), node("split", (2, 2))]})
    )
    done = place("--nrt", str(folder / "nrts.json"), "--output", "json", str(folder / "pod.yaml"))
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    rows = {r["node"]: r for r in report["nodes"]}
    assert rows["fits"]["admit"] is True and rows["fits"]["numa_nodes"] == [1]
    assert rows["split"]["admit"] is False
    assert rows["split"]["reason"] == "TopologyAffinityError"
    assert rows["fits"]["score"] > rows["split"]["score"] == 0
    table = place("--nrt", str(folder / "nrts.json"), str(folder / "pod.yaml"))
    assert "TopologyAffinityError" in table.stdout


def test_a_malformed_nrt_names_the_file_and_field() -> None:
    folder = Path(tempfile.mkdtemp())
    (folder / "pod.yaml").write_text(POD)
    bad = node("bad", (1, 1))
    bad["zones"][0]["resources"][0]["available"] = "lots"  # type: ignore[index]
    (folder / "nrt.yaml").write_text(json.dumps(bad))
    done = place("--nrt", str(folder / "nrt.yaml"), str(folder / "pod.yaml"))
    assert done.returncode == 2
    assert "nrt.yaml" in done.stderr and "zones[0].resources[0].available" in done.stderr
