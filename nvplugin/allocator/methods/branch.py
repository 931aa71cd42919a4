"""The ``branch`` method: the exact objective on nodes of up to eight classes of interchangeable
GPUs (:mod:`nvplugin.allocator.methods.classes`), by branch and bound over count vectors.

A group is a count vector (GPUs per class) and its score depends on nothing else, so the best
partition of what is left, R(y), is a recursion over count vectors, not over GPUs; a bound that
is exact for PCIe trees (:mod:`nvplugin.allocator.methods.countbound`), symmetry among twin
classes and a fail-soft memo that outlives the request keep a request to a few dozen states
(docs/allocation.md#the-branch-search). Here: the node's search (its memo, OPT and the answer's
count vectors) and the method; what start-up works out is
:mod:`nvplugin.allocator.methods.branchlayout`, a request's walk
:mod:`nvplugin.allocator.methods.branchquery`. Integer arithmetic only (doubled scores, so pairs
count whole): a float product would go through the BLAS library, whose threads spin on a busy
node.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from nvplugin.allocator.base import Allocation, Request
from nvplugin.allocator.methods import counting
from nvplugin.allocator.methods.base import Best, warmed
from nvplugin.allocator.methods.branchlayout import MAX_VECTORS, Layout
from nvplugin.allocator.methods.branchquery import FIRST, UNKNOWN, Arrays, Query, State
from nvplugin.allocator.methods.classes import Classes, twin_classes
from nvplugin.allocator.methods.counting import LexKey
from nvplugin.node.model import Topology

IntArray = NDArray[np.int64]

BRANCH_GPUS = 32
"""Largest node the ``branch`` method takes (the node sizes it is measured on)."""

MAX_CLASSES = 8
"""Most classes the branch search takes."""

MEMO_ENTRIES = 1 << 14
"""Most values of R (exact, or upper bounds) a node's search keeps from one request to the next,
over every size; past it, the next request starts an empty memo (docs/allocation.md has what that
holds in memory, and how many a long run keeps)."""


def vectors(classes: Classes) -> int:
    """How many count vectors a node's classes have (every vector below the class sizes)."""
    return int(np.prod([len(members) + 1 for members in classes.members], dtype=np.int64))


def applies(classes: Classes) -> bool:
    """Whether the branch search takes a node with these classes."""
    return len(classes) <= MAX_CLASSES and vectors(classes) <= MAX_VECTORS


@dataclass(frozen=True)
class Answer:
    """A request's answer in count vectors: OPT and the answer's own score (both doubled), and
    the count vectors that reach both, the answer's first (by the request's lex key)."""

    opt2: int
    own2: int
    best: IntArray


