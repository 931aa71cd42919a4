"""The NodeResourceTopology object of a node, a pure function of what the kubelet's pod resources
API answers (``List`` and ``GetAllocatableResources``) and of nvplugin's plan and topology
(docs/topology.md is the contract with its readers):

- one zone of type ``Node`` per NUMA node, ``node-<id>``, with ``costs`` to every NUMA node (the
  SLIT distances, its own included, as NFD writes them);
- in each zone, every resource nvplugin serves (GPUs, MIG profiles, shared and renamed resources,
  each by its name) counted on its unit's NUMA node, as nvplugin knows it (a unit with no NUMA
  node is counted on the first zone): capacity = every device the plan serves there,
  allocatable = those the kubelet lists as allocatable (healthy), available = allocatable ones no
  container holds;
- ``cpu``: capacity = the zone's online CPUs, allocatable = the CPUs the kubelet can give
  exclusively there, available = those not held exclusively (exclusive allocations only, as NFD
  counts); under CPU manager policy ``none`` the kubelet gives none exclusively and lists none:
  then allocatable = available = capacity (no CPU is pinned);
- memory and hugepages, by the memory manager's type, only when the kubelet lists memory blocks
  (memory manager policy ``Static``): allocatable = the blocks there, available = less the blocks
  containers hold;
- top-level attributes: the kubelet's policies (``topologyManagerPolicy``,
  ``topologyManagerScope`` as NFD names them; ``cpuManagerPolicy``, ``memoryManagerPolicy`` as the
  kubelet does) where known, NFD's pod fingerprint, and one ``nvplugin.io/best-groups.<R>`` per
  resource of whole, unshared GPUs.

Everything comes out in a fixed order (zones by NUMA node, resources and attributes by name), so
that two builds from the same state are equal and the publisher writes only on a change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvplugin.api.podresources.v1 import api_pb2
from nvplugin.node.model import Topology
from nvplugin.nrt.bestgroups import BestGroups, attribute_name
from nvplugin.nrt.fingerprint import ATTRIBUTE as FINGERPRINT_ATTRIBUTE
from nvplugin.nrt.fingerprint import fingerprint
from nvplugin.rm.devices import Kind
from nvplugin.rm.plan import ResourcePlan

GROUP = "topology.node.k8s.io"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "NodeResourceTopology"
PLURAL = "noderesourcetopologies"
ZONE_TYPE = "Node"
CPU = "cpu"
MEMORY = "memory"

TOPOLOGY_MANAGER_POLICY = "topologyManagerPolicy"
TOPOLOGY_MANAGER_SCOPE = "topologyManagerScope"
CPU_MANAGER_POLICY = "cpuManagerPolicy"
MEMORY_MANAGER_POLICY = "memoryManagerPolicy"


@dataclass(frozen=True)
class KubeletPolicies:
    """The kubelet's settings a scheduler needs to replay its admission (None: not known, the
    attribute is left out). Values as the kubelet's config file spells them."""

    topology_manager_policy: str | None = None
    topology_manager_scope: str | None = None
    cpu_manager_policy: str | None = None
    memory_manager_policy: str | None = None

    def attributes(self) -> dict[str, str]:
        named = {
            TOPOLOGY_MANAGER_POLICY: self.topology_manager_policy,
            TOPOLOGY_MANAGER_SCOPE: self.topology_manager_scope,
            CPU_MANAGER_POLICY: self.cpu_manager_policy,
            MEMORY_MANAGER_POLICY: self.memory_manager_policy,
        }
        return {k: v for k, v in named.items() if v}


def zone_name(numa_node: int) -> str:
    return f"node-{numa_node}"


@dataclass
class _Count:
    capacity: int = 0
    allocatable: int = 0
    available: int = 0


def _first_node(entry: api_pb2.ContainerDevices | api_pb2.ContainerMemory) -> int | None:
    nodes = entry.topology.nodes if entry.HasField("topology") else ()
    return int(nodes[0].ID) if nodes else None


