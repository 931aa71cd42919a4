"""The best-effort policy: the objective of docs/allocation.md, on any node.

NVIDIA's allocator enumerates every partition of the free GPUs; we never do. The topology is
fixed for the life of the process, so the policy offers it, once, to the methods of
:mod:`nvplugin.allocator.methods` in the order of :data:`METHODS` (the fastest exact method a node
can have first) and keeps the first that takes it. Every request goes to that method; one it
cannot answer exactly within the request's time budget gets the best partition the local search
finds instead, with a debug line saying what is not proven.

There is no answer cache: a never-seen request is as fast as a repeated one. Every method is
read-only after start-up, so one policy serves concurrent requests from several threads.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from nvplugin.allocator.base import Allocation, OutOfTime, Request, check_request
from nvplugin.allocator.methods.base import (
    EXACT_SHARE,
    NO_DEADLINE,
    POLICY,
    SEARCH_SHARE,
    Maker,
    Method,
    forced,
)
from nvplugin.log import get_logger
from nvplugin.node.model import Topology

# Each method's module is imported when the node is offered to it: a node the small tables or the
# tree take never loads numpy (every method after them uses it).


def _small_tables() -> Maker:
    from nvplugin.allocator.methods.smalltables import SmallTableMethod

    return SmallTableMethod.build


def _tree() -> Maker:
    from nvplugin.allocator.methods.tree import TreeMethod

    return TreeMethod.build


def _branch() -> Maker:
    from nvplugin.allocator.methods.branch import BranchMethod

    return BranchMethod.build


def _tables() -> Maker:
    from nvplugin.allocator.methods.tables import TableMethod

    return TableMethod.build


def _search() -> Maker:
    from nvplugin.allocator.methods.search import SearchMethod

    return SearchMethod.build


METHODS: dict[str, Callable[[], Maker]] = {
    "small-tables": _small_tables,
    "tree": _tree,
    "branch": _branch,
    "tables": _tables,
    "search": _search,
}
"""The methods, in the order a node is offered to them, each by its module's ``build``:

- ``small-tables`` (method ``tables``, up to 8 GPUs): the subset tables in plain Python;
- ``tree`` (9-16 GPUs whose classes of twins hang from a tree: a DGX-2, PCIe servers): the
  dynamic programme over the tree's subtrees, plain Python;
- ``branch`` (up to 32 GPUs in up to eight classes of twins): the branch and bound over count
  vectors;
- ``tables`` (up to 16 GPUs): the subset tables, built at start-up;
- ``search`` (every node): tables over the available GPUs where they are few, else nothing
  exact (the local search answers).
"""


class BestEffort:
    """Best-effort allocation over one topology (see the module docstring)."""

    name = POLICY

    def __init__(
        self,
        topology: Topology,
        *,
        budget_s: float = 0.1,
        methods: Sequence[str] = tuple(METHODS),
    ) -> None:
        """``budget_s``: how long a request may take before the local search answers it;
        ``methods``: the keys of :data:`METHODS` to offer the node to, in this order (fewer to
        try the others on a node: a benchmark's comparisons, tests)."""
        self._topology = topology
        self._budget_s = budget_s
        self._method = _first(topology, methods)

    @property
    def topology(self) -> Topology:
        return self._topology

    @property
    def budget_s(self) -> float:
        return self._budget_s

    @property
    def method(self) -> str:
        """The name of the method that took the node: ``tables``, ``tree``, ``branch`` or
        ``search``."""
        return self._method.name

    @property
    def table_bytes(self) -> int:
        """Memory held by what start-up prepared (tables, count vectors; 0 for ``search``)."""
        return self._method.nbytes

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        request = check_request(len(self._topology), available, must_include, size)
        if request.impossible:
            return []
        started = time.monotonic()
        try:
            return list(self._method.best(request, started + self._budget_s * EXACT_SHARE).group)
        except OutOfTime:
            return list(self._in_time(request, started, explain=False).indices)

    def solve(self, available: Sequence[int], must_include: Sequence[int], size: int) -> Allocation:
        """Like :meth:`allocate`, with the group's score, OPT, a best partition and the
        contenders."""
        request = check_request(len(self._topology), available, must_include, size)
        if request.impossible:
            return Allocation(self.name, (), None, None, reason=request.impossible)
        started = time.monotonic()
        try:
            group = self._method.best(request, started + self._budget_s * EXACT_SHARE).group
            # A deadline of its own: a method may build again what the answer needed.
            deadline = time.monotonic() + self._budget_s * EXACT_SHARE
            return self._method.explain(request, group, deadline, contenders=True)
        except OutOfTime:
            return self._in_time(request, started, explain=True)

    def evaluate(self, available: Sequence[int], group: Sequence[int], policy: str) -> Allocation:
        """Score a group another policy chose: its own score and the best partition of
        ``available`` that contains it as a full group (``partition_score``; beyond the reach
        of the node's exact method, the best one the local search finds in the budget)."""
        request = check_request(len(self._topology), available, group, len(group))
        if request.impossible:
            return Allocation(policy, (), None, None, reason=request.impossible)
        try:
            answer = self._method.explain(
                request, request.must_include, NO_DEADLINE, contenders=False
            )
        except OutOfTime:
            from nvplugin.allocator.methods.search import best_found

            deadline = time.monotonic() + self._budget_s
            answer = best_found(self._topology.scores, request, deadline, fixed=True)
        return dataclasses.replace(answer, policy=policy)

    def _in_time(self, request: Request, started: float, *, explain: bool) -> Allocation:
        """The local search's answer by the search share of the budget from ``started``, with a
        debug line saying what is not proven."""
        group = forced(request)
        if group is not None and not explain:
            return Allocation(self.name, group, None, None)
        from nvplugin.allocator.methods.search import best_found

        scores = self._topology.scores
        deadline = started + self._budget_s * SEARCH_SHARE
        if group is not None:  # the answer is known; only its partition is searched for
            fixed = check_request(len(self._topology), request.available, group, request.size)
            return best_found(scores, fixed, deadline, fixed=True)
        answer = best_found(scores, request, deadline, fixed=False)
        gap = (answer.bound or 0) - (answer.partition_score or 0)
        get_logger("nvplugin.allocator").debug(
            # A partition that meets the bound is optimal, but another optimal partition may
            # hold a group of a higher own score: only the group is then unproven.
            "preferred allocation not proven optimal"
            if gap
            else "preferred allocation from an optimal partition; group not proven the best",
            method=self.method,
            size=request.size,
            available=len(request.available),
            budget_s=self._budget_s,
            partition_score=answer.partition_score,
            bound=answer.bound,
            gap=gap,
        )
        return answer


def _first(topology: Topology, methods: Sequence[str]) -> Method:
    """The first of ``methods`` (keys of :data:`METHODS`) that takes ``topology``."""
    for key in methods:
        method = METHODS[key]()(topology)
        if method is not None:
            return method
    raise ValueError(f"none of the methods {', '.join(methods)} takes node {topology.name}")
