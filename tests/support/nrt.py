"""NodeResourceTopology checks the NRT tests share: the restated CRD's schema, and what an object
must say given the kubelet's pod resources answers (computed here on their own, from the answers
alone: a device's zone is the NUMA node the kubelet lists it on)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import yaml

from nvplugin.api.podresources.v1 import api_pb2, api_pb2_grpc
from nvplugin.fakekubelet.devicemanager.manager import DeviceManager
from nvplugin.fakekubelet.podresources import PodResourcesServer
from nvplugin.fakekubelet.pods import Pod
from nvplugin.nrt.objects import zone_resources
from tests.support.serve import new_dir

CRD = Path(__file__).resolve().parents[1] / "fixtures" / "crds" / "noderesourcetopologies.yaml"


def free_devices(obj: Mapping[str, Any] | None, resource: str = "nvidia.com/gpu") -> int:
    """The free devices of ``resource`` an NRT object says, over all its zones (-1: no object)."""
    if obj is None:
        return -1
    return sum(v[2] for (_, r), v in zone_resources(obj).items() if r == resource)


async def pod_resources_answers(
    socket: str,
) -> tuple[api_pb2.ListPodResourcesResponse, api_pb2.AllocatableResourcesResponse]:
    """``List`` and ``GetAllocatableResources`` of the pod resources API on ``socket``."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        listed = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=10)
        allocatable = await stub.GetAllocatableResources(
            api_pb2.AllocatableResourcesRequest(), timeout=10
        )
        return listed, allocatable


class KubeletPods:
    """The kubelet's pods behind a pod resources API on a socket of its own (``server``, started
    by its user): an admitted pod's containers get their devices from the device manager, a
    deleted pod gives them back."""

    def __init__(self, devices: DeviceManager) -> None:
        self.pods: list[Pod] = []
        self._devices = devices
        self.server = PodResourcesServer(
            os.path.join(new_dir(), "pod-resources"), lambda: list(self.pods), devices
        )

    async def admit(self, pod: Pod) -> None:
        self.pods.append(pod)
        for container in pod.all_containers:
            await self._devices.allocate_container(pod, container)

    def delete(self, pod: Pod) -> None:
        self.pods.remove(pod)
        self._devices.remove_pods([pod.uid])


def nrt_crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD.read_text())
    return doc


def validate_nrt(obj: Mapping[str, Any]) -> None:
    """Raise jsonschema's ValidationError unless ``obj`` fits the CRD's v1alpha2 schema."""
    (version,) = nrt_crd()["spec"]["versions"]
    assert obj["apiVersion"] == f"topology.node.k8s.io/{version['name']}"
    jsonschema.validate(dict(obj), version["schema"]["openAPIV3Schema"])


def expected_counts(
    listed: api_pb2.ListPodResourcesResponse,
    allocatable: api_pb2.AllocatableResourcesResponse,
    resources: set[str],
) -> tuple[Counter[tuple[str, str]], Counter[tuple[str, str]]]:
    """(zone, resource) -> allocatable, and -> held, of the device ``resources``, by the NUMA
    node the kubelet lists each allocatable device on."""
    zone_of: dict[tuple[str, str], str] = {}
    alloc: Counter[tuple[str, str]] = Counter()
    for entry in allocatable.devices:
        if entry.resource_name not in resources:
            continue
        (device,) = entry.device_ids
        zone = f"node-{entry.topology.nodes[0].ID}" if entry.topology.nodes else "node-0"
        zone_of[(entry.resource_name, device)] = zone
        alloc[(zone, entry.resource_name)] += 1
    held: Counter[tuple[str, str]] = Counter()
    seen = set()
    for pod in listed.pod_resources:
        for container in pod.containers:
            for entry in container.devices:
                for device in entry.device_ids:
                    key = (entry.resource_name, device)
                    if key in zone_of and key not in seen:
                        seen.add(key)
                        held[(zone_of[key], entry.resource_name)] += 1
    return alloc, held


def check_nrt(
    obj: Mapping[str, Any],
    listed: api_pb2.ListPodResourcesResponse,
    allocatable: api_pb2.AllocatableResourcesResponse,
    node_allocatable: Mapping[str, int],
    cpu_numa: Mapping[int, int] | None = None,
) -> None:
    """Every zone's available = allocatable - what podresources says is held, per device
    resource; the zones add up to the node's allocatable (``node_allocatable``: resource ->
    count, the device resources to check and ``cpu`` when exclusive CPUs are in play); with
    ``cpu_numa`` (CPU -> NUMA node), the same per zone for exclusive CPUs."""
    validate_nrt(obj)
    got = zone_resources(obj)
    devices = {r for r in node_allocatable if r != "cpu"}
    alloc, held = expected_counts(listed, allocatable, devices)
    for (zone, resource), (capacity, allocatable_n, available) in got.items():
        if resource in devices:
            assert allocatable_n == alloc[(zone, resource)], (zone, resource)
            assert available == allocatable_n - held[(zone, resource)], (zone, resource)
            assert capacity >= allocatable_n
    for resource, total in node_allocatable.items():
        zones = [v[1] for (_, r), v in got.items() if r == resource]
        assert sum(zones) == total, (resource, zones, total)
    if cpu_numa is not None and allocatable.cpu_ids:
        cpu_alloc = Counter(f"node-{cpu_numa[c]}" for c in allocatable.cpu_ids)
        cpu_held = Counter(
            f"node-{cpu_numa[c]}"
            for p in listed.pod_resources
            for container in p.containers
            for c in container.cpu_ids
        )
        for (zone, resource), (_, allocatable_n, available) in got.items():
            if resource == "cpu":
                assert allocatable_n == cpu_alloc[zone], zone
                assert available == allocatable_n - cpu_held[zone], zone
