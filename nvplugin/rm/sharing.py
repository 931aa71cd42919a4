"""Sharing: one GPU advertised as several devices (replicas), and which replicas a pod gets.

The kubelet counts devices, not GPUs, so sharing a GPU between pods means advertising it several
times: GPU ``GPU-abc`` with 4 replicas is listed as ``GPU-abc::0`` .. ``GPU-abc::3``, each with
the GPU's NUMA node and the GPU's health (an Xid on the GPU makes all four Unhealthy). Allocate maps
the replicas a container got back to their GPUs, once each. Nothing isolates the pods sharing a
GPU (no memory limit, no compute share): that is what time-slicing is, and why
``failRequestsGreaterThanOne`` exists -- asking for two replicas of one GPU buys nothing.

GetPreferredAllocation over replicas has two policies. ``distributed`` (the default) spreads a
request over the GPUs with the fewest replicas in use, so pods sharing a node share it evenly;
``packed`` fills the busiest GPUs first, keeping whole GPUs free for later pods. A replica is "in
use" when the kubelet does not offer it as available. When an answer spans several GPUs and the
counts leave a choice, the GPUs are chosen by the node's allocation policy (best-effort: the best
linked set), so a multi-replica pod still gets well-connected GPUs.

MIG devices are time-sliced the same way (NVIDIA's config allows it): ``MIG-abc::0`` ..
``MIG-abc::3`` share the MIG device ``MIG-abc``, and "GPU" above reads "MIG device" (the
resource's allocation policy for MIG devices then chooses among them). Either way the replica
policy works on top of the resource's unit policy (:mod:`nvplugin.rm.policies`).

The config block is NVIDIA's ``sharing.timeSlicing`` (:mod:`nvplugin.config.layout` holds its
values), and the policy NVIDIA's ``flags.plugin.sharedDevicesAllocationPolicy``.

MPS (``sharing.mps``) replicates a GPU the same way -- the same IDs, health, NUMA node and
preferred allocation -- and differs in what a replica is worth: an MPS share, 1/replicas of the
GPU's memory and threads, enforced by the MPS control daemon the plugin runs for the resource
(:mod:`nvplugin.rm.mps` says what a container's Allocate response gets for its shares;
:mod:`nvplugin.plugin.mps` runs the daemon). So a strategy is a property of the replicas, not a
kind of device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from nvplugin.config.layout import ALLOCATIONS, MPS, SHARING_KEYS, TIME_SLICING
from nvplugin.rm.devices import Device, replica_id, sorted_replicas

Prefer = Callable[[Sequence[int], Sequence[int], int], list[int]]
"""The resource's unit policy (``Policy.allocate`` over GPU indices or MIG positions): available,
must-include, size."""


@dataclass(frozen=True)
class Replicas:
    """How one served resource shares its GPUs. ``count`` 1 = not shared (IDs are UUIDs);
    ``strategy``: time-slicing or MPS (:data:`~nvplugin.config.layout.SHARING_KEYS`)."""

    count: int = 1
    fail_requests_greater_than_one: bool = False
    allocation: str = ALLOCATIONS[0]
    strategy: str = TIME_SLICING

    @property
    def mps(self) -> bool:
        """Replicas are MPS shares."""
        return self.shared and self.strategy == MPS

    @property
    def shared(self) -> bool:
        return self.count > 1

    def devices(self, bases: Sequence[Device]) -> tuple[Device, ...]:
        """Every device advertised for ``bases`` (a resource's GPUs or MIG devices, in their
        order): the bases themselves, or each one's replicas in replica order."""
        if not self.shared:
            return tuple(bases)
        return tuple(
            replace(base, id=replica_id(base.id, n), replica=n)
            for base in bases
            for n in range(self.count)
        )

    def too_many(self, requested: int) -> str | None:
        """Why a container may not get ``requested`` replicas, or None."""
        if self.shared and self.fail_requests_greater_than_one and requested > 1:
            why = (
                "set it false to give a container several shares"
                if self.mps
                else "replicas of a time-sliced GPU add no memory or compute"
            )
            return (
                f"{requested} replicas requested, but {SHARING_KEYS[self.strategy]}."
                f"failRequestsGreaterThanOne allows at most 1 per container ({why})"
            )
        return None

    def prefer(
        self,
        prefer_gpus: Prefer,
        available: Sequence[Device],
        must_include: Sequence[Device],
        size: int,
    ) -> list[Device]:
        """Which ``size`` replicas to give, from validated ``available`` (distinct) and
        ``must_include`` (within available). Impossible requests get ``[]``, as for GPUs."""
        if size <= 0 or size > len(available) or len(must_include) > size:
            return []
        plan = _Plan(self.count, available, must_include, prefer_gpus)
        if self.allocation == "packed":
            plan.packed(size - len(must_include))
        else:
            plan.distributed(size - len(must_include))
        return plan.answer()