def _listed_devices(listed: api_pb2.ListPodResourcesResponse) -> dict[str, set[str]]:
    held: dict[str, set[str]] = {}
    for pod in listed.pod_resources:
        for container in pod.containers:
            for entry in container.devices:
                held.setdefault(entry.resource_name, set()).update(entry.device_ids)
    return held


def _device_counts(
    plan: ResourcePlan,
    zones: Sequence[int],
    listed: api_pb2.ListPodResourcesResponse,
    allocatable: api_pb2.AllocatableResourcesResponse,
) -> tuple[dict[tuple[int, str], _Count], dict[str, set[str]]]:
    """Counts per (zone, resource) of nvplugin's resources, and each resource's free device IDs."""
    home = zones[0]
    counts: dict[tuple[int, str], _Count] = {}
    numa: dict[str, dict[str, int]] = {}
    for served in plan.resources:
        where = numa.setdefault(served.name, {})
        for unit in served.devices:
            numa_node = unit.numa_node
            where[unit.id] = numa_node if numa_node is not None and numa_node in zones else home
        for node in zones:
            counts[(node, served.name)] = _Count()
        for node in where.values():
            counts[(node, served.name)].capacity += 1
    healthy: dict[str, set[str]] = {}
    for entry in allocatable.devices:
        where = numa.get(entry.resource_name, {})
        for device_id in entry.device_ids:
            if device_id in where:
                healthy.setdefault(entry.resource_name, set()).add(device_id)
    held = _listed_devices(listed)
    free: dict[str, set[str]] = {}
    for resource, ids in healthy.items():
        free[resource] = ids - held.get(resource, set())
        for device_id in ids:
            counts[(numa[resource][device_id], resource)].allocatable += 1
        for device_id in free[resource]:
            counts[(numa[resource][device_id], resource)].available += 1
    return counts, free


def _cpu_counts(
    topology: Topology,
    zones: Sequence[int],
    listed: api_pb2.ListPodResourcesResponse,
    allocatable: api_pb2.AllocatableResourcesResponse,
) -> dict[tuple[int, str], _Count]:
    node_of = {c.id: c.numa_node for c in topology.cpus.cpus}
    exclusive = set(allocatable.cpu_ids)
    held = {
        int(cpu)
        for pod in listed.pod_resources
        for container in pod.containers
        for cpu in container.cpu_ids
    }
    counts = {(node, CPU): _Count() for node in zones}
    for cpu, node in node_of.items():
        count = counts.get((node, CPU))
        if count is None:
            continue
        count.capacity += 1
        if not exclusive or cpu in exclusive:
            count.allocatable += 1
            if cpu not in held:
                count.available += 1
    return counts


def _memory_counts(
    zones: Sequence[int],
    listed: api_pb2.ListPodResourcesResponse,
    allocatable: api_pb2.AllocatableResourcesResponse,
) -> dict[tuple[int, str], _Count]:
    counts: dict[tuple[int, str], _Count] = {}
    for block in allocatable.memory:
        node = _first_node(block)
        if node is not None and node in zones:
            count = counts.setdefault((node, block.memory_type), _Count())
            count.capacity += block.size
            count.allocatable += block.size
            count.available += block.size
    for pod in listed.pod_resources:
        for container in pod.containers:
            for block in container.memory:
                where = _first_node(block)
                held = counts.get((where, block.memory_type)) if where is not None else None
                if held is not None:
                    held.available = max(0, held.available - block.size)
    return counts


def free_devices(
    plan: ResourcePlan,
    listed: api_pb2.ListPodResourcesResponse,
    allocatable: api_pb2.AllocatableResourcesResponse,
) -> dict[str, set[str]]:
    """Each served resource's free device IDs: allocatable (healthy) and held by no container."""
    ours = {served.name: {d.id for d in served.devices} for served in plan.resources}
    healthy: dict[str, set[str]] = {}
    for entry in allocatable.devices:
        known = ours.get(entry.resource_name, set())
        healthy.setdefault(entry.resource_name, set()).update(
            d for d in entry.device_ids if d in known
        )
    held = _listed_devices(listed)
    return {r: ids - held.get(r, set()) for r, ids in healthy.items() if r in ours}


