"""Volcano's Numatopology from the same answers: its fields as Volcano's published types say
(policies, resReserved, numares, cpuDetail with Go's omitempty), the free CPUs as a cpuset and the
free GPUs' indices; the reserved CPU read from the kubelet's config file."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from nvplugin.api.podresources.v1 import api_pb2
from nvplugin.config import load_config
from nvplugin.errors import InputError
from nvplugin.nodesession import load_topology
from nvplugin.nrt.kubeletconfig import read_reserved_cpu
from nvplugin.nrt.objects import KubeletPolicies, idle_answers
from nvplugin.nrt.volcano import build_numatopology
from nvplugin.rm.plan import plan_for


def test_free_cpus_and_gpus_in_volcanos_fields() -> None:
    topology = load_topology("dgx-1")
    plan = plan_for(load_config(None, env={}), topology.gpus)
    _, allocatable = idle_answers(topology, plan, "static")
    gpus = [g.uuid for g in topology.gpus]
    listed = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name="p",
                namespace="default",
                containers=[
                    api_pb2.ContainerResources(
                        name="app",
                        devices=[
                            api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[d])
                            for d in gpus[:2]
                        ],
                        cpu_ids=[2, 3],
                    )
                ],
            )
        ]
    )
    obj = build_numatopology(
        "n1", topology, plan, listed, allocatable, KubeletPolicies("single-numa-node"), "1500m"
    )
    assert obj["apiVersion"] == "nodeinfo.volcano.sh/v1alpha1"
    assert obj["kind"] == "Numatopology"
    spec = obj["spec"]
    assert spec["policies"] == {
        "CPUManagerPolicy": "none",
        "TopologyManagerPolicy": "single-numa-node",
    }
    assert spec["resReserved"] == {"cpu": "1500m"}
    assert spec["numares"]["cpu"] == {"allocatable": "0-1,4-79", "capacity": 80}
    assert spec["numares"]["nvidia.com/gpu"] == {"allocatable": "2,3,4,5,6,7", "capacity": 8}
    assert spec["cpuDetail"]["0"] == {}  # NUMA node, socket and core 0: omitted, as Go does
    last = topology.cpus.cpus[-1]
    assert spec["cpuDetail"][str(last.id)] == {
        k: v
        for k, v in {"numa": last.numa_node, "socket": last.socket, "core": last.core}.items()
        if v
    }
    assert len(spec["cpuDetail"]) == 80


def test_reserved_cpu_from_the_kubelet_config() -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory, "kubelet.yaml")
        path.write_text("kubeReserved: {cpu: 500m}\nsystemReserved: {cpu: '1', memory: 1Gi}\n")
        assert read_reserved_cpu(str(path)) == "1500m"
        path.write_text("kind: KubeletConfiguration\n")
        assert read_reserved_cpu(str(path)) == "0"
        path.write_text("kubeReserved: {cpu: '2'}\n")
        assert read_reserved_cpu(str(path)) == "2"
        path.write_text("kubeReserved: {cpu: lots}\n")
        with pytest.raises(InputError, match=r"kubeReserved\.cpu: lots is not a CPU quantity"):
            read_reserved_cpu(str(path))
