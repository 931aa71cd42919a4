"""The kubelet's admission of one pod on a node whose free state is an NRT object's: the fake
kubelet's own topology manager, device manager and CPU manager (the code behind ``nvplugin
admit``), built over devices and CPUs laid out from the NRT zones.

Each resource of a zone becomes that many devices on that NUMA node: ``capacity - allocatable``
of them unhealthy, ``allocatable - available`` held by another pod (restored as the kubelet
restores its checkpoint), the rest free. Exclusive CPUs the same way (one CPU per core, a socket
per NUMA node; the zone's ``capacity - allocatable`` are the reserved CPUs). The devices' plugin
is a local stand-in that offers no preferred allocation and answers Allocate at once: which
device of a zone a container gets does not change a verdict, only how many of each zone.

A :class:`Judge` is built once per distinct free state (:func:`state_key`) and admits any number
of pods, each rolled back afterwards, as the kubelet rolls back a rejected pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from nvplugin.api import HEALTHY
from nvplugin.api.v1beta1 import api_pb2
from nvplugin.fakekubelet.cpumanager import CpuManager
from nvplugin.fakekubelet.devicemanager.endpoint import (
    DeviceInfo,
    DevicePluginError,
    DevicesCallback,
    EndCallback,
    Endpoint,
    PluginOptions,
)
from nvplugin.fakekubelet.devicemanager.manager import DeviceManager
from nvplugin.fakekubelet.pods import CPU, Container, Pod
from nvplugin.fakekubelet.topologymanager import Manager, NumaInfo, new_manager
from nvplugin.fakekubelet.topologymanager.options import (
    DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
    POLICY_RESTRICTED,
    POLICY_SINGLE_NUMA_NODE,
    SCOPES,
)
from nvplugin.fakekubelet.topologymanager.policy import ProviderHints
from nvplugin.fakekubelet.topologymanager.scope import (
    MESSAGE_TOPOLOGY_AFFINITY,
    REASON_TOPOLOGY_AFFINITY,
    AllocationError,
    Store,
)
from nvplugin.node.model import Cpu, CpuLayout

HOLDER = "nvplugin-extender/held-by-others"
"""The pod UID the devices and CPUs other pods hold are restored under."""
CANDIDATE = "nvplugin-extender/candidate"
"""The UID every judged pod is admitted under (verdicts do not depend on it)."""

Zones = tuple[tuple[int, int, int, int], ...]
"""One resource's counts: (NUMA node, capacity, allocatable, available) per zone, by node."""


