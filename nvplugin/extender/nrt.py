"""A NodeResourceTopology object (``topology.node.k8s.io/v1alpha2``) as the extender reads it:
the node's kubelet settings from its attributes, and per NUMA zone each resource's capacity,
allocatable and available counts (docs/scheduler-extender.md).

Pure and strict: an object that does not say what the extender needs is an :class:`InputError`
naming the object, the field and the value, never a guess. Quantities are read with the fake
kubelet's quantity parser, so ``"64"``, ``"1k"`` and ``"128Gi"`` mean what they mean to the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from nvplugin.errors import InputError, show
from nvplugin.fakekubelet.quantity import parse_quantity

API_GROUP = "topology.node.k8s.io"
API_VERSION = "v1alpha2"
KIND = "NodeResourceTopology"
PLURAL = "noderesourcetopologies"

TOPOLOGY_POLICY = "topologyManagerPolicy"
TOPOLOGY_SCOPE = "topologyManagerScope"
CPU_POLICY = "cpuManagerPolicy"
MEMORY_POLICY = "memoryManagerPolicy"
FINGERPRINT = "nodeTopologyPodsFingerprint"
BEST_GROUPS_PREFIX = "nvplugin.io/best-groups."

TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
SCOPES = ("container", "pod")
CPU_POLICIES = ("none", "static")
MEMORY_POLICIES = ("None", "Static")

MAX_ZONES = 64
"""More NUMA zones than any machine has: an object with more is refused, not iterated."""
MAX_RESOURCES = 256
"""Resources a zone may list."""
MAX_DEVICES = 4096
"""Devices of one resource in one zone (replicas of shared GPUs included)."""
MAX_CPUS = 4096
"""CPUs of one zone."""


@dataclass(frozen=True, slots=True)
class Counts:
    """One resource in one zone."""

    capacity: int
    allocatable: int
    available: int


@dataclass(frozen=True, slots=True)
class BestGroup:
    """The best group of ``size`` free GPUs the node can still form: its score and whether
    every pair in it is NVLinked (the ``nvplugin.io/best-groups.<R>`` attribute)."""

    size: int
    score: int
    nvlinked: bool


@dataclass(frozen=True)
class NodeTopology:
    """What one NRT object says: kubelet settings, zones, per-zone counts, best groups."""

    name: str
    policy: str
    scope: str
    cpu_policy: str | None
    """None: the object does not say (devices are judged alone)."""
    memory_policy: str | None
    zones: tuple[int, ...]
    """NUMA node ids, ascending."""
    resources: Mapping[str, Mapping[int, Counts]]
    """Resource -> NUMA node -> counts (``cpu`` and ``memory`` included when listed)."""
    best_groups: Mapping[str, tuple[BestGroup, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    fingerprint: str | None = None
    generation: int | None = None
    resource_version: str | None = None

    def free(self, resource: str) -> int:
        """Available count of ``resource`` over every zone."""
        return sum(c.available for c in self.resources.get(resource, {}).values())


def _where(name: str, path: str) -> str:
    return f"NodeResourceTopology {name!r}: {path}"


def _count(name: str, path: str, value: Any, limit: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"{_where(name, path)}: {show(value)} is not a quantity")
    try:
        quantity = parse_quantity(str(value))
    except ValueError as exc:
        raise InputError(f"{_where(name, path)}: {exc}") from None
    number = quantity.int_value
    if number < 0:
        raise InputError(f"{_where(name, path)}: {show(value)} is negative")
    if limit is not None and number > limit:
        raise InputError(f"{_where(name, path)}: {show(value)} is more than {limit}")
    return number


def _zone_id(name: str, path: str, zone_name: Any) -> int:
    if not isinstance(zone_name, str) or not zone_name.startswith("node-"):
        raise InputError(f'{_where(name, path)}: {show(zone_name)} is not "node-<id>"')
    digits = zone_name[len("node-") :]
    if not digits.isdigit() or len(digits) > 4:
        raise InputError(f'{_where(name, path)}: {show(zone_name)} is not "node-<id>"')
    return int(digits)


def _choice(name: str, key: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise InputError(
            f"{_where(name, 'attributes')}: {key} {show(value)} is not one of {', '.join(allowed)}"
        )


def parse_best_groups(name: str, key: str, text: str) -> tuple[BestGroup, ...]:
    """``k:score:nvlinked,...`` -> groups by size (InputError naming the attribute)."""
    groups = []
    for item in text.split(","):
        if not item.strip():
            continue
        parts = item.strip().split(":")
        if len(parts) != 3 or not all(p.isdigit() and len(p) <= 12 for p in parts):
            raise InputError(
                f"{_where(name, 'attributes')}: {key}: {show(item)} is not k:score:nvlinked"
            )
        size, score, linked = (int(p) for p in parts)
        groups.append(BestGroup(size, score, linked == 1))
        if len(groups) > 64:
            raise InputError(f"{_where(name, 'attributes')}: {key}: more than 64 groups")
    return tuple(sorted(groups, key=lambda g: g.size))


def parse_nrt(obj: Any) -> NodeTopology:
    """An NRT object (parsed JSON) -> :class:`NodeTopology`; InputError on anything off."""
    if not isinstance(obj, dict):
        raise InputError(f"NodeResourceTopology: not a mapping ({show(obj)})")
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name or len(name) > 253:
        raise InputError(f"NodeResourceTopology: metadata.name: {show(name)} is not a node name")
    assert isinstance(metadata, dict)
    generation = metadata.get("generation")
    version = metadata.get("resourceVersion")
    attributes: dict[str, str] = {}
    raw_attributes = obj.get("attributes") or []
    if not isinstance(raw_attributes, list):
        raise InputError(f"{_where(name, 'attributes')}: not a list")
    for i, attribute in enumerate(raw_attributes[:1024]):
        if not isinstance(attribute, dict):
            raise InputError(f"{_where(name, f'attributes[{i}]')}: not a mapping")
        key, value = attribute.get("name"), attribute.get("value")
        if not isinstance(key, str) or not isinstance(value, str):
            raise InputError(f"{_where(name, f'attributes[{i}]')}: name and value must be strings")
        attributes[key] = value
    policy = attributes.get(TOPOLOGY_POLICY)
    scope = attributes.get(TOPOLOGY_SCOPE)
    if policy is None:
        raise InputError(f"{_where(name, 'attributes')}: no {TOPOLOGY_POLICY}")
    _choice(name, TOPOLOGY_POLICY, policy, TOPOLOGY_POLICIES)
    _choice(name, TOPOLOGY_SCOPE, scope, SCOPES)
    cpu_policy = attributes.get(CPU_POLICY)
    memory_policy = attributes.get(MEMORY_POLICY)
    _choice(name, CPU_POLICY, cpu_policy, CPU_POLICIES)
    _choice(name, MEMORY_POLICY, memory_policy, MEMORY_POLICIES)
    best = {
        key[len(BEST_GROUPS_PREFIX) :]: parse_best_groups(name, key, value)
        for key, value in attributes.items()
        if key.startswith(BEST_GROUPS_PREFIX)
    }

    zones = obj.get("zones") or []
    if not isinstance(zones, list):
        raise InputError(f"{_where(name, 'zones')}: not a list")
    if len(zones) > MAX_ZONES:
        raise InputError(f"{_where(name, 'zones')}: {len(zones)} zones, more than {MAX_ZONES}")
    resources: dict[str, dict[int, Counts]] = {}
    ids: list[int] = []
    for i, zone in enumerate(zones):
        path = f"zones[{i}]"
        if not isinstance(zone, dict):
            raise InputError(f"{_where(name, path)}: not a mapping")
        if zone.get("type") != "Node":
            continue  # NRT allows other zone types; NUMA nodes are what the kubelet aligns
        numa = _zone_id(name, f"{path}.name", zone.get("name"))
        if numa in ids:
            raise InputError(f"{_where(name, f'{path}.name')}: node-{numa} listed twice")
        ids.append(numa)
        listed = zone.get("resources") or []
        if not isinstance(listed, list) or len(listed) > MAX_RESOURCES:
            raise InputError(f"{_where(name, f'{path}.resources')}: not a list of resources")
        for j, resource in enumerate(listed):
            rpath = f"{path}.resources[{j}]"
            if not isinstance(resource, dict) or not isinstance(resource.get("name"), str):
                raise InputError(f"{_where(name, rpath)}: not a named resource")
            rname = resource["name"]
            limit = None if rname == "memory" else MAX_CPUS if rname == "cpu" else MAX_DEVICES
            counts = Counts(
                *(
                    _count(name, f"{rpath}.{key}", resource.get(key), limit)
                    for key in ("capacity", "allocatable", "available")
                )
            )
            if not counts.available <= counts.allocatable <= counts.capacity:
                raise InputError(
                    f"{_where(name, rpath)} ({rname}): available <= allocatable <= capacity "
                    f"does not hold ({counts.available}, {counts.allocatable}, {counts.capacity})"
                )
            resources.setdefault(rname, {})[numa] = counts
    return NodeTopology(
        name=name,
        policy=policy,
        scope=scope or "container",
        cpu_policy=cpu_policy,
        memory_policy=memory_policy,
        zones=tuple(sorted(ids)),
        resources=MappingProxyType(
            {r: MappingProxyType(dict(sorted(z.items()))) for r, z in sorted(resources.items())}
        ),
        best_groups=MappingProxyType(best),
        fingerprint=attributes.get(FINGERPRINT),
        generation=generation if isinstance(generation, int) else None,
        resource_version=version if isinstance(version, str) else None,
    )
