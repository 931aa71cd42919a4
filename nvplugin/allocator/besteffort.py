"""The best-effort policy: the objective of docs/allocation.md, on any node.

NVIDIA's allocator enumerates every partition of the free GPUs (22 million for 16 GPUs at size
3). We never enumerate. The topology is fixed for the life of the process, so the policy picks,
once, the fastest method that is exact on it:

- ``tables`` (up to :data:`SMALL_GPUS` GPUs, and up to :data:`TABLE_GPUS` where neither ``tree``
  nor ``branch`` applies): the subset tables of :mod:`nvplugin.allocator.methods.tables` (every
  subset's score, and per group size the best partition score of every subset), built at
  start-up (~0.3 s and ~11 MiB of resident memory for 16 GPUs). A query is a few numpy
  operations over the at most C(16, 8) = 12870 candidate groups. Up to eight GPUs the same
  tables are plain Python (:mod:`nvplugin.allocator.methods.smalltables`: a few ms to build, tens of
  microseconds a query), and the process never loads numpy.
- ``tree`` (9 to 16 GPUs whose class scores nest as a PCIe tree's do: a DGX-2, 16-card PCIe
  servers): the dynamic programme over the tree's subtrees of
  :mod:`nvplugin.allocator.methods.tree`, exact, plain Python (no numpy: a DGX-2's ``serve`` holds
  ~14 MiB less than with ``branch``), nothing kept but the tree (start-up asks every size once, ~6
  ms, to fill the caches of how pieces match), well under a millisecond per query. ``--explain``
  builds the ``branch`` search on such a node for its partition and contenders (:meth:`_counter`).
- ``branch`` (9 to 32 GPUs in up to eight classes where ``tree`` does not apply: two to eight PCIe
  switches under one or two sockets beyond 16 GPUs, an NVSwitch fabric over only some of the GPUs):
  the branch and bound over count vectors of :mod:`nvplugin.allocator.methods.branch`, exact, a few
  ms per query, from a list of count vectors built at start-up (~20 ms and ~2 MiB for 16-24 GPUs,
  0.16-0.31 s and 9-18 MiB kept, 14-22 MiB at peak, for 32 in eight classes). It replaces the tables
  from 9 GPUs on where the scores do not nest. Should a request's search pass three quarters of its
  time budget, the local search below answers instead.
- ``search`` (every other node beyond 16 GPUs): a request with at most 16 available GPUs builds the
  tables over them for its one size, and answers exactly if that finishes within three quarters of
  the request's time budget; otherwise the local search of :mod:`nvplugin.allocator.methods.search`
  answers with the best partition it finds within the budget, and, unless its partition meets its
  upper bound on OPT, a debug line says the answer is not proven optimal, with the gap to that
  bound.

There is no answer cache: a never-seen request is as fast as a repeated one. Every method is
pure and read-only after start-up, so one policy serves concurrent requests from several threads.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from nvplugin.allocator.base import Allocation, OutOfTime, Request, check_request
from nvplugin.allocator.methods.smalltables import SMALL_GPUS, SmallTables
from nvplugin.allocator.methods.tree import TREE_GPUS, TreeSearch
from nvplugin.log import get_logger
from nvplugin.node.model import Topology

if TYPE_CHECKING:
    import numpy as np

    from nvplugin.allocator.methods.branch import BranchSearch, LexKey
    from nvplugin.allocator.methods.tables import Tables

# numpy and the modules built on it (every method but the small tables and the tree) are
# imported by the policies that use them: a node of at most SMALL_GPUS GPUs never loads numpy
# (:mod:`nvplugin.allocator.methods.smalltables`), nor one of at most TREE_GPUS whose scores nest
# (:mod:`nvplugin.allocator.methods.tree`).

TABLE_GPUS = 16
"""Largest node whose tables are built once at start-up (2^16 masks: ~5 MB, ~0.3 s), and the
most available GPUs a ``search`` request builds tables over."""

EXACT_SHARE = 0.75
"""Share of a ``search`` request's budget its exact attempt (tables over <= 16 available GPUs)
may use before the local search takes over."""

SEARCH_SHARE = 0.9
"""Share of a ``search`` request's budget after which the local search stops."""

