"""NodeResourceTopology objects written from a fake kubelet's state, independently of the
topology exporter: the oracle side of the extender's tests and the bench's nodes.

:func:`nrt_from_admission` reads an ``nvplugin admit`` run (:class:`Admission`) as NFD would
read a kubelet: per NUMA node each device resource's devices (capacity), healthy ones
(allocatable) and free ones (available); ``cpu`` counts exclusive allocations only.
:func:`nrt_object` writes one from plain per-zone counts; :func:`random_nrt` draws one.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from nvplugin.admit.admission import Admission


def nrt_object(
    name: str,
    zones: Mapping[int, Mapping[str, tuple[int, int, int]]],
    *,
    policy: str,
    scope: str = "container",
    cpu_policy: str | None = None,
    memory_policy: str | None = None,
    fingerprint: str | None = None,
    best_groups: Mapping[str, str] | None = None,
    distances: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
    """An NRT object: ``zones`` NUMA node -> resource -> (capacity, allocatable, available)."""
    attributes = [
        {"name": "topologyManagerPolicy", "value": policy},
        {"name": "topologyManagerScope", "value": scope},
    ]
    if cpu_policy is not None:
        attributes.append({"name": "cpuManagerPolicy", "value": cpu_policy})
    if memory_policy is not None:
        attributes.append({"name": "memoryManagerPolicy", "value": memory_policy})
    if fingerprint is not None:
        attributes.append({"name": "nodeTopologyPodsFingerprint", "value": fingerprint})
    for resource, value in (best_groups or {}).items():
        attributes.append({"name": f"nvplugin.io/best-groups.{resource}", "value": value})
    nodes = sorted(zones)
    out_zones = []
    for i, node in enumerate(nodes):
        costs = []
        for j, other in enumerate(nodes):
            d = distances[i][j] if distances is not None else (10 if i == j else 20)
            costs.append({"name": f"node-{other}", "value": d})
        out_zones.append(
            {
                "name": f"node-{node}",
                "type": "Node",
                "costs": costs,
                "resources": [
                    {
                        "name": r,
                        "capacity": str(c),
                        "allocatable": str(a),
                        "available": str(v),
                    }
                    for r, (c, a, v) in sorted(zones[node].items())
                ],
            }
        )
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "attributes": attributes,
        "zones": out_zones,
    }


def nrt_from_admission(name: str, admission: Admission) -> dict[str, Any]:
    """The NRT object of an admission run's node as it stands now (see module doc)."""
    settings = admission.settings
    topology = admission.topology
    zones: dict[int, dict[str, tuple[int, int, int]]] = {n: {} for n in topology.numa_nodes}
    dm = admission.devices
    for resource in dm.resources():
        healthy = dm.healthy_devices(resource)
        free = dm.available_devices(resource)
        per: dict[int, list[int]] = {}
        for device, nodes in dm.device_numa(resource).items():
            for node in nodes:
                row = per.setdefault(node, [0, 0, 0])
                row[0] += 1
                row[1] += device in healthy
                row[2] += device in free
        for node, (c, a, v) in per.items():
            zones.setdefault(node, {})[resource] = (c, a, v)
    cpus = admission.cpus
    available = cpus.available()
    for node in zones:
        ids = [c.id for c in topology.cpus.cpus if c.numa_node == node]
        allocatable = [i for i in ids if i not in cpus.reserved]
        zones[node]["cpu"] = (
            len(ids),
            len(allocatable),
            sum(1 for i in allocatable if i in available),
        )
    return nrt_object(
        name,
        zones,
        policy=settings.topology_manager_policy,
        scope=settings.topology_manager_scope,
        cpu_policy=settings.cpu_manager_policy,
        distances=topology.numa_distances,
    )


SHAPES = (
    # (NUMA nodes, GPUs per NUMA node, CPUs per NUMA node)
    (1, 4, 32),
    (2, 4, 32),
    (2, 2, 24),
    (4, 2, 16),
    (8, 1, 16),
)
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


def random_nrt(name: str, rng: random.Random, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    """A node of a random shape, settings and free state (the bench's and the end-to-end
    test's nodes)."""
    numa, gpus, cpus = rng.choice(SHAPES)
    zones: dict[int, dict[str, tuple[int, int, int]]] = {}
    for node in range(numa):
        free_gpus = rng.randint(0, gpus)
        reserved = 1 if node == 0 else 0
        free_cpus = rng.randint(0, cpus - reserved)
        zones[node] = {
            resource: (gpus, gpus, free_gpus),
            "cpu": (cpus, cpus - reserved, free_cpus),
        }
    free = sum(z[resource][2] for z in zones.values())
    best = ",".join(f"{k}:{0 if k == 1 else k * 40}:1" for k in range(1, min(8, free) + 1))
    return nrt_object(
        name,
        zones,
        policy=rng.choice(POLICIES),
        scope=rng.choice(("container", "pod")),
        cpu_policy=rng.choice(("none", "static")),
        fingerprint=f"pfp0v001{rng.getrandbits(48):012x}",
        best_groups={resource: best} if best else None,
    )


def pool_nrt(
    name: str, pool: int, rng: random.Random, resource: str = "nvidia.com/gpu"
) -> dict[str, Any]:
    """A node of node pool ``pool`` (its shape and kubelet settings fixed by the pool's number),
    in one of the free states a busy pool shows: each NUMA node's GPUs all, half or none free,
    its CPUs all, half, four or none free."""
    settings = random.Random(pool)
    numa, gpus, cpus = settings.choice(SHAPES)
    policy = settings.choice(POLICIES)
    scope = settings.choice(("container", "pod"))
    cpu_policy = settings.choice(("none", "static"))
    zones: dict[int, dict[str, tuple[int, int, int]]] = {}
    for node in range(numa):
        reserved = 1 if node == 0 else 0
        free_gpus = rng.choice((gpus, gpus // 2, 0))
        free_cpus = rng.choice((cpus - reserved, cpus // 2, 4, 0))
        zones[node] = {
            resource: (gpus, gpus, free_gpus),
            "cpu": (cpus, cpus - reserved, free_cpus),
        }
    return nrt_object(
        name,
        zones,
        policy=policy,
        scope=scope,
        cpu_policy=cpu_policy,
        fingerprint=f"pfp0v001{rng.getrandbits(48):012x}",
    )