class BranchSearch:
    """The branch and bound over one node's classes (see the module docstring). Threads may
    share one: its arrays are read-only after construction, each request lists children of its
    own, and the memo of R they share (a dict per size, at most ``memo_entries`` values in all)
    only ever gains true facts; a race at worst stores a looser bound over a tighter one."""

    def __init__(self, classes: Classes, memo_entries: int = MEMO_ENTRIES) -> None:
        self.classes = classes
        self._memo_entries = memo_entries
        self._memos: dict[int, dict[int, tuple[int, bool]]] = {}
        self._memos_lock = threading.Lock()
        self.layout = Layout.build(classes)

    def memo(self, size: int) -> dict[int, tuple[int, bool]]:
        """The memo of R for requests of ``size`` (by state key: twice R and whether exact, else
        an upper bound), emptied first when all sizes' together hold ``memo_entries``."""
        with self._memos_lock:
            if sum(len(memo) for memo in self._memos.values()) >= self._memo_entries:
                self._memos = {}
            return self._memos.setdefault(size, {})

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes

    def twice(self, x: IntArray) -> IntArray:
        """Twice the score of each group (count vector) in ``x``."""
        return self.layout.twice(x)

    def search(
        self,
        available: IntArray,
        required: IntArray,
        size: int,
        lex: LexKey,
        *,
        deadline: float | None = None,
        every: bool = False,
    ) -> Answer:
        """The answer to a possible request (``required <= available``, ``sum(required) <=
        size <= sum(available)``); with ``every``, every count vector reaching OPT with the best
        own score, else the first by ``lex``. Raises :class:`OutOfTime` past ``deadline``."""
        query = Query(self.layout, self.memo(size), int(available.sum()), size, deadline)
        sides = [available.tolist(), required.tolist()]
        top = query.state(available)
        # OPT by aspiration: ask for the best bound, and on failure for the upper bound the
        # search proved instead, until one is met. Each round walks only the children whose bound
        # reaches it (the memo keeps what earlier rounds proved, each state's children are
        # listed once per request), where a search from below solves whole subtrees exactly.
        # With must-include GPUs the top's children are the groups that hold them; without,
        # R(available) is OPT and lists its own (those holding the first class), and the groups
        # of the answer are bounded only after, the highest own scores first (:meth:`_tiers`).
        if required.any():
            positions, columns = self.layout.fitting(size, sides[0], sides[1], sides)
            kids = query.arrays(top, positions, size, columns)
            ranked = query.ranked(kids)
            need = int(kids.bounds.max()) if len(kids.bounds) else 0
            candidates: Iterator[Arrays] = iter([kids])
        else:
            ranked = None
            need = query.first_bound(top)
            candidates = self._tiers(query, top, size, sides)
        while True:
            if ranked is not None:
                found, upper = query.best_child(top, ranked, need, -1, UNKNOWN)
                value, exact = (found, True) if upper <= found else (upper, False)
            else:
                value, exact = query.rest(top, need, UNKNOWN)
            if exact:
                opt = value
                break
            need = value
        # The answer: the highest own score whose group reaches OPT, then the lex-smallest. Only
        # groups whose bound reaches OPT can; each is checked with OPT less its own score as
        # both the need and the cap of its rest (no rest can score more), highest own first.
        # Within one own score they are checked best lex key first (a group's best arrangement:
        # every arrangement of it reaches OPT as it does), so the first that reaches is the
        # answer, unless ``every`` asks for them all.
        blocks = _blocks(sides, self.layout.twins)
        reach: list[int] = []
        level = None
        arranged: dict[int, IntArray] = {}  # a tier's groups' best arrangements, by position
        for kids, f, tier in _reaching(candidates, opt):
            if not every and len(tier) > 1:
                positions = kids.positions[tier]
                rows = _best_arrangements(self.layout.groups[positions], blocks, lex)
                arranged = dict(zip(positions.tolist(), rows, strict=True))
                ranked_tier = sorted(
                    zip(lex(rows).tolist(), tier, strict=True), key=lambda t: -t[0]
                )
                tier = [i for _, i in ranked_tier]
            for i in tier:
                state = query.child(top, int(kids.positions[i]), int(kids.keys[i]))
                value, exact = query.rest(state, opt - f, opt - f)
                if exact and value + f == opt:
                    reach.append(int(kids.positions[i]))
                    level = f
                    if not every:
                        break
            if level is not None:
                break
        assert level is not None, "the best partition's group reaches OPT"
        if every:
            best = _arrangements(self.layout.groups[reach].astype(np.int64), blocks)
        elif reach[0] in arranged:
            best = arranged[reach[0]][None]
        else:
            best = _best_arrangements(self.layout.groups[reach], blocks, lex)
        return Answer(opt, level, best)

    def _tiers(
        self, query: Query, top: State, size: int, sides: list[list[int]]
    ) -> Iterator[Arrays]:
        """The top's children through every group of ``size`` that fits it, highest own score
        first, in runs of whole tiers of one own score: :data:`FIRST` groups, then four times
        as many each time, so the bounds of the groups that cannot be the answer's (most of
        them: lower own scores) are seldom computed."""
        positions, columns = self.layout.fitting(size, sides[0], sides[1], sides)
        negated = -columns[0]
        order = np.argsort(negated, kind="stable")
        down = negated[order]  # own scores negated, lowest first: where each tier ends
        start, count = 0, FIRST
        while start < len(order):
            stop = len(order)
            if start + count < stop:
                stop = int(np.searchsorted(down, down[start + count - 1], side="right"))
            picked = order[start:stop]
            yield query.arrays(top, positions[picked], size, columns[:, picked])
            start, count = stop, count * 4

    def totals(self, available: IntArray, candidates: IntArray, size: int) -> IntArray:
        """Twice the best score of a partition of ``available`` that has each candidate as a
        full group (exact: for ``--explain``, not for requests)."""
        query = Query(self.layout, self.memo(size), int(available.sum()), size, None)
        out = self.twice(candidates)
        for i, row in enumerate(available - candidates):
            value, exact = query.rest(query.state(row), 0, UNKNOWN)
            assert exact
            out[i] += value
        return out

    def partition(self, rest: IntArray, size: int) -> tuple[list[IntArray], IntArray]:
        """A best partition of ``rest`` (counts per class): its full groups and its leftover, as
        count vectors (for ``--explain``)."""
        query = Query(self.layout, self.memo(size), int(rest.sum()), size, None)
        full: list[IntArray] = []
        y = rest.copy()
        while y.any():
            total = int(y.sum())
            if total <= size:
                if total == size:
                    full.append(y)
                    return full, np.zeros_like(y)
                return full, y
            state = query.state(y)
            value, _ = query.rest(state, 0, UNKNOWN)
            group = query.best_group(state, value)
            if int(group.sum()) == size:
                full.append(group)
                y = y - group
            else:  # the leftover holds the first class; the rest divides into full groups
                inner, _ = self.partition(y - group, size)
                return full + inner, group
        return full, y


