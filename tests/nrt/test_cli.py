"""``nvplugin topology --simulate``: the object an empty node would publish, on stdout, valid
against the NRT CRD, with the policies of the config file (and of the kubelet's config file it
names) and every MIG profile on its parent's NUMA node."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from nvplugin.nrt.objects import attributes_of, zone_resources
from tests.support.nrt import validate_nrt

pytestmark = pytest.mark.process


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", "topology", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_empty_mig_node_with_the_kubelets_policies() -> None:
    with tempfile.TemporaryDirectory() as directory:
        kubelet = Path(directory, "kubelet.yaml")
        kubelet.write_text(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
            "topologyManagerPolicy: single-numa-node\ncpuManagerPolicy: static\n"
        )
        config = Path(directory, "config.yaml")
        config.write_text(
            "version: v1\nnvplugin:\n  topology:\n"
            f"    kubeletConfig: {kubelet}\n    topologyManagerScope: pod\n"
        )
        done = _run(
            "--simulate", "dgx-a100-mig", "--mig-strategy", "mixed", "--config", str(config)
        )
    assert done.returncode == 0, done.stderr
    obj = yaml.safe_load(done.stdout)
    validate_nrt(obj)
    assert obj["metadata"]["name"] == "dgx-a100-mig"
    assert attributes_of(obj) == {
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
        "cpuManagerPolicy": "static",
        "memoryManagerPolicy": "None",  # the kubelet's default: the file is its whole config
        "nodeTopologyPodsFingerprint": "pfp0v001ef46db3751d8e999",
        "nvplugin.io/best-groups.nvidia.com/gpu": attributes_of(obj)[
            "nvplugin.io/best-groups.nvidia.com/gpu"
        ],
    }
    counts = zone_resources(obj)
    migs = {r for (_, r) in counts if r.startswith("nvidia.com/mig-")}
    assert len(migs) >= 2
    for capacity, allocatable, available in counts.values():
        assert capacity == allocatable == available


def test_json_and_a_bad_kubelet_config_is_named() -> None:
    done = _run("--simulate", "dgx-1", "--output", "json", "--node-name", "n1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["metadata"]["name"] == "n1"
    with tempfile.TemporaryDirectory() as directory:
        kubelet = Path(directory, "kubelet.yaml")
        kubelet.write_text("cpuManagerPolicy: [static]\n")
        config = Path(directory, "config.yaml")
        config.write_text(f"version: v1\nnvplugin:\n  topology:\n    kubeletConfig: {kubelet}\n")
        done = _run("--simulate", "dgx-1", "--config", str(config))
    assert done.returncode == 2
    assert f"kubelet config file {kubelet}: cpuManagerPolicy" in done.stderr
