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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from nvplugin.fakekubelet.pods import CPU, MEMORY, Pod, is_extended_resource, pod_requests
from nvplugin.fakekubelet.quantity import INT64_MAX, int64_value, parse_quantity
from nvplugin.fakekubelet.topologymanager import PodAdmitResult, StartupError

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


EVICTION_HARD_MEMORY_TEXT = "100Mi"


def validate_node_allocatable(
    reservations: Mapping[str, Sequence[str]], cpus: int, memory: int | None
) -> None:
    """The kubelet's check when its container manager starts: no resource may reserve more than
    the node's capacity. ``reservations``: per resource, the quantities as given, in the kubelet's
    order (``--system-reserved``, ``--kube-reserved``; ``--reserved-cpus`` replaces their CPU by
    its count); the hard eviction threshold adds to memory, as in the kubelet. ``memory``: the
    node's bytes (None: unknown, not checked).

    StartupError with the kubelet's text. The kubelet prints each quantity with Go's ``%v`` of a
    ``resource.Quantity`` value, which shows its fields (``{{644349952000 0} {<nil>}  BinarySI}``)
    rather than ``600Gi``; that is restated here for quantities the kubelet holds as a 64-bit
    amount (any reservation a flag can give a node), else the quantity is shown as a number. The
    kubelet lists several offending resources in its map's random order; here cpu, then memory.
    """
    capacity = {CPU: (Decimal(cpus), _go_fields(cpus * 1000, -3, "DecimalSI"))}
    if memory is not None:
        capacity[MEMORY] = (Decimal(memory), _go_fields(memory, 0, "BinarySI"))
    errors = []
    for name, (value, shown) in capacity.items():
        texts = list(reservations.get(name, ()))
        if name == MEMORY:
            texts.append(EVICTION_HARD_MEMORY_TEXT)
        total, fields = _go_sum(texts)
        if total > value:
            errors.append(
                f'Resource "{name}" has a reservation of {fields} but capacity of {shown}. '
                "Expected capacity >= reservation."
            )
    if errors:
        raise StartupError(f"invalid Node Allocatable configuration. {' '.join(errors)}")


_GO_QUANTITY = re.compile(r"([0-9]*)(?:\.([0-9]*))?([a-zA-Z]*)([+-]?[0-9]*)")
_GO_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_GO_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


def _go_fields(value: int, scale: int, form: str) -> str:
    """Go's ``%v`` of a ``resource.Quantity`` held as a 64-bit amount, with no cached text."""
    return f"{{{{{value} {scale}}} {{<nil>}}  {form}}}"


def _go_amount(text: str) -> tuple[int, int, str] | None:
    """(value, scale, format) of a non-negative quantity as apimachinery's ``ParseQuantity``
    holds it when it fits its 64-bit fast path; None when it would hold it as a big decimal."""
    match = _GO_QUANTITY.fullmatch(text.strip())
    if match is None:
        return None
    whole, fraction, unit, exponent_text = match.groups(default="")
    if unit in ("e", "E") and exponent_text:
        form, exponent = "DecimalExponent", int(exponent_text)
    elif unit in _GO_DECIMAL and not exponent_text:
        form, exponent = "DecimalSI", _GO_DECIMAL[unit]
    elif unit in _GO_BINARY and not exponent_text:
        form, exponent = "BinarySI", _GO_BINARY[unit]
    else:
        return None
    digits = whole + fraction
    if not digits:
        return None
    if form == "BinarySI":
        if fraction or 15 - len(whole) - int(exponent * 3 / 10) - 1 < 0:
            return None
        value, scale = int(whole) << exponent, 0
    else:
        scale = exponent - len(fraction)
        if 18 - len(digits) < 0 or scale < -9:
            return None
        value = int(digits)
    return (value, scale, form) if value <= INT64_MAX else None


def _go_sum(texts: Sequence[str]) -> tuple[Decimal, str]:
    """The exact sum of the quantities, and Go's ``%v`` of the kubelet's sum of them (a zero
    ``DecimalSI`` quantity to which each is added: the format of the first non-zero one, the
    scale of the finest)."""
    total = Decimal(0)
    value, scale, form = 0, 0, "DecimalSI"
    exact = True
    for text in texts:
        total += parse_quantity(text.strip()).value
        amount = _go_amount(text)
        if amount is None:
            exact = False
            continue
        v, s, f = amount
        if v == 0:
            continue
        if value == 0:
            value, scale, form = v, s, f
        elif s == scale:
            value += v
        else:
            low = min(s, scale)
            value = value * 10 ** (scale - low) + v * 10 ** (s - low)
            scale = low
        exact = exact and value <= INT64_MAX
    if not exact:
        return total, f"{total.normalize():f}"
    return total, _go_fields(value, scale, form)


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