def _reaching(candidates: Iterator[Arrays], opt: int) -> Iterator[tuple[Arrays, int, list[int]]]:
    """The candidates whose bound reaches ``opt``, a tier of one own score at a time, highest
    first (``candidates`` come in whole tiers, highest first): their arrays, the own score and
    the tier's indices into them."""
    for kids in candidates:
        near = np.flatnonzero(kids.bounds >= opt)
        for f in sorted(set(kids.own[near].tolist()), reverse=True):
            yield kids, f, near[kids.own[near] == f].tolist()


def _blocks(sides: list[list[int]], twins: Sequence[Sequence[int]]) -> list[list[int]]:
    """The sets of two or more twin classes whose counts are equal on every side: the classes
    whose counts a group's arrangements permute (:meth:`Layout.fitting`)."""
    out: list[list[int]] = []
    for same in twins:
        blocks: dict[tuple[int, ...], list[int]] = {}
        for c in same:
            blocks.setdefault(tuple(int(side[c]) for side in sides), []).append(c)
        out.extend(block for block in blocks.values() if len(block) > 1)
    return out


def _best_arrangements(groups: NDArray[np.int8], blocks: list[list[int]], lex: LexKey) -> IntArray:
    """Each group's arrangement (:func:`_arrangements`) of the highest lex key (the key is
    asked for only where a block has more than one order). A key is one part per class on bits
    of its own (:data:`LexKey`), so each block of twins is arranged on its own: the best orders
    of one block, the others' counts kept, then the next (a few orders per block, where the
    arrangements multiply across blocks)."""
    rows = groups.astype(np.int64)
    for block in blocks:
        orders = [_orders(values) for values in rows[:, block].tolist()]
        counts = [len(each) for each in orders]
        if max(counts) == 1:
            continue
        tried = np.repeat(rows, counts, axis=0)
        tried[:, block] = [order for each in orders for order in each]
        keys = lex(tried)
        segment = np.repeat(np.arange(len(rows)), counts)
        rows = tried[np.lexsort((keys, segment))[np.cumsum(counts) - 1]]  # each one's highest
    return rows


def _arrangements(groups: IntArray, blocks: list[list[int]]) -> IntArray:
    """Every arrangement of each group (the inverse of :meth:`Layout.fitting`' choice of
    one) over ``blocks`` (:func:`_blocks`), once."""
    out = {tuple(g) for g in groups.tolist()}
    for block in blocks:
        grown = set()
        for g in out:
            for values in _orders([g[c] for c in block]):
                h = list(g)
                for c, v in zip(block, values, strict=True):
                    h[c] = v
                grown.add(tuple(h))
        out = grown
    return np.asarray(sorted(out), dtype=np.int64).reshape(-1, groups.shape[1])


def _orders(values: list[int]) -> list[tuple[int, ...]]:
    """Every distinct order of ``values`` (as many as the multiset has, not ``len(values)!``:
    eight twin switches of four counts each have 420, where itertools lists 40 320)."""
    current = sorted(values)
    out = [tuple(current)]
    k = len(current)
    while True:  # the next order up, lexicographically
        i = k - 2
        while i >= 0 and current[i] >= current[i + 1]:
            i -= 1
        if i < 0:
            return out
        j = k - 1
        while current[j] <= current[i]:
            j -= 1
        current[i], current[j] = current[j], current[i]
        current[i + 1 :] = reversed(current[i + 1 :])
        out.append(tuple(current))


class BranchMethod:
    """The ``branch`` method: nodes of :data:`BRANCH_GPUS` GPUs or fewer whose classes the
    search takes (:func:`applies`)."""

    name = "branch"

    def __init__(self, topology: Topology, search: BranchSearch) -> None:
        self._topology = topology
        self._search = search

    @classmethod
    def build(cls, topology: Topology) -> BranchMethod | None:
        n = len(topology)
        if n > BRANCH_GPUS:
            return None
        classes = twin_classes(topology.scores)
        if not applies(classes):
            return None
        return warmed(cls(topology, BranchSearch(classes)), n, [max(1, n // 2)])

    @property
    def nbytes(self) -> int:
        return self._search.nbytes

    def best(self, request: Request, deadline: float) -> Best:
        """The search raises OutOfTime past ``deadline``."""
        classes = self._search.classes
        available = classes.counts(request.available)
        required = classes.counts(request.must_include)
        free = counting.free_per_class(classes, request)
        lex = counting.lex_key(len(self._topology), request, required, free)
        answer = self._search.search(available, required, request.size, lex, deadline=deadline)
        group = min(counting.members(request, answer.best, required, free))
        return Best(group, answer.own2 // 2, answer.opt2 // 2)

    def explain(
        self, request: Request, group: tuple[int, ...], deadline: float, *, contenders: bool
    ) -> Allocation:
        return counting.explain(self._search, self._topology, request, group, contenders=contenders)
