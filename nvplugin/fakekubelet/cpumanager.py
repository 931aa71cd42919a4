"""The fake kubelet's CPU manager (the kubelet's ``cpumanager``): policies ``none`` and
``static``, as a topology-manager hint provider.

``static`` gives exclusive CPUs to containers of Guaranteed pods whose CPU request is a whole
number; everything else runs in the shared pool. Hints come from the node's CPU layout through
the same generator as device hints
(:func:`~nvplugin.fakekubelet.topologymanager.hints.generate_hints`), over the CPUs that are
free for exclusive use: the shared pool minus the reserved CPUs (``--reserved-cpus``; without it,
as many CPUs as the CPU reservation of ``--system-reserved`` and ``--kube-reserved`` rounded up,
chosen as exclusive CPUs are: ``cpu=2`` on dgx-1 reserves CPUs 0 and 40).
Allocation follows the kubelet's static policy: CPUs inside the stored NUMA affinity first, then
the rest; each of those takes whole units before pieces, the way the kubelet's "NUMA packed"
accumulator does:

1. whole NUMA nodes / sockets (the bigger of the two first) while the request needs at least
   that many CPUs;
2. whole physical cores while it needs at least a core;
3. single hardware threads, filling partly used cores first.

At each step candidates are taken in the kubelet's packing order: fewest free CPUs first, then
lowest id. An init container's CPUs can be reused by the pod's later containers (not by
restartable sidecars, which keep running). :meth:`CpuManager.remove_pod` returns a pod's CPUs.

Known simplification: the kubelet's optional static-policy options (full-pcpus-only,
distribute-cpus-across-numa, align-by-socket, ...) are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal

from nvplugin.errors import InputError, shortened
from nvplugin.fakekubelet.pods import CPU, QOS_GUARANTEED, Container, Pod
from nvplugin.fakekubelet.quantity import int64_value
from nvplugin.fakekubelet.topologymanager.bitmask import BitMask
from nvplugin.fakekubelet.topologymanager.hints import generate_hints
from nvplugin.fakekubelet.topologymanager.options import StartupError
from nvplugin.fakekubelet.topologymanager.policy import ProviderHints
from nvplugin.fakekubelet.topologymanager.scope import AllocationError, Store
from nvplugin.node.model import Cpu, CpuLayout, Topology, format_cpu_list
from nvplugin.node.model import parse_cpu_list as parse_linux_cpu_list

POLICY_NONE = "none"
POLICY_STATIC = "static"
POLICIES = (POLICY_NONE, POLICY_STATIC)


def parse_cpu_list(text: str, what: str = "CPU list") -> tuple[int, ...]:
    """Linux cpuset list syntax (``"0-3,8"``) -> sorted CPU ids; InputError names ``what``."""
    try:
        return parse_linux_cpu_list(text)
    except ValueError as exc:
        raise InputError(f'{what}: invalid CPU list "{text}": {exc}') from None


def reserved_cpus(text: str, layout: CpuLayout) -> tuple[int, ...]:
    """``--reserved-cpus`` as the kubelet reads it when it starts (whatever the CPU manager
    policy): a CPU list, every CPU of it online; StartupError with the kubelet's text."""
    cpus = parse_cpu_list(text, "--reserved-cpus")
    _require_online(cpus, layout, text)
    return cpus


def _require_online(cpus: Iterable[int], layout: CpuLayout, shown: str) -> None:
    online = {c.id for c in layout.cpus}
    if not set(cpus) <= online:
        raise StartupError(
            f"reserved-cpus: {shortened(shown, 200)} is not a subset of online-cpus: "
            f"{format_cpu_list(online)}"
        )


