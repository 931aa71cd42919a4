"""The NodeResourceTopology object built from the fake kubelet's pod resources answers, while the
real plugin serves and pods come and go: it validates against the NRT CRD's schema, every zone's
available is allocatable less what podresources says is held, the zones add up to the node's
allocatable, and the best-group attributes are what ``nvplugin preferred`` answers for the free
GPUs."""

from __future__ import annotations

import json

import pytest

from nvplugin.admit.admission import Admission, AdmitSettings
from nvplugin.api.podresources.v1 import api_pb2
from nvplugin.config import load_config
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.nodesession import load_topology
from nvplugin.nrt.bestgroups import BestGroups
from nvplugin.nrt.objects import (
    KubeletPolicies,
    attributes_of,
    build_nrt,
    zone_resources,
)
from nvplugin.rm.plan import plan_for
from nvplugin.rm.query import answer_preferred
from tests.support.nrt import check_nrt, pod_resources_answers, validate_nrt
from tests.support.tinyplugin import run

GPU = "nvidia.com/gpu"


def _pod(name: str, gpus: int, cpus: int = 0, init_gpus: int = 0) -> Pod:
    limits: dict[str, str | int] = {GPU: gpus}
    if cpus:
        limits |= {"cpu": cpus, "memory": "1Gi"}
    inits = []
    if init_gpus:
        init: dict[str, str | int] = {GPU: init_gpus}
        if cpus:
            init |= {"cpu": 1, "memory": "1Gi"}
        inits.append(Container.of("init", limits=init))
    return Pod.of(name, [Container.of("app", limits=limits)], init_containers=inits)


def _preferred(topology_name: str, free: list[int], size: int) -> list[int]:
    doc = json.loads(
        answer_preferred(
            load_topology(topology_name),
            mig_strategy="none",
            resource=None,
            policy="best-effort",
            available=",".join(map(str, free)),
            must_include="",
            size=size,
            explain=False,
            output="json",
        )
    )
    return list(doc["indices"])


@pytest.mark.process  # runs nvplugin serve
@pytest.mark.parametrize("scope", ["container", "pod"])
def test_the_object_follows_admitted_and_deleted_pods(scope: str) -> None:
    settings = AdmitSettings(
        simulate="dgx-1",
        topology_manager_policy="best-effort",
        topology_manager_scope=scope,
        cpu_manager_policy="static",
        reserved_cpus="0",
    )
    topology = load_topology("dgx-1")
    plan = plan_for(load_config(None, env={}), topology.gpus)
    groups = BestGroups(topology)
    policies = KubeletPolicies("best-effort", scope, "static", None)
    cpu_numa = {c.id: c.numa_node for c in topology.cpus.cpus}
    by_uuid = {g.uuid: g.index for g in topology.gpus}

    async def main() -> None:
        async with Admission(settings, topology) as admission:
            steps: list[tuple[str, Pod | str]] = [
                ("admit", _pod("a", 2, cpus=2, init_gpus=1)),
                ("admit", _pod("b", 1)),
                ("admit", _pod("c", 3, cpus=4)),
                ("delete", "a"),
                ("admit", _pod("d", 1, init_gpus=2)),
                ("delete", "c"),
            ]
            uids: dict[str, str] = {}
            for _, what in steps:
                if isinstance(what, Pod):
                    assert (await admission.admit(what)).admitted, what.name
                    uids[what.name] = what.uid
                else:
                    admission.delete(uids[what])
                listed, allocatable = await pod_resources_answers(
                    admission.pod_resources.socket_path
                )
                obj = build_nrt("node-a", topology, plan, listed, allocatable, policies, groups)
                check_nrt(
                    obj,
                    listed,
                    allocatable,
                    {GPU: 8, "cpu": len(allocatable.cpu_ids)},
                    cpu_numa,
                )
                attributes = attributes_of(obj)
                assert attributes["topologyManagerScope"] == scope
                assert attributes["cpuManagerPolicy"] == "static"
                assert "memoryManagerPolicy" not in attributes
                held = {
                    by_uuid[d]
                    for p in listed.pod_resources
                    for c in p.containers
                    for e in c.devices
                    for d in e.device_ids
                }
                free = sorted(set(range(8)) - held)
                value = attributes[f"nvplugin.io/best-groups.{GPU}"]
                entries = [tuple(map(int, part.split(":"))) for part in value.split(",")]
                assert [k for k, _, _ in entries] == list(range(1, min(8, len(free)) + 1))
                for k, score, nvlinked in entries:
                    group = _preferred("dgx-1", free, k)
                    assert score == topology.group_score(group), (k, free)
                    linked = all(topology.link(a, b).nvlinks for a in group for b in group if a < b)
                    assert nvlinked == int(linked)

    run(main())


def test_an_empty_node_validates_and_says_its_numa_layout() -> None:
    topology = load_topology("dgx-a100-mig")
    plan = plan_for(load_config(None, env={}, flags={"flags.migStrategy": "mixed"}), topology.gpus)
    devices = [
        api_pb2.ContainerDevices(
            resource_name=served.name,
            device_ids=[d.id],
            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=d.numa_node or 0)]),
        )
        for served in plan.resources
        for d in served.devices
    ]
    obj = build_nrt(
        "n",
        topology,
        plan,
        api_pb2.ListPodResourcesResponse(),
        api_pb2.AllocatableResourcesResponse(devices=devices),
        KubeletPolicies("single-numa-node", "container"),
        BestGroups(topology),
    )
    validate_nrt(obj)
    assert obj["metadata"] == {"name": "n"}
    assert [z["name"] for z in obj["zones"]] == [f"node-{i}" for i in range(8)]
    assert obj["zones"][0]["costs"][4] == {"name": "node-4", "value": 32}
    counts = zone_resources(obj)
    for served in plan.resources:
        # each MIG profile by name, on its parent's NUMA node, all free
        for d in served.devices:
            capacity, allocatable, available = counts[(f"node-{d.numa_node}", served.name)]
            assert capacity == allocatable == available > 0
        assert sum(v[0] for (_, r), v in counts.items() if r == served.name) == len(served.devices)
    # CPU manager policy none: nothing pinned, every CPU counts
    assert sum(v[1] for (_, r), v in counts.items() if r == "cpu") == len(topology.cpus.cpus)
    attributes = attributes_of(obj)
    assert attributes["topologyManagerPolicy"] == "single-numa-node"
    assert attributes["nodeTopologyPodsFingerprint"] == "pfp0v001ef46db3751d8e999"
