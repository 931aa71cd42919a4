"""The kubelet's resource-fit admission (its ``lifecycle`` predicate admit handler): does the
node have room for the pod's CPU, memory and extended resources, and for one more pod?

The kubelet runs its admit handlers in order and stops at the first that refuses; the container
manager's (topology manager, device and CPU allocation) comes before this one
(docs/kubelet-behaviour.md#resource-fit). This one compares the pod's effective requests
(:func:`nvplugin.fakekubelet.pods.pod_requests`, ``spec.overhead`` included) with the node's
allocatable minus what the other active pods request (their overhead included), in the
scheduler's order -- pods, cpu, memory, then extended resources -- and reports the first that
does not fit, with the kubelet's reason (``OutOf<resource>``) and message. Extended resources the
node does not know at all are left out first, as the kubelet does (cluster-level resources are
unknown to nodes).

Known simplifications: ephemeral storage, hugepages and other node resources are not modelled
(their requests are not checked), nor node affinity, host ports or taints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from nvplugin.fakekubelet.pods import CPU, MEMORY, Pod, is_extended_resource, pod_requests
from nvplugin.fakekubelet.quantity import int64_value
from nvplugin.fakekubelet.topologymanager import PodAdmitResult

PODS = "pods"
DEFAULT_MAX_PODS = 110
"""The kubelet's ``--max-pods`` default."""
EVICTION_HARD_MEMORY = 100 * 1024 * 1024
"""The kubelet's default hard eviction threshold ``memory.available<100Mi``: node allocatable
memory leaves it out."""


@dataclass(frozen=True)
class NodeResources:
    """The node's allocatable as the kubelet's node object has it: milli-CPUs, bytes of memory
    (None: not known, not checked), pods, and each extended resource's count."""

    milli_cpu: int
    memory: int | None
    pods: int = DEFAULT_MAX_PODS
    extended: Mapping[str, int] = field(default_factory=dict)


def node_allocatable(
    cpus: int,
    memory: int | None,
    *,
    max_pods: int = DEFAULT_MAX_PODS,
    reserved: Mapping[str, Decimal] | None = None,
    reserved_cpus: int = 0,
    extended: Mapping[str, int] | None = None,
) -> NodeResources:
    """Allocatable = capacity - reservations: ``cpus`` logical CPUs, ``memory`` bytes (the
    machine's), ``reserved`` what ``--system-reserved`` and ``--kube-reserved`` add up to (per
    resource), the hard eviction threshold for memory. ``--reserved-cpus``, when given,
    replaces their CPU reservation with its CPU count, as the kubelet does."""
    reserved = dict(reserved or {})
    if reserved_cpus:
        reserved[CPU] = Decimal(reserved_cpus)
    milli_cpu = cpus * 1000 - int64_value(reserved.get(CPU, Decimal(0)), -3)
    allocatable_memory = None
    if memory is not None:
        allocatable_memory = memory - int64_value(reserved.get(MEMORY, Decimal(0)))
        allocatable_memory -= EVICTION_HARD_MEMORY
    return NodeResources(
        max(0, milli_cpu),
        None if allocatable_memory is None else max(0, allocatable_memory),
        max_pods,
        dict(extended or {}),
    )


@dataclass(frozen=True)
class _Shortfall:
    """What the kubelet calls an ``InsufficientResourceError``."""

    resource: str
    requested: int
    used: int
    capacity: int

    def result(self) -> PodAdmitResult:
        return PodAdmitResult(
            False,
            f"OutOf{self.resource}",
            f"Node didn't have enough resource: {self.resource}, requested: {self.requested}, "
            f"used: {self.used}, capacity: {self.capacity}",
        )


def resource_fit(pod: Pod, others: Sequence[Pod], node: NodeResources) -> PodAdmitResult:
    """Admit ``pod`` beside the active pods ``others`` on ``node``, or refuse it with the first
    resource that does not fit (see the module docstring)."""
    if len(others) + 1 > node.pods:
        return _Shortfall(PODS, 1, len(others), node.pods).result()
    wanted = _counted(pod_requests(pod, overhead=True), node)
    if not any(wanted.values()):
        return PodAdmitResult.admitted()
    used: dict[str, int] = {}
    for other in others:
        for name, value in _counted(pod_requests(other, overhead=True), node).items():
            used[name] = used.get(name, 0) + value
    checks = [(CPU, node.milli_cpu)]
    if node.memory is not None:
        checks.append((MEMORY, node.memory))
    checks += sorted(node.extended.items())
    for name, capacity in checks:
        requested = wanted.get(name, 0)
        if requested > 0 and requested > capacity - used.get(name, 0):
            return _Shortfall(name, requested, used.get(name, 0), capacity).result()
    return PodAdmitResult.admitted()


def _counted(requests: Mapping[str, Decimal], node: NodeResources) -> dict[str, int]:
    """The requests the fit compares, as the kubelet counts them: CPU in milli-CPUs, memory and
    extended resources whole (rounded up); extended resources the node does not have at all
    left out."""
    counted = {}
    for name, value in requests.items():
        if name == CPU:
            counted[name] = int64_value(value, -3)
        elif name == MEMORY or (is_extended_resource(name) and name in node.extended):
            counted[name] = int64_value(value)
    return counted