def reserved_cpu_count(reserved_cpu: Decimal) -> int:
    """How many CPUs the kubelet's static policy reserves for a CPU reservation (the sum of
    ``--system-reserved`` and ``--kube-reserved``): its milli-value, rounded up to whole CPUs."""
    return -(-int64_value(reserved_cpu, -3) // 1000)


class CpuManager:
    """The CPU manager: a :class:`~nvplugin.fakekubelet.topologymanager.scope.HintProvider`.

    ``store`` is the topology manager (for the merged hint during :meth:`allocate`).
    """

    def __init__(
        self,
        policy: str,
        layout: CpuLayout,
        store: Store,
        reserved: Iterable[int] = (),
        numa_nodes: Sequence[int] | None = None,
        reserved_count: int = 0,
    ) -> None:
        """``reserved``: ``--reserved-cpus``; without it the static policy reserves
        ``reserved_count`` CPUs, the CPU reservation of ``--system-reserved`` and
        ``--kube-reserved`` rounded up (:func:`reserved_cpu_count`)."""
        if policy not in POLICIES:
            raise StartupError(f'unknown policy: "{policy}"')
        self.policy = policy
        self.layout = layout
        self.store = store
        self._by_id = {c.id: c for c in layout.cpus}
        # Each unit's size in the layout, per unit kind (NUMA node, socket, core).
        self._unit_sizes: dict[Callable[[Cpu], tuple[int, ...]], dict[tuple[int, ...], int]] = {}
        self.numa_nodes = tuple(
            numa_nodes if numa_nodes is not None else sorted({c.numa_node for c in layout.cpus})
        )
        self.reserved = frozenset(reserved)
        _require_online(self.reserved, layout, format_cpu_list(self.reserved))
        if policy == POLICY_STATIC and not self.reserved:
            if reserved_count <= 0:
                raise StartupError(
                    "[cpumanager] unable to determine reserved CPU resources for static policy"
                )
            # The kubelet's static policy without --reserved-cpus: the reserved count taken
            # from all CPUs the way exclusive CPUs are (so 2 is the first core's two threads).
            try:
                self.reserved = self.take_by_topology(self._by_id, reserved_count)
            except AllocationError:
                raise StartupError(
                    "new static policy error: [cpumanager] unable to reserve the required "
                    f"amount of CPUs (size of  did not equal {reserved_count})"
                ) from None
        self._numa_of = {c.id: (c.numa_node,) for c in layout.cpus}
        self._shared: set[int] = set(self._by_id)
        self._assigned: dict[str, dict[str, frozenset[int]]] = {}
        self._reuse: dict[str, frozenset[int]] = {}

    @classmethod
    def from_topology(
        cls,
        policy: str,
        topology: Topology,
        store: Store,
        reserved: Iterable[int] = (),
        reserved_count: int = 0,
    ) -> CpuManager:
        return cls(policy, topology.cpus, store, reserved, topology.numa_nodes, reserved_count)

    # --- state ---
    def shared_pool(self) -> tuple[int, ...]:
        """CPUs not given to any container exclusively (reserved ones included)."""
        return tuple(sorted(self._shared))

    def available(self) -> frozenset[int]:
        """CPUs free for exclusive use: the shared pool minus the reserved CPUs."""
        return frozenset(self._shared - self.reserved)

    def cpus(self, pod_uid: str, container_name: str) -> tuple[int, ...]:
        """The container's exclusive CPUs, ascending (empty: it runs in the shared pool)."""
        return tuple(sorted(self._assigned.get(pod_uid, {}).get(container_name, ())))

    def remove_pod(self, pod_uid: str) -> None:
        """Give the pod's exclusive CPUs back to the shared pool."""
        for cpus in self._assigned.pop(pod_uid, {}).values():
            self._shared |= cpus
        self._reuse.pop(pod_uid, None)

    def restore(self, pod_uid: str, container_name: str, cpus: Iterable[int]) -> None:
        """Record CPUs a container already holds exclusively, as the kubelet's start restores
        them from its state file: for whoever rebuilds a node's state from outside."""
        taken = frozenset(cpus)
        self._assigned.setdefault(pod_uid, {})[container_name] = taken
        self._shared -= taken

    # --- requests ---
    def guaranteed_cpus(self, pod: Pod, container: Container) -> int:
        """Exclusive CPUs the container gets: its whole CPU request in a Guaranteed pod, else 0."""
        if self.policy != POLICY_STATIC or pod.qos_class != QOS_GUARANTEED:
            return 0
        quantity = container.requests.get(CPU)
        # The kubelet's test (Value()*1000 == MilliValue()) is the API server's integer test.
        count = None if quantity is None else quantity.whole_number
        return count or 0

    def pod_guaranteed_cpus(self, pod: Pod) -> int:
        """The pod-scope count: long-running containers' sum vs the largest init container."""
        init_peak = restartable = 0
        for c in pod.init_containers:
            if CPU not in c.requests:
                continue
            n = self.guaranteed_cpus(pod, c)
            if c.restartable:
                restartable += n
            elif restartable + n > init_peak:
                init_peak = restartable + n
        apps = sum(self.guaranteed_cpus(pod, c) for c in pod.containers if CPU in c.requests)
        return max(init_peak, apps + restartable)

    # --- HintProvider ---
    def _hints(self, available: Iterable[int], reusable: Iterable[int], n: int) -> ProviderHints:
        return {CPU: generate_hints(available, reusable, n, self._numa_of, self.numa_nodes)}

    def get_topology_hints(self, pod: Pod, container: Container) -> ProviderHints:
        requested = self.guaranteed_cpus(pod, container)
        if requested == 0:
            return None
        allocated = self._assigned.get(pod.uid, {}).get(container.name)
        if allocated is not None:
            if len(allocated) != requested:
                return {CPU: []}
            return self._hints(allocated, (), requested)
        return self._hints(self.available(), self._reuse.get(pod.uid, frozenset()), requested)

    def get_pod_topology_hints(self, pod: Pod) -> ProviderHints:
        requested = self.pod_guaranteed_cpus(pod)
        if requested == 0:
            return None
        assigned: set[int] = set()
        for c in pod.all_containers:
            allocated = self._assigned.get(pod.uid, {}).get(c.name)
            if allocated is not None:
                if len(allocated) != self.guaranteed_cpus(pod, c):
                    return {CPU: []}
                assigned |= allocated
        if len(assigned) == requested:
            return self._hints(assigned, (), requested)
        reusable = self._reuse.get(pod.uid, frozenset()) | assigned
        return self._hints(self.available(), reusable, requested)

    def allocate(self, pod: Pod, container: Container) -> None:
        n = self.guaranteed_cpus(pod, container)
        if n == 0:
            return
        existing = self._assigned.get(pod.uid, {}).get(container.name)
        if existing is not None:
            self._update_reuse(pod, container, existing)
            return
        affinity = self.store.get_affinity(pod.uid, container.name).numa_affinity
        cpus = self._allocate_cpus(n, affinity, self._reuse.get(pod.uid, frozenset()))
        self._assigned.setdefault(pod.uid, {})[container.name] = cpus
        self._update_reuse(pod, container, cpus)

    def _allocate_cpus(
        self, n: int, affinity: BitMask | None, reusable: frozenset[int]
    ) -> frozenset[int]:
        allocatable = self.available() | reusable
        result: set[int] = set()
        if affinity is not None:
            aligned = {c for c in allocatable if affinity.is_set(self._by_id[c].numa_node)}
            result |= self.take_by_topology(aligned, min(n, len(aligned)))
        result |= self.take_by_topology(allocatable - result, n - len(result))
        self._shared -= result
        return frozenset(result)

    def _update_reuse(self, pod: Pod, container: Container, cpus: frozenset[int]) -> None:
        # The kubelet keeps reusable CPUs for one pod at a time: the pod being admitted.
        for uid in [u for u in self._reuse if u != pod.uid]:
            del self._reuse[uid]
        reuse = self._reuse.get(pod.uid, frozenset())
        if container.init and not container.restartable:
            self._reuse[pod.uid] = reuse | cpus
        else:
            self._reuse[pod.uid] = reuse - cpus

    # --- the kubelet's "NUMA packed" CPU accumulator ---
    def take_by_topology(self, available: Iterable[int], n: int) -> frozenset[int]:
        """Choose ``n`` CPUs out of ``available``; AllocationError if there are too few."""
        free = set(available)
        if n <= 0:
            return frozenset()
        if len(free) < n:
            raise AllocationError(
                "not enough cpus available to satisfy request: "
                f"requested={n}, available={len(free)}"
            )
        taken: set[int] = set()

        def take(cpus: Iterable[int]) -> None:
            cpus = set(cpus)
            taken.update(cpus)
            free.difference_update(cpus)

        def need() -> int:
            return n - len(taken)

        sockets_bigger = len({c.numa_node for c in self.layout.cpus}) > self.layout.sockets
        levels: list[Callable[[Cpu], tuple[int, ...]]] = [_numa_of, _socket_of]
        if sockets_bigger:
            levels.reverse()
        for level in levels:
            # A request smaller than every unit of the level takes none of them: not ranked.
            if need() >= min(self._sizes(level).values()):
                for unit in self._free_units(free, level):
                    if need() >= len(unit):
                        take(unit)
            if need() == 0:
                return frozenset(taken)
        if need() >= min(self._sizes(_core_of).values()):
            for core in self._free_units(free, _core_of, levels):
                if need() >= len(core):
                    take(core)
        if need() == 0:
            return frozenset(taken)
        for core in self._sorted_groups(free, [*levels, _core_of]):
            for cpu in core:
                take((cpu,))
                if need() == 0:
                    return frozenset(taken)
        raise AllocationError("failed to allocate cpus")

    def _sizes(self, key: Callable[[Cpu], tuple[int, ...]]) -> dict[tuple[int, ...], int]:
        """Each unit's size (CPUs in the layout), for one kind of unit."""
        sizes = self._unit_sizes.get(key)
        if sizes is None:
            sizes = self._unit_sizes[key] = {}
            for c in self.layout.cpus:
                sizes[key(c)] = sizes.get(key(c), 0) + 1
        return sizes

    def _free_units(
        self,
        free: set[int],
        key: Callable[[Cpu], tuple[int, ...]],
        outer: Sequence[Callable[[Cpu], tuple[int, ...]]] = (),
    ) -> list[tuple[int, ...]]:
        """Units (by ``key``) whose every CPU is free, in packing order."""
        sizes = self._sizes(key)
        groups = self._sorted_groups(free, [*outer, key])
        return [g for g in groups if len(g) == sizes[key(self._by_id[g[0]])]]

    def _sorted_groups(
        self, free: set[int], levels: Sequence[Callable[[Cpu], tuple[int, ...]]]
    ) -> list[tuple[int, ...]]:
        """Free CPUs grouped by the last level, ordered level by level: fewest free CPUs first,
        then lowest id (the kubelet's sort), CPUs ascending inside a group."""
        cpus = [self._by_id[i] for i in sorted(free)]

        def order(group: list[Cpu], depth: int) -> list[tuple[int, ...]]:
            if depth == len(levels):
                return [tuple(c.id for c in group)]
            key = levels[depth]
            buckets: dict[tuple[int, ...], list[Cpu]] = {}
            for c in group:
                buckets.setdefault(key(c), []).append(c)
            ranked = sorted(buckets.items(), key=lambda kv: (len(kv[1]), kv[0]))
            out: list[tuple[int, ...]] = []
            for _, members in ranked:
                out.extend(order(members, depth + 1))
            return out

        return order(cpus, 0) if cpus else []


def _numa_of(cpu: Cpu) -> tuple[int, ...]:
    return (cpu.numa_node,)


def _socket_of(cpu: Cpu) -> tuple[int, ...]:
    return (cpu.socket,)


def _core_of(cpu: Cpu) -> tuple[int, ...]:
    return (cpu.socket, cpu.core)