def whole_gpu_free(plan: ResourcePlan, free: Mapping[str, set[str]]) -> dict[str, list[int]]:
    """Free GPU indices of each resource of whole, unshared GPUs."""
    out = {}
    for served in plan.resources:
        if served.kind is Kind.GPU and not served.replicas.shared:
            ids = free.get(served.name, set())
            out[served.name] = sorted(d.gpu.index for d in served.bases if d.id in ids)
    return out


def _attributes(items: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "value": items[name]} for name in sorted(items)]


def build_nrt(
    node_name: str,
    topology: Topology,
    plan: ResourcePlan,
    listed: api_pb2.ListPodResourcesResponse,
    allocatable: api_pb2.AllocatableResourcesResponse,
    policies: KubeletPolicies = KubeletPolicies(),
    best_groups: BestGroups | None = None,
) -> dict[str, Any]:
    """The NodeResourceTopology object for ``node_name`` (no owner: the publisher adds it)."""
    zones = topology.numa_nodes or (0,)
    counts, free = _device_counts(plan, zones, listed, allocatable)
    counts.update(_cpu_counts(topology, zones, listed, allocatable))
    counts.update(_memory_counts(zones, listed, allocatable))
    attributes = policies.attributes()
    attributes[FINGERPRINT_ATTRIBUTE] = fingerprint(
        (pod.namespace, pod.name) for pod in listed.pod_resources
    )
    if best_groups is not None:
        for resource, gpus in whole_gpu_free(plan, free).items():
            attributes[attribute_name(resource)] = best_groups.value(gpus)
    distances = topology.numa_distances
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": node_name},
        "attributes": _attributes(attributes),
        "zones": [
            {
                "name": zone_name(node),
                "type": ZONE_TYPE,
                "costs": [
                    {"name": zone_name(other), "value": _distance(distances, node, other)}
                    for other in zones
                ],
                "resources": _resources(
                    (name, count) for (where, name), count in counts.items() if where == node
                ),
            }
            for node in zones
        ],
    }


def _distance(distances: Sequence[Sequence[int]], a: int, b: int) -> int:
    if a < len(distances) and b < len(distances[a]):
        return int(distances[a][b])
    return 10 if a == b else 20


def _resources(items: Iterable[tuple[str, _Count]]) -> list[dict[str, str]]:
    return [
        {
            "name": name,
            "capacity": str(count.capacity),
            "allocatable": str(count.allocatable),
            "available": str(count.available),
        }
        for name, count in sorted(items)
    ]


def zone_resources(obj: Mapping[str, Any]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(zone, resource) -> (capacity, allocatable, available) of an NRT object (for readers and
    tests)."""
    return {
        (zone["name"], r["name"]): (int(r["capacity"]), int(r["allocatable"]), int(r["available"]))
        for zone in obj.get("zones", ())
        for r in zone.get("resources", ())
    }


def attributes_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return {a["name"]: a["value"] for a in obj.get("attributes", ())}


def idle_answers(
    topology: Topology, plan: ResourcePlan, cpu_manager_policy: str | None
) -> tuple[api_pb2.ListPodResourcesResponse, api_pb2.AllocatableResourcesResponse]:
    """What the kubelet would answer on an empty node where every served device is healthy:
    no pod; every device with its NUMA node; under the static CPU policy every CPU (the
    reserved ones are the kubelet's to know)."""
    devices = [
        api_pb2.ContainerDevices(
            resource_name=served.name,
            device_ids=[unit.id],
            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=unit.numa_node)])
            if unit.numa_node is not None
            else None,
        )
        for served in plan.resources
        for unit in served.devices
    ]
    cpus = [c.id for c in topology.cpus.cpus] if cpu_manager_policy == "static" else []
    return (
        api_pb2.ListPodResourcesResponse(),
        api_pb2.AllocatableResourcesResponse(devices=devices, cpu_ids=cpus),
    )