BRANCH_GPUS = 32
"""Largest node the ``branch`` method takes (the node sizes it is measured on)."""

ALL_CONTENDERS = 4096
"""Most compositions ``solve`` checks one by one on a ``tree`` or ``branch`` node to list every
contender; beyond it only those with the best own score are listed."""


def _indices(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


class BestEffort:
    """Exact best-effort allocation over one topology (see the module docstring)."""

    name = "best-effort"

    def __init__(
        self,
        topology: Topology,
        *,
        table_gpus: int = TABLE_GPUS,
        tree_gpus: int = TREE_GPUS,
        branch_gpus: int = BRANCH_GPUS,
        budget_s: float = 0.1,
        structured: bool = True,
    ) -> None:
        """``budget_s``: how long a ``search`` request may take (module docstring);
        ``table_gpus``/``tree_gpus``/``branch_gpus``: the largest node the tables / ``tree`` /
        ``branch`` take (lower them to test the other methods on small nodes);
        ``structured=False``: no method that relies on classes of twins (``tree``,
        ``branch``), so that a node beyond the tables gets ``search`` (what benchmarks compare
        with)."""
        self._topology = topology
        self._budget_s = budget_s
        n = len(topology)
        self._tables: Tables | SmallTables | None = None
        self._counts: BranchSearch | None = None
        self._tree: TreeSearch | None = None
        self._method = "search"
        small = n <= min(SMALL_GPUS, table_gpus)
        tree = TreeSearch(topology.scores) if not small and structured and n <= tree_gpus else None
        if small:
            self._tables, self._method = SmallTables.build(topology.scores), "tables"
        elif tree is not None and tree.root is not None:
            self._tree, self._method = tree, "tree"
        else:
            from nvplugin.allocator.methods import branch
            from nvplugin.allocator.methods.classes import twin_classes
            from nvplugin.allocator.methods.tables import Tables

            classes = twin_classes(topology.scores) if structured else None
            if classes is not None and n <= branch_gpus and branch.applies(classes):
                self._counts, self._method = branch.BranchSearch(classes), "branch"
            elif n <= table_gpus:
                self._tables = Tables.build(topology.scores, range(1, n + 1))
                self._method = "tables"
        if n and self.method != "search":
            # One query at start-up runs every code path once (numpy's first calls are slower),
            # so the kubelet's first request is as fast as the rest; on a tree, one per size (a
            # few ms in all) fills the caches of how pieces match that later requests read.
            for size in range(1, n + 1) if self._tree is not None else [max(1, n // 2)]:
                self.allocate(range(n), [], size)

    @property
    def topology(self) -> Topology:
        return self._topology

    @property
    def budget_s(self) -> float:
        return self._budget_s

    @property
    def method(self) -> str:
        """``tables``, ``tree``, ``branch`` or ``search`` (module docstring)."""
        return self._method

    @property
    def table_bytes(self) -> int:
        """Memory held by what start-up prepared (tables or shape arrays; 0 for ``search``)."""
        if self._tables is not None:
            return self._tables.nbytes
        return self._counts.nbytes if self._counts is not None else 0

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        request = check_request(len(self._topology), available, must_include, size)
        if request.impossible:
            return []
        if self._tables is not None:
            best = self._tables.best_group(request.available_mask, request.must_include_mask, size)
            assert best is not None, "a possible request always has a candidate group"
            return list(_indices(best[0]))
        if self._tree is not None:
            return list(self._tree.best(request.available, request.must_include, size).group)
        if self._counts is not None:
            started = time.monotonic()
            try:
                return list(self._count_group(request, started)[0])
            except OutOfTime:
                return list(self._found_in_time(request, started, explain=False).indices)
        return list(self._search(request, explain=False).indices)

    def solve(self, available: Sequence[int], must_include: Sequence[int], size: int) -> Allocation:
        """Like :meth:`allocate`, with the group's score, OPT and a best partition."""
        request = check_request(len(self._topology), available, must_include, size)
        if request.impossible:
            return Allocation(self.name, (), None, None, reason=request.impossible)
        if self._tables is not None:
            return self._table_solve(self._tables, (), request)
        if self._tree is not None:
            answer = self._tree.best(request.available, request.must_include, request.size)
            return self._count_solve(request, time.monotonic(), answer.group)
        if self._counts is not None:
            started = time.monotonic()
            try:
                return self._count_solve(request, started)
            except OutOfTime:
                return self._found_in_time(request, started, explain=True)
        return self._search(request, explain=True)

    def evaluate(self, available: Sequence[int], group: Sequence[int], policy: str) -> Allocation:
        """Score a group another policy chose: its own score and the best partition of
        ``available`` that contains it as a full group (``partition_score``; on a ``search``
        node beyond 16 available GPUs, the best one found in the budget)."""
        request = check_request(len(self._topology), available, group, len(group))
        if request.impossible:
            return Allocation(policy, (), None, None, reason=request.impossible)
        if self._counts is not None or self._tree is not None:
            answer = self._count_explain(request, request.must_include)
        else:
            tables, labels = self._tables_for(request, None)
            if tables is not None:
                mask = _relabel(request.must_include_mask, labels)
                answer = self._explain(tables, labels, request, mask)
            else:
                answer = self._found(request, fixed=True)
        return dataclasses.replace(answer, policy=policy)

    # --- tables ---

    def _tables_for(
        self, request: Request, deadline: float | None
    ) -> tuple[Tables | SmallTables | None, tuple[int, ...]]:
        """The tables to answer ``request`` with, and the GPU index of each table position
        (empty when positions are GPU indices); None when the available GPUs are too many or
        the build passes ``deadline``."""
        if self._tables is not None:
            return self._tables, ()
        labels = request.available
        if len(labels) > TABLE_GPUS:
            return None, labels
        from nvplugin.allocator.methods.tables import Tables

        scores = self._topology.scores
        sub = [[scores[a][b] for b in labels] for a in labels]
        try:
            return Tables.build(sub, [request.size], deadline), labels
        except OutOfTime:
            return None, labels

    def _table_solve(
        self, tables: Tables | SmallTables, labels: tuple[int, ...], request: Request
    ) -> Allocation:
        ranked = tables.ranked(
            _relabel(request.available_mask, labels),
            _relabel(request.must_include_mask, labels),
            request.size,
        )
        answer = self._explain(tables, labels, request, ranked[0][0])
        contenders = tuple((self._out(mask, labels), score) for mask, score in ranked)
        return dataclasses.replace(answer, contenders=contenders)

    def _explain(
        self,
        tables: Tables | SmallTables,
        labels: tuple[int, ...],
        request: Request,
        group: int,
    ) -> Allocation:
        s = request.size
        available = _relabel(request.available_mask, labels)
        own = int(tables.setscore[group])
        total = own + int(tables.rest[s][available ^ group])
        full, leftover = tables.split(available ^ group, s)

        def out(mask: int) -> tuple[int, ...]:
            return self._out(mask, labels)

        others = sorted((out(g) for g in full), key=lambda g: g[0])
        return Allocation(self.name, out(group), own, total, (out(group), *others), out(leftover))

    @staticmethod
    def _out(mask: int, labels: tuple[int, ...]) -> tuple[int, ...]:
        """Table positions back to GPU indices."""
        local = _indices(mask)
        return tuple(labels[i] for i in local) if labels else local

    # --- counts ---

    def _count_group(self, request: Request, started: float) -> tuple[tuple[int, ...], int, int]:
        """(group, its score, OPT) on a ``branch`` node; the search raises :class:`OutOfTime`
        past three quarters of the budget from ``started``."""
        assert self._counts is not None
        classes = self._counts.classes
        available = classes.counts(request.available)
        required = classes.counts(request.must_include)
        free = self._free(request)
        deadline = started + self._budget_s * EXACT_SHARE
        lex = self._lex_key(request, required, free)
        answer = self._counts.search(available, required, request.size, lex, deadline=deadline)
        opt2, own2, best = answer.opt2, answer.own2, answer.best
        group = min(self._members(request, best, required, free))
        return group, own2 // 2, opt2 // 2

    def _lex_key(self, request: Request, taken: np.ndarray, free: list[list[int]]) -> LexKey:
        """For count vectors, a key that is higher the lex-smaller their groups (R plus the
        lowest other available GPUs per class): sorted index tuples of one length compare as
        their bit-reversed masks do, in reverse. ``taken``: the must-include GPUs per class;
        ``free``: :meth:`_free`. Its table is made at the first call (most requests make none:
        only groups whose twins can be arranged in more than one way are compared)."""
        import numpy as np

        top = len(self._topology) - 1

        @functools.cache
        def table() -> tuple[np.ndarray, np.ndarray, np.uint64]:
            prefix: list[list[int]] = []
            for gpus in free:
                chain = [0]
                for gpu in gpus:
                    chain.append(chain[-1] | 1 << (top - gpu))
                prefix.append(chain)
            # One row per class (padded), looked up for every class of every vector at once.
            width = max(len(chain) for chain in prefix)
            rows = np.zeros((len(prefix), width), dtype=np.uint64)
            for c, chain in enumerate(prefix):
                rows[c, : len(chain)] = chain
            base = np.uint64(sum(1 << (top - gpu) for gpu in request.must_include))
            return rows, np.arange(len(prefix)), base

        def key(vectors: np.ndarray) -> np.ndarray:
            rows, classes, base = table()
            parts = rows[classes, vectors - taken]
            out: np.ndarray = np.bitwise_or.reduce(parts, axis=1) | base
            return out

        return key

    def _free(self, request: Request) -> list[list[int]]:
        """Per class, its available GPUs that are not must-include, lowest first."""
        classes = self._counter().classes
        required = set(request.must_include)
        free: list[list[int]] = [[] for _ in range(len(classes))]
        for gpu in request.available:
            if gpu not in required:
                free[classes.of[gpu]].append(gpu)
        return free

    def _members(
        self, request: Request, vectors: np.ndarray, taken: np.ndarray, free: list[list[int]]
    ) -> list[tuple[int, ...]]:
        """For each count vector, the lex-smallest group with those GPUs per class: the
        must-include GPUs, then in each class the lowest other available ones (``taken``: the
        must-include GPUs per class; ``free``: :meth:`_free`)."""
        out = []
        for vector in (vectors - taken).tolist():
            chosen = list(request.must_include)
            for c, k in enumerate(vector):
                chosen.extend(free[c][:k])
            out.append(tuple(sorted(chosen)))
        return out

    def _counter(self) -> BranchSearch:
        """The count search: made at start-up on a ``branch`` node; on a ``tree``
        node only once an explanation asks for it (``--explain`` lists a best partition and
        every contender, which the tree's programme does not keep), so that ``serve`` never
        loads numpy there."""
        if self._counts is None:
            from nvplugin.allocator.methods.branch import BranchSearch
            from nvplugin.allocator.methods.classes import twin_classes

            assert self._tree is not None
            self._counts = BranchSearch(twin_classes(self._topology.scores))
        return self._counts

    def _count_solve(
        self, request: Request, started: float, group: tuple[int, ...] | None = None
    ) -> Allocation:
        """The answer (``group`` when already known) with a best partition and the contenders
        (one per composition)."""
        from nvplugin.allocator.methods.branch import compositions

        counter = self._counter()
        if group is None:
            group, _, _ = self._count_group(request, started)
        answer = self._count_explain(request, group)
        classes = counter.classes
        available = classes.counts(request.available)
        required = classes.counts(request.must_include)
        candidates = compositions(required, available, request.size)
        complete = len(candidates) <= ALL_CONTENDERS
        if not complete:
            level = counter.twice(candidates) == 2 * (answer.score or 0)
            candidates = candidates[level]
        totals = counter.totals(available, candidates, request.size)
        best = candidates[totals == 2 * (answer.partition_score or 0)]
        ranked = sorted(
            zip(
                self._members(request, best, required, self._free(request)),
                (counter.twice(best) // 2).tolist(),
                strict=True,
            ),
            key=lambda item: (-item[1], item[0]),
        )
        note = "one group per composition of the node's classes of interchangeable GPUs"
        if not complete:
            note += "; only compositions with the best own score are listed"
        return dataclasses.replace(answer, contenders=tuple(ranked), contenders_note=note)

    def _count_explain(self, request: Request, group: Sequence[int]) -> Allocation:
        """``group``'s score, and the best partition of the available GPUs holding it."""
        counter = self._counter()
        classes = counter.classes
        s = request.size
        available = classes.counts(request.available)
        x = classes.counts(group)
        total = int(counter.totals(available, x[None, :], s)[0]) // 2
        full, leftover = counter.partition(available - x, s)
        pools: list[list[int]] = [[] for _ in range(len(classes))]
        for gpu in request.available:
            if gpu not in group:
                pools[classes.of[gpu]].append(gpu)

        def take(counts: np.ndarray) -> tuple[int, ...]:
            out: list[int] = []
            for c, k in enumerate(counts.tolist()):
                out.extend(pools[c][:k])
                del pools[c][:k]
            return tuple(sorted(out))

        others = sorted((take(g) for g in full), key=lambda g: g[0])
        chosen = tuple(sorted(group))
        own = self._topology.group_score(chosen)
        return Allocation(self.name, chosen, own, total, (chosen, *others), take(leftover))

    # --- search ---

    def _search(self, request: Request, *, explain: bool) -> Allocation:
        """A ``search`` node's answer (module docstring)."""
        s = request.size
        forced = _forced(request)
        if forced is not None and not explain:
            return Allocation(self.name, forced, None, None)
        started = time.monotonic()
        # The exact tables get three quarters of the budget; the search keeps the rest.
        tables, labels = self._tables_for(request, started + self._budget_s * EXACT_SHARE)
        if tables is not None:
            if explain:
                return self._table_solve(tables, labels, request)
            best = tables.best_group(
                _relabel(request.available_mask, labels),
                _relabel(request.must_include_mask, labels),
                s,
            )
            assert best is not None, "a possible request always has a candidate group"
            return Allocation(self.name, self._out(best[0], labels), best[1], best[2])
        return self._found_in_time(request, started, explain=explain)

    def _found_in_time(self, request: Request, started: float, *, explain: bool) -> Allocation:
        """The local search's answer by :data:`SEARCH_SHARE` of the budget from ``started`` (it
        stops a tenth early: what follows it and a thread switch under load must fit in the
        budget too), with a debug line saying what is not proven."""
        forced = _forced(request)
        if forced is not None and not explain:
            return Allocation(self.name, forced, None, None)
        deadline = started + self._budget_s * SEARCH_SHARE
        if forced is not None:  # the answer is known; only its partition is searched for
            fixed = check_request(len(self._topology), request.available, forced, request.size)
            return self._found(fixed, fixed=True, deadline=deadline)
        answer = self._found(request, fixed=False, deadline=deadline)
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

    def _found(self, request: Request, *, fixed: bool, deadline: float | None = None) -> Allocation:
        from nvplugin.allocator.methods.search import local_search

        until = deadline if deadline is not None else time.monotonic() + self._budget_s
        found = local_search(
            self._topology.scores,
            request.available,
            request.must_include,
            request.size,
            until,
            fixed=fixed,
        )
        # A partition that meets the bound is optimal; the answer with it only when the group is
        # given (another optimal partition could hold a group of a higher own score).
        proven = fixed and found.partition_score == found.bound
        return Allocation(
            self.name,
            found.groups[0],
            found.score,
            found.partition_score,
            found.groups,
            found.leftover,
            contenders=((found.groups[0], found.score),),
            proven=proven,
            bound=found.bound,
        )


def _forced(request: Request) -> tuple[int, ...] | None:
    """The answer when no search is needed: every available GPU, exactly the must-include
    ones, or at size 1 (every partition scores 0) the must-include GPU or the lowest one."""
    if request.size == len(request.available):
        return request.available
    if request.size == len(request.must_include):
        return request.must_include
    if request.size == 1:
        return request.available[:1]
    return None


def _relabel(mask: int, labels: tuple[int, ...]) -> int:
    """A mask over GPU indices as a mask over table positions (identity when no labels)."""
    if not labels:
        return mask
    return sum(1 << position for position, gpu in enumerate(labels) if mask >> gpu & 1)
