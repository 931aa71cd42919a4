"""A one-container pod's admission put together from parts kept apart: the same fake kubelet
code as a :class:`~nvplugin.extender.judge.Judge`, but each piece worked out once for every
node that shares it.

In the kubelet's admission of one container the resources meet at one place only: the topology
manager's merge of their hints. Each device resource's hints come from its own devices, the
exclusive CPUs' from the CPUs; after the merge each resource is allocated from its own items
under the one merged hint. So a :class:`DevicePart` (one resource's devices, laid out as a
Judge lays them, with its own device manager) and a :class:`CpuPart` (the CPU manager over the
``cpu`` zones) answer hints per count and allocations per (count, hint), and the policy's merge
is kept per (policy, NUMA nodes, hint lists). Nodes whose states differ in one resource still
share the others' parts, where a Judge serves only nodes equal in every resource.

Only what this reasoning reaches is answered: one container, no init containers, the
``container`` scope (a one-container pod's pod scope is the same merge: the view's keys say
``container`` for it) or policy ``none``; None otherwise, and the caller admits the pod whole.
Every answer is held equal to a whole admission's by tests/extender/test_shortcuts.py.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from nvplugin.extender.judge import (
    CANDIDATE,
    LocalHintProvider,
    Needs,
    StateKey,
    Verdict,
    Zones,
    add_devices,
    as_candidate,
    cpu_manager,
    cpus_taken,
    devices_taken,
)
from nvplugin.fakekubelet.devicemanager.manager import DeviceManager
from nvplugin.fakekubelet.pods import CPU, Container, Pod
from nvplugin.fakekubelet.topologymanager import NumaInfo, StartupError, new_manager
from nvplugin.fakekubelet.topologymanager.options import POLICY_NONE, SCOPE_CONTAINER
from nvplugin.fakekubelet.topologymanager.policy import Policy, ProviderHints, TopologyHint
from nvplugin.fakekubelet.topologymanager.scope import (
    NO_AFFINITY,
    AdmissionError,
    AllocationError,
    PodAdmitResult,
    TopologyAffinityError,
)

Taken = tuple[tuple[int, int], ...]
"""(NUMA node, count) a part gives the container, by node."""

Outcome = Taken | PodAdmitResult
"""A part's allocation: what it took, or the rejection it raised."""

_MISSING = object()

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Hint:
    """The store a part's manager reads the merged hint from: one hint, set before each
    allocation (policy ``none`` stores none: the kubelet's zero hint)."""

    def __init__(self) -> None:
        self.hint = NO_AFFINITY

    def get_affinity(self, pod_uid: str, container_name: str) -> TopologyHint:
        return self.hint


class _Part:
    """A manager over one part's zones, its answers kept: hints per count, allocations per
    (count, merged hint). Subclasses say how to ask it, and how to give back what it took."""

    def __init__(self) -> None:
        self.store = _Hint()
        self._hints: dict[int, ProviderHints] = {}
        self._taken: dict[tuple[int, int | None], Outcome] = {}

    def _ask_hints(self, pod: Pod, container: Container) -> ProviderHints:
        raise NotImplementedError

    def _take(self, pod: Pod, container: Container) -> dict[int, int]:
        """Allocate for the container; how many items it took per NUMA node."""
        raise NotImplementedError

    def _give_back(self) -> None:
        raise NotImplementedError

    def hints(self, pod: Pod, container: Container, count: int) -> ProviderHints:
        found = self._hints.get(count, _MISSING)
        if found is _MISSING:
            found = self._hints[count] = self._ask_hints(pod, container)
        return found  # type: ignore[return-value]

    def allocate(self, pod: Pod, container: Container, count: int, hint: TopologyHint) -> Outcome:
        mask = hint.numa_affinity
        memo = (count, None if mask is None else mask.value)
        found = self._taken.get(memo)
        if found is not None:
            return found
        self.store.hint = hint
        try:
            found = tuple(sorted(self._take(pod, container).items()))
        except (AdmissionError, AllocationError) as exc:
            found = PodAdmitResult.from_error(exc)
        finally:
            self._give_back()
        self._taken[memo] = found
        return found