@dataclass
class _Plan:
    """Replica counts per GPU while an answer is built (see :meth:`Replicas.prefer`)."""

    count: int
    available: Sequence[Device]
    must_include: Sequence[Device]
    prefer_gpus: Prefer
    free: dict[int, list[Device]] = field(init=False)
    taken: dict[int, list[Device]] = field(init=False)

    def __post_init__(self) -> None:
        self.free = {}
        for device in sorted_replicas(self.available):
            self.free.setdefault(device.unit, []).append(device)
        self.taken = {}
        for device in self.must_include:
            self.free[device.unit].remove(device)
            self.taken.setdefault(device.unit, []).append(device)

    def load(self, gpu: int) -> int:
        """Replicas of ``gpu`` in use: not offered as available, plus taken for this answer."""
        offered = len(self.free.get(gpu, ())) + len(self.taken.get(gpu, ()))
        return self.count - offered + len(self.taken.get(gpu, ()))

    def spare(self) -> list[int]:
        return [gpu for gpu, devices in sorted(self.free.items()) if devices]

    def take(self, gpu: int) -> None:
        self.taken.setdefault(gpu, []).append(self.free[gpu].pop(0))

    def chosen(self) -> list[int]:
        return sorted(self.taken)

    def best_linked(self, candidates: list[int], wanted: int) -> list[int]:
        """``wanted`` of ``candidates`` that link best with each other and the GPUs already in
        the answer, by the node's policy; lowest indices if it has no answer."""
        if wanted >= len(candidates):
            return candidates
        chosen = self.chosen()
        pool = sorted(set(chosen) | set(candidates))
        picked = self.prefer_gpus(pool, chosen, len(chosen) + wanted)
        new = [gpu for gpu in picked if gpu not in chosen]
        return new if len(new) == wanted else candidates[:wanted]

    def distributed(self, remaining: int) -> None:
        """Water-filling: each round, the GPUs with the fewest replicas in use get one more.
        When a round has more tied GPUs than replicas left, GPUs not yet in the answer go first
        (spread), the best linked of them."""
        while remaining > 0:
            spare = self.spare()
            lowest = min(self.load(gpu) for gpu in spare)
            tied = [gpu for gpu in spare if self.load(gpu) == lowest]
            if remaining >= len(tied):
                picks = tied
            else:
                fresh = [gpu for gpu in tied if gpu not in self.taken]
                picks = self.best_linked(fresh, min(remaining, len(fresh)))
                picks += [gpu for gpu in tied if gpu in self.taken][: remaining - len(picks)]
            for gpu in picks:
                self.take(gpu)
            remaining -= len(picks)

    def packed(self, remaining: int) -> None:
        """Fill GPUs already in the answer first, then the GPU with the most replicas in use
        (ties: the best linked to the answer so far), until done."""
        while remaining > 0:
            spare = self.spare()
            inside = [gpu for gpu in spare if gpu in self.taken]
            if inside:
                gpu = max(inside, key=lambda g: (self.load(g), -g))
            else:
                highest = max(self.load(g) for g in spare)
                tied = [g for g in spare if self.load(g) == highest]
                gpu = self.best_linked(tied, 1)[0]
            while remaining > 0 and self.free[gpu]:
                self.take(gpu)
                remaining -= 1

    def answer(self) -> list[Device]:
        return [device for gpu in sorted(self.taken) for device in sorted_replicas(self.taken[gpu])]


NOT_SHARED = Replicas()
