"""Preferred allocation: which of the available GPUs a pod should get.

Pure functions over a :class:`~nvplugin.node.model.Topology`: no I/O, no NVML, no gRPC. One small
interface (:class:`Policy`); the policies are ``simple.py``, ``besteffort.py`` (answered by one of
the methods of ``methods/``) and ``mig.py``, each registered once in :data:`POLICIES` under the
name config files and ``--policy`` use. :func:`make_policy`, the one factory for whole GPUs and
MIG devices alike, does all precomputation once so requests never pay for it. The objective,
tie-breaks, empty answers and errors are those of docs/allocation.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from nvplugin.allocator.base import Allocation, AllocationError, Policy, check_request
from nvplugin.errors import InputError
from nvplugin.node.model import MigDevice, Topology

DEFAULT_BUDGET_S = 0.1
"""How long a best-effort request may search on a node no exact method answers quickly
(beyond 16 GPUs, not a few classes of interchangeable GPUs) before it answers with the best
group found (config ``nvplugin.allocationBudget``)."""


@dataclass(frozen=True, slots=True)
class Makers:
    """How a policy is made: over a node's GPUs (with the request time budget) and over a
    resource's MIG devices (positions in the list)."""

    gpus: Callable[[Topology, float], Policy]
    mig: Callable[[Topology, Sequence[MigDevice]], Policy]


def _best_effort(topology: Topology, budget_s: float) -> Policy:
    from nvplugin.allocator.besteffort import BestEffort

    return BestEffort(topology, budget_s=budget_s)


def _mig(topology: Topology, devices: Sequence[MigDevice]) -> Policy:
    from nvplugin.allocator.mig import MigPolicy

    return MigPolicy(topology, devices)


def _simple(topology: Topology, budget_s: float) -> Policy:
    from nvplugin.allocator.simple import Simple

    return Simple(len(topology))


def _simple_mig(topology: Topology, devices: Sequence[MigDevice]) -> Policy:
    from nvplugin.allocator.simple import Simple

    return Simple(len(devices))


POLICIES: Mapping[str, Makers] = {
    "best-effort": Makers(_best_effort, _mig),
    "simple": Makers(_simple, _simple_mig),
}
"""Every policy by the name config files and ``--policy`` spell; the first is the default. MIG
devices have no NVLink, so the names mean there what they can: ``best-effort`` is the MIG policy
(:mod:`nvplugin.allocator.mig`: one parent, one NUMA node, partly used parents first, the
tightest fit), ``simple`` the lowest positions first."""

POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)
"""The names of :data:`POLICIES`, in order (for choices: config, ``--policy``, the chart)."""


def check_policy_name(name: str) -> None:
    """Raise InputError naming ``name`` and the known policies unless it is one of them (cheap:
    callers check before any precomputation)."""
    if name not in POLICIES:
        raise InputError(f"unknown allocation policy {name!r}; have: {', '.join(POLICY_NAMES)}")


def make_policy(
    name: str,
    topology: Topology,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    mig_devices: Sequence[MigDevice] | None = None,
) -> Policy:
    """The named policy (:data:`POLICIES`) over ``topology``'s GPUs (GPU indices), or --
    ``mig_devices`` given -- over those MIG devices (positions in the list), with its start-up
    precomputation done."""
    check_policy_name(name)
    makers = POLICIES[name]
    if mig_devices is not None:
        return makers.mig(topology, mig_devices)
    return makers.gpus(topology, budget_s)


def explain_allocation(
    name: str,
    topology: Topology,
    available: Sequence[int],
    must_include: Sequence[int],
    size: int,
) -> Allocation:
    """The named policy's answer with its score, a best partition of ``available`` containing
    it and that partition's score (for best-effort: OPT). It always builds the best-effort
    policy (to score any policy's answer), so it is for the CLI, not for request paths."""
    from nvplugin.allocator.besteffort import BestEffort

    check_policy_name(name)
    request = check_request(len(topology), available, must_include, size)
    if request.impossible:  # every policy answers nothing: no tables needed to say why
        return Allocation(name, (), None, None, reason=request.impossible)
    best_effort = BestEffort(topology)
    if name == best_effort.name:
        return best_effort.solve(available, must_include, size)
    indices = make_policy(name, topology).allocate(available, must_include, size)
    return best_effort.evaluate(available, indices, name)


__all__ = [
    "DEFAULT_BUDGET_S",
    "POLICIES",
    "POLICY_NAMES",
    "Allocation",
    "AllocationError",
    "Makers",
    "Policy",
    "check_policy_name",
    "explain_allocation",
    "make_policy",
]
