"""What a method of the best-effort policy is: the :class:`Method` interface, the :class:`Best`
answer, the shares of a request's time budget, and what every method shares (the answers no
search is needed for, the start-up warm-up).

The policy (:mod:`nvplugin.allocator.besteffort`) offers the node to its methods in turn, once,
and keeps the first that takes it; each request then goes to that method alone. A method that
cannot answer exactly within the request's budget raises OutOfTime, and the policy answers with
the local search instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import NamedTuple, Protocol, TypeVar

from nvplugin.allocator.base import Allocation, Request, check_request
from nvplugin.node.model import Topology

POLICY = "best-effort"
"""The policy the methods answer for: the name their explanations carry."""

EXACT_SHARE = 0.75
"""Share of a request's budget an exact method that may run long (the branch search, tables
built per request) has before it gives up and the local search takes over: the deadline a
method is given."""

SEARCH_SHARE = 0.9
"""Share of a request's budget after which the local search stops: what follows it and a thread
switch under load must fit in the budget too."""

NO_DEADLINE = math.inf
"""For start-up, and for scoring a group another policy chose."""


class Best(NamedTuple):
    """A method's answer: the group (GPU indices, ascending), and its own score and OPT where the
    method knows them. (A named tuple, not a frozen dataclass: made once per request, it costs a
    third of one.)"""

    group: tuple[int, ...]
    score: int | None = None
    opt: int | None = None


class Method(Protocol):
    """One way to answer docs/allocation.md's objective on the nodes it takes.

    A method is built by its class's ``build(topology)``, which returns it with its start-up
    work done, or None when the method does not take the node. It is read-only after that
    (threads share it; a memo it keeps only gains true facts). Requests reach it validated and
    possible (:class:`~nvplugin.allocator.base.Request`)."""

    @property
    def name(self) -> str:
        """What ``BestEffort.method``, the bench and the debug lines call it."""
        ...

    @property
    def nbytes(self) -> int:
        """Memory held by what start-up prepared."""
        ...

    def best(self, request: Request, deadline: float) -> Best:
        """The answer; raises OutOfTime where it cannot answer exactly by ``deadline``
        (``time.monotonic()``)."""
        ...

    def explain(
        self, request: Request, group: tuple[int, ...], deadline: float, *, contenders: bool
    ) -> Allocation:
        """``group`` (the method's answer, or any group holding the must-include GPUs) with its
        score, the best partition of the available GPUs that holds it and that partition's
        score; with ``contenders``, every group of a partition scoring OPT (``group`` is then
        the method's answer: the first). Raises OutOfTime as :meth:`best` does."""
        ...


Maker = Callable[[Topology], Method | None]
"""A method's ``build``."""

M = TypeVar("M", bound=Method)


def warmed(method: M, gpus: int, sizes: Iterable[int]) -> M:
    """``method`` after one request of each of ``sizes`` with every GPU free (none on a node of
    no GPUs): every code path runs once at start-up (numpy's first calls are slower) and caches
    fill, so the kubelet's first request is as fast as the rest."""
    if gpus:
        for size in sizes:
            method.best(check_request(gpus, range(gpus), [], size), NO_DEADLINE)
    return method


def forced(request: Request) -> tuple[int, ...] | None:
    """The answer when no search is needed: every available GPU, exactly the must-include
    ones, or at size 1 (every partition scores 0) the must-include GPU or the lowest one."""
    if request.size == len(request.available):
        return request.available
    if request.size == len(request.must_include):
        return request.must_include
    if request.size == 1:
        return request.available[:1]
    return None