@dataclass(frozen=True, slots=True)
class StateKey:
    """Everything a verdict depends on: settings, NUMA nodes, and the counts of the resources
    the pod asks for (``cpu`` only when exclusive CPUs matter)."""

    policy: str
    scope: str
    cpu_policy: str
    nodes: tuple[int, ...]
    resources: tuple[tuple[str, Zones], ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The kubelet's answer, and where the pod's devices and exclusive CPUs would go."""

    admit: bool
    reason: str | None = None
    message: str | None = None
    taken: tuple[tuple[str, int, int], ...] = ()
    """(resource, NUMA node, count) the pod would take; ``cpu`` for exclusive CPUs."""

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        """NUMA nodes the pod's devices and exclusive CPUs would span."""
        return tuple(sorted({node for _, node, n in self.taken if n}))

    @property
    def text(self) -> str:
        """The kubelet's rejection as an event shows it: ``<reason>: <message>``."""
        return f"{self.reason}: {self.message}" if not self.admit else ""


class LocalPlugin(Endpoint):
    """A device plugin that lives in this process: it lists the devices it was given, offers
    no preferred allocation and answers every Allocate with an empty response."""

    def __init__(self, resource: str, devices: Sequence[DeviceInfo]) -> None:
        # No channel: nothing is dialled (Endpoint's own __init__ wants one).
        self.resource = resource
        self.socket_path = f"local:{resource}"
        self.options = PluginOptions()
        self.registered_at = 0.0
        self._devices = tuple(devices)
        self._watching = False

    @property
    def alive(self) -> bool:
        return self._watching

    def start_watching(self, on_devices: DevicesCallback, on_end: EndCallback) -> None:
        self._watching = True
        on_devices(self, self._devices)

    async def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str] | None:
        return None

    async def allocate(self, device_ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        return api_pb2.ContainerAllocateResponse()

    async def pre_start_container(
        self, device_ids: Sequence[str], *, timeout_s: float = 0.0
    ) -> bool:
        return False

    async def close(self) -> None:
        self._watching = False


class LocalHintProvider:
    """The device manager as the topology manager's hint provider, called on this thread.

    The fake kubelet's own adapter (``DeviceHintProvider``) hops onto the device manager's event
    loop, or runs a fresh loop per allocation when there is none: a loop's start and stop cost
    more than the allocation. With :class:`LocalPlugin` nothing in an allocation ever waits, so
    its coroutine finishes on its first step, here.
    """

    def __init__(self, devices: DeviceManager) -> None:
        self.devices = devices

    def get_topology_hints(self, pod: Pod, container: Container) -> ProviderHints:
        return self.devices.container_hints(pod, container)

    def get_pod_topology_hints(self, pod: Pod) -> ProviderHints:
        return self.devices.pod_hints(pod)

    def allocate(self, pod: Pod, container: Container) -> None:
        coro = self.devices.allocate_container(pod, container)
        try:
            coro.send(None)
        except StopIteration:
            return
        except DevicePluginError as exc:
            raise AllocationError(str(exc)) from None
        coro.close()
        raise RuntimeError("a local allocation waited on something")


def device_id(resource: str, node: int, index: int) -> str:
    return f"{resource}/numa{node}/{index}"


def add_devices(devices: DeviceManager, resource: str, zones: Zones) -> dict[str, int]:
    """Lay ``resource``'s zones out as devices of a local plugin (see module doc); each
    device's NUMA node by ID."""
    infos: list[DeviceInfo] = []
    held: list[str] = []
    zone_of: dict[str, int] = {}
    for node, capacity, allocatable, available in zones:
        for i in range(capacity):
            ident = device_id(resource, node, i)
            zone_of[ident] = node
            healthy = i < allocatable
            infos.append(DeviceInfo(ident, HEALTHY if healthy else "Unhealthy", (node,)))
            if available <= i < allocatable:
                held.append(ident)
    devices.plugin_connected(LocalPlugin(resource, infos))
    if held:
        devices.restore_allocation(HOLDER, "c", resource, held)
    return zone_of


def cpu_manager(nodes: Sequence[int], zones: Zones, policy: str, store: Store) -> CpuManager:
    """The CPU manager over the ``cpu`` zones (see module doc); policy ``none`` without
    them."""
    cpus: list[Cpu] = []
    reserved: list[int] = []
    held: list[int] = []
    ident = 0
    for node, capacity, allocatable, available in zones:
        for i in range(capacity):
            cpus.append(Cpu(ident, node, ident, node))
            if i >= allocatable:
                reserved.append(ident)
            elif i >= available:
                held.append(ident)
            ident += 1
    # The kubelet refuses static without reserved CPUs; an NRT whose zones reserve none
    # still describes a running static kubelet (its reservation lies outside the zones).
    manager = CpuManager("none", CpuLayout(tuple(cpus)), store, reserved, nodes)
    manager.policy = policy if zones else "none"
    if held:
        manager.restore(HOLDER, "c", held)
    return manager


def as_candidate(pod: Pod) -> Pod:
    """``pod`` under the UID every judged pod is admitted under."""
    return Pod(pod.name, CANDIDATE, pod.containers, pod.init_containers, pod.namespace)


def devices_taken(devices: DeviceManager, zone_of: Mapping[str, int]) -> dict[tuple[str, int], int]:
    """(resource, NUMA node) -> how many devices the candidate holds there."""
    taken: dict[tuple[str, int], int] = {}
    for entry in devices.allocations():
        if entry.pod_uid == CANDIDATE:
            for d in entry.device_ids:
                k = (entry.resource, zone_of[d])
                taken[k] = taken.get(k, 0) + 1
    return taken


def cpus_taken(cpus: CpuManager, containers: Iterable[Container]) -> dict[int, int]:
    """NUMA node -> how many exclusive CPUs the candidate's ``containers`` hold there."""
    taken: dict[int, int] = {}
    for c in containers:
        for cpu in cpus.cpus(CANDIDATE, c.name):
            node = cpus.layout.cpus[cpu].numa_node
            taken[node] = taken.get(node, 0) + 1
    return taken


class Judge:
    """The fake kubelet's managers over one free state (see module doc)."""

    def __init__(self, key: StateKey) -> None:
        """Raises :class:`StartupError` where the kubelet would not start with these settings
        (more NUMA nodes than the topology manager allows)."""
        self.key = key
        self.manager: Manager = new_manager(NumaInfo(key.nodes), key.policy, key.scope)
        self.devices = DeviceManager(numa_nodes=key.nodes, store=self.manager, quiet=True)
        self._zone_of: dict[str, int] = {}
        cpu_zones: Zones = ()
        for resource, zones in key.resources:
            if resource == CPU:
                cpu_zones = zones
                continue
            self._zone_of.update(add_devices(self.devices, resource, zones))
        self.cpus = cpu_manager(key.nodes, cpu_zones, key.cpu_policy, self.manager)
        self.manager.add_hint_provider(LocalHintProvider(self.devices))
        self.manager.add_hint_provider(self.cpus)

    def judge(self, pod: Pod) -> Verdict:
        """Admit ``pod`` (its UID replaced), report, and roll it back."""
        pod = as_candidate(pod)
        try:
            result = self.manager.admit(pod)
            taken: dict[tuple[str, int], int] = {}
            if result.admit:
                taken.update(devices_taken(self.devices, self._zone_of))
                for node, n in cpus_taken(self.cpus, pod.all_containers).items():
                    taken[(CPU, node)] = n
            return Verdict(
                result.admit,
                result.reason,
                result.message,
                tuple((r, n, c) for (r, n), c in sorted(taken.items())),
            )
        finally:
            self.manager.remove_pod(CANDIDATE)
            self.cpus.remove_pod(CANDIDATE)
            self.devices.remove_pods([CANDIDATE])


Needs = tuple[tuple[str, int], ...]
"""What one container takes of each resource: (resource, count), ``cpu`` for exclusive CPUs."""

NO_SINGLE_ZONE = Verdict(False, REASON_TOPOLOGY_AFFINITY, MESSAGE_TOPOLOGY_AFFINITY)


def one_node_verdict(key: StateKey, needs: Needs) -> Verdict | None:
    """A one-container pod's verdict under ``single-numa-node`` or ``restricted``, found
    without an admission; None where this reasoning does not reach (the admission decides).

    A resource's hint for a set of NUMA nodes exists when the set holds the request free (the
    container reuses nothing); it is preferred when no smaller set holds the request among all
    the resource's items, free or not. A merged hint is preferred only when every resource's
    hint is, on the same set, and both policies admit only a preferred one. Under
    ``single-numa-node`` only one-node hints take part; under ``restricted`` a preferred
    merge needs every resource's smallest holding set to be of one size, and only size one is
    decided here. Then the pod is admitted exactly when some NUMA node holds every request free;
    the narrowest such hint is the lowest node, from which the device manager and the static
    CPU policy take everything. Otherwise TopologyAffinityError, before anything is allocated.
    Left to the admission: settings the kubelet would not start with, a request of zero, a
    resource without a healthy device (the device manager may not know it), a resource of the
    key the pod does not take as counted here, ``restricted`` where no resource fits one node.
    """
    if (
        key.policy not in (POLICY_SINGLE_NUMA_NODE, POLICY_RESTRICTED)
        or key.scope not in SCOPES
        or len(key.nodes) > DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    ):
        return None
    zones = dict(key.resources)
    wanted = {r: n for r, n in needs if r in zones}
    if not wanted or any(r not in wanted for r in zones if r != CPU):
        return None
    fits = set(key.nodes)
    one_node = []  # per resource: does one NUMA node hold the request among all its items?
    for resource, count in wanted.items():
        found = zones[resource]
        if count <= 0:
            return None
        if resource != CPU and not any(allocatable for _, _, allocatable, _ in found):
            return None
        fits &= {node for node, _, _, free in found if free >= count}
        one_node.append(len(key.nodes) == 1 or any(c >= count for _, c, _, _ in found))
    if key.policy == POLICY_RESTRICTED:
        if not any(one_node):
            return None  # a preferred merge over wider sets: the admission's to find
        if not all(one_node):
            return NO_SINGLE_ZONE  # preferred sets of different sizes never merge preferred
    if not fits:
        return NO_SINGLE_ZONE
    node = min(fits)
    return Verdict(True, taken=tuple((r, node, n) for r, n in sorted(wanted.items())))


def zones_of(counts: Mapping[int, object]) -> Zones:
    """A resource's per-zone counts (``Counts`` objects) as a key's tuple."""
    out = []
    for node, c in sorted(counts.items()):
        out.append((node, c.capacity, c.allocatable, c.available))  # type: ignore[attr-defined]
    return tuple(out)


def pod_signature(pod: Pod) -> tuple[object, ...]:
    """What of a pod its admission depends on: each container's kind, requests and limits."""
    return tuple(
        (
            c.name,
            c.init,
            c.restart_policy,
            tuple(sorted((k, str(q)) for k, q in c.requests.items())),
            tuple(sorted((k, str(q)) for k, q in c.limits.items())),
        )
        for c in pod.all_containers
    )


def requested_resources(pod: Pod, known: Iterable[str]) -> tuple[str, ...]:
    """The device resources among ``known`` that the pod's containers ask for."""
    names = {r for c in pod.all_containers for r in c.limits}
    return tuple(sorted(names.intersection(known)))