class DevicePart(_Part):
    """One device resource's zones with a device manager of their own."""

    def __init__(self, nodes: Sequence[int], resource: str, zones: Zones) -> None:
        super().__init__()
        self.resource = resource
        self.devices = DeviceManager(numa_nodes=nodes, store=self.store, quiet=True)
        self.zone_of = add_devices(self.devices, resource, zones)
        self.provider = LocalHintProvider(self.devices)

    def _ask_hints(self, pod: Pod, container: Container) -> ProviderHints:
        return self.provider.get_topology_hints(pod, container)

    def _take(self, pod: Pod, container: Container) -> dict[int, int]:
        self.provider.allocate(pod, container)
        return {node: n for (_, node), n in devices_taken(self.devices, self.zone_of).items()}

    def _give_back(self) -> None:
        self.devices.remove_pods([CANDIDATE])


class CpuPart(_Part):
    """The ``cpu`` zones with a CPU manager of their own (policy ``none`` without them)."""

    def __init__(self, nodes: Sequence[int], zones: Zones, policy: str) -> None:
        super().__init__()
        self.cpus = cpu_manager(nodes, zones, policy, self.store)

    def _ask_hints(self, pod: Pod, container: Container) -> ProviderHints:
        return self.cpus.get_topology_hints(pod, container)

    def _take(self, pod: Pod, container: Container) -> dict[int, int]:
        self.cpus.allocate(pod, container)
        return cpus_taken(self.cpus, (container,))

    def _give_back(self) -> None:
        self.cpus.remove_pod(CANDIDATE)


class _Lists:
    """Hint lists numbered by value, each list object hashed once: a part answers one list
    object per count for every node it serves, and hashing 255 hints per look-up would cost
    more than a merge. The table holds each list it has seen, so no identity is reused while
    it stands."""

    def __init__(self) -> None:
        self.by_value: dict[tuple[TopologyHint, ...], int] = {}
        self.by_id: dict[int, tuple[object, int]] = {}

    def __len__(self) -> int:
        return len(self.by_id)

    def clear(self) -> None:
        self.by_value.clear()
        self.by_id.clear()

    def key(self, hints: ProviderHints) -> object:
        """A provider's answer as a small hashable key: per resource, its list's number."""
        if hints is None:
            return None
        out = []
        for resource, found in hints.items():
            if found is None:
                out.append((resource, -1))
                continue
            known = self.by_id.get(id(found))
            if known is None:
                number = self.by_value.setdefault(tuple(found), len(self.by_value))
                known = self.by_id[id(found)] = (found, number)
            out.append((resource, known[1]))
        return tuple(out)


