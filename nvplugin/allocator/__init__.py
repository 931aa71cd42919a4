"""Preferred allocation: which of the available GPUs a pod should get.

Pure functions over a :class:`~nvplugin.node.model.Topology`: no I/O, no NVML, no gRPC. One small
interface (:class:`Policy`), one module per policy (``simple.py``, ``besteffort.py``, ``mig.py``),
made by name with :func:`make_policy` -- the one factory, for whole GPUs and MIG devices alike --
which does all precomputation once so requests never pay for it. The objective, tie-breaks,
empty answers and errors are those of docs/allocation.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvplugin.allocator.base import Allocation, AllocationError, Policy, check_request
from nvplugin.errors import InputError
from nvplugin.node.model import MigDevice, Topology

POLICY_NAMES: tuple[str, ...] = ("best-effort", "simple")
"""Policy names as config files and ``--policy`` spell them; the first is the default."""


def check_policy_name(name: str) -> None:
    """Raise InputError naming ``name`` and the known policies unless it is one of them (cheap:
    callers check before any precomputation)."""
    if name not in POLICY_NAMES:
        raise InputError(f"unknown allocation policy {name!r}; have: {', '.join(POLICY_NAMES)}")


DEFAULT_BUDGET_S = 0.1
"""How long a best-effort request may search on a node no exact method answers quickly
(beyond 16 GPUs, not a few classes of interchangeable GPUs) before it answers with the best
group found (config ``nvplugin.allocationBudget``)."""


def make_policy(
    name: str,
    topology: Topology,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    mig_devices: Sequence[MigDevice] | None = None,
) -> Policy:
    """The named policy over ``topology``'s GPUs (GPU indices), or -- ``mig_devices`` given --
    over those MIG devices (positions in the list), with its start-up precomputation done.

    MIG devices have no NVLink, so the names mean there what they can: ``best-effort`` is the
    MIG policy (:mod:`nvplugin.allocator.mig`: one parent, one NUMA node, partly used parents
    first, the tightest fit), ``simple`` the lowest positions first.
    """
    check_policy_name(name)
    from nvplugin.allocator.simple import Simple

    if mig_devices is not None:
        if name == "best-effort":
            from nvplugin.allocator.mig import MigPolicy

            return MigPolicy(topology, mig_devices)
        return Simple(len(mig_devices))
    if name == "best-effort":
        from nvplugin.allocator.besteffort import BestEffort

        return BestEffort(topology, budget_s=budget_s)
    if name == "simple":
        return Simple(len(topology))
    raise AssertionError(f"policy {name!r} is listed in POLICY_NAMES but not made here")


def explain_allocation(
    name: str,
    topology: Topology,
    available: Sequence[int],
    must_include: Sequence[int],
    size: int,
) -> Allocation:
    """The named policy's answer with its score, a best partition of ``available`` containing
    it and that partition's score (for best-effort: OPT). It always builds the best-effort
    tables (to score any policy's answer), so it is for the CLI, not for request paths."""
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
    "POLICY_NAMES",
    "Allocation",
    "AllocationError",
    "Policy",
    "check_policy_name",
    "explain_allocation",
    "make_policy",
]