class Parts:
    """The parts by their own keys, and the policies' merges by hint lists (see module doc);
    every table bounded, the oldest entries dropped first."""

    def __init__(self, parts: int = 4096, merges: int = 65536) -> None:
        self._devices: dict[tuple[tuple[int, ...], str, Zones], DevicePart] = {}
        self._cpus: dict[tuple[tuple[int, ...], Zones, str], CpuPart] = {}
        self._policies: dict[tuple[str, tuple[int, ...]], Policy | StartupError] = {}
        self._lists = _Lists()
        self._candidate: tuple[Pod, Pod] | None = None
        self._merged: dict[tuple[object, ...], tuple[TopologyHint, bool]] = {}
        self._max_parts = parts
        self._max_merges = merges

    def _device(self, nodes: tuple[int, ...], resource: str, zones: Zones) -> DevicePart:
        key = (nodes, resource, zones)
        return _kept(self._devices, key, self._max_parts, lambda: DevicePart(*key))

    def _cpu(self, nodes: tuple[int, ...], zones: Zones, policy: str) -> CpuPart:
        key = (nodes, zones, policy)
        return _kept(self._cpus, key, self._max_parts, lambda: CpuPart(*key))

    def _policy(self, name: str, nodes: tuple[int, ...]) -> Policy | StartupError:
        found = self._policies.get((name, nodes))
        if found is None:
            if len(self._policies) >= self._max_parts:  # names come from NRT objects
                self._policies.clear()
            try:
                found = new_manager(NumaInfo(nodes), name, SCOPE_CONTAINER).policy
            except StartupError as exc:
                found = exc
            self._policies[(name, nodes)] = found
        return found

    def _merge(
        self, key: StateKey, policy: Policy, devices: ProviderHints, cpus: ProviderHints
    ) -> tuple[TopologyHint, bool]:
        # Lists of parts dropped stay numbered until here: as many as two tables of parts.
        if len(self._lists) >= 2 * self._max_parts or len(self._merged) >= self._max_merges:
            self._lists.clear()  # numbers are reused from here on: the merges go with them
            self._merged.clear()
        memo = (key.policy, key.nodes, self._lists.key(devices), self._lists.key(cpus))
        found = self._merged.get(memo)
        if found is None:
            found = self._merged[memo] = policy.merge([devices, cpus])
        return found

    def _as_candidate(self, pod: Pod) -> Pod:
        """``pod`` under the UID every judged pod is admitted under, made once per pod."""
        last = self._candidate
        if last is None or last[0] is not pod:
            last = self._candidate = (pod, as_candidate(pod))
        return last[1]

    def verdict(self, key: StateKey, pod: Pod, needs: Needs) -> Verdict | None:
        """The admission's verdict for a one-container ``pod`` on ``key``'s state, ``needs``
        what it takes; None where these parts do not reach (see module doc)."""
        if len(pod.containers) != 1 or pod.init_containers:
            return None
        policy: Policy | StartupError | None = None
        if key.policy != POLICY_NONE:
            if key.scope != SCOPE_CONTAINER:
                return None
            policy = self._policy(key.policy, key.nodes)
            if isinstance(policy, StartupError):
                return None  # the whole admission says why the kubelet would not start
        (container,) = pod.containers
        pod = self._as_candidate(pod)
        counts = dict(needs)
        devices: list[DevicePart] = []
        cpu_zones: Zones = ()
        for resource, zones in key.resources:
            if resource == CPU:
                cpu_zones = zones
            else:
                devices.append(self._device(key.nodes, resource, zones))
        cpus = self._cpu(key.nodes, cpu_zones, key.cpu_policy)
        cpu_count = counts.get(CPU, 0) if cpus.cpus.policy == "static" else 0
        hint = NO_AFFINITY
        if policy is not None:
            device_hints: dict[str, object] = {}
            for part in devices:
                found = part.hints(pod, container, counts.get(part.resource, 0))
                if found:
                    device_hints.update(found)
            cpu_hints = cpus.hints(pod, container, cpu_count)
            hint, admit = self._merge(key, policy, device_hints, cpu_hints)  # type: ignore[arg-type]
            if not admit:
                return _rejected(PodAdmitResult.from_error(TopologyAffinityError()))
        taken: dict[tuple[str, int], int] = {}
        for part in devices:
            outcome = part.allocate(pod, container, counts.get(part.resource, 0), hint)
            if isinstance(outcome, PodAdmitResult):
                return _rejected(outcome)
            for node, n in outcome:
                taken[(part.resource, node)] = n
        outcome = cpus.allocate(pod, container, cpu_count, hint)
        if isinstance(outcome, PodAdmitResult):
            return _rejected(outcome)
        for node, n in outcome:
            taken[(CPU, node)] = n
        return Verdict(True, taken=tuple((r, n, c) for (r, n), c in sorted(taken.items())))


def _kept(table: dict[K, V], key: K, limit: int, make: Callable[[], V]) -> V:
    """``table[key]``, made if missing; the oldest entry dropped when ``limit`` are kept."""
    found = table.get(key)
    if found is None:
        if len(table) >= limit:
            del table[next(iter(table))]
        found = table[key] = make()
    return found


def _rejected(result: PodAdmitResult) -> Verdict:
    return Verdict(False, result.reason, result.message)
