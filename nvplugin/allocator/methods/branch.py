"""The exact best-effort objective on nodes of up to eight classes of interchangeable GPUs, by
branch and bound over count vectors.

On such a node (:mod:`nvplugin.allocator.methods.classes`: a PCIe switch's cards, an NVSwitch
fabric's GPUs of one socket) a group is a count vector x (GPUs per class) and its score ``f(x)``
depends on nothing else. With a the available GPUs per class, r the must-include ones and s the
size, docs/allocation.md's objective reads:

- ``R(y)``: the best score of a partition of the count vector y into groups of s and one leftover
  group of ``|y| mod s``. Some group holds a GPU of the first class c0 that y has, so
  ``R(y) = max f(g) + R(y - g)`` over the groups g (of s, or of the leftover size) with
  ``g[c0] >= 1``: a recursion over count vectors, not over GPUs.
- ``OPT = max f(x) + R(a - x)`` over the full groups x with ``r <= x <= a`` (without must-include
  GPUs: ``R(a)``), and the answer is, among the x reaching OPT, one with the highest ``f(x)``,
  then the lex-smallest group: the must-include GPUs plus, in each class, the lowest other
  available ones (their sorted indices are element-wise no larger than any other group's with
  that vector).

The space of count vectors is small (at most 5^8 = 390 625 vectors of 32 GPUs in 8 classes), but a
request does not walk it. Three things keep the search to a few dozen states:

- **A bound that is exact for PCIe trees** (:mod:`nvplugin.allocator.methods.countbound`). Pair
  scores are sums of threshold steps: with the distinct scores t_1 < t_2 < ..., a pair scoring t
  contributes ``t_i - t_(i-1)`` for every ``t_i <= t``. At threshold t_i the classes joined by
  scores ``>= t_i`` fall into connected components, and a pair of GPUs in one group counts at t_i
  only if both lie in one component. The most pairs a partition can put inside a component of ``k``
  GPUs is ``C(s, 2)`` per full group of s it could fill plus ``C(k mod s, 2)``, so ``R(y) <= sum_i
  (t_i - t_(i-1)) * sum_components Cmax(GPUs of y in it)``. On a PCIe tree the components are the
  tree's subtrees, and the bound is the score of packing every subtree as tightly as the group size
  allows: it is met whenever the subtrees' counts divide well, and close otherwise. Where scores do
  not nest (an NVSwitch fabric over part of a PCIe tree) the components still bound, less tightly.
- **Symmetry.** Classes with the same scores to every other class and the same score inside
  (sibling switches) are interchangeable: R does not change when their counts are permuted, so
  a state is stored by its counts sorted within each such set, and a group is branched on once
  per arrangement of equal counts.
- **Fail-soft memo.** Each state remembers its exact value, or an upper bound once a search below
  it was cut off because it could not reach what its caller needed; a later visit with a lower
  need searches again, one with a higher need stops at once. Children are tried best bound
  first, and a state stops the moment the next child's bound cannot beat its best. R of a count
  vector is the same for every request of one size, so the memo outlives the request: a node's
  later requests start from what earlier ones proved (up to :data:`MEMO_ENTRIES` values).

Everything is integer numpy arithmetic (doubled scores, so pairs count whole): a float product
would go through the BLAS library, whose worker threads spin on a busy node.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import sub

import numpy as np
from numpy.typing import NDArray

from nvplugin.allocator.base import OutOfTime
from nvplugin.allocator.methods.classes import Classes
from nvplugin.allocator.methods.countbound import CHUNK, CountBound

IntArray = NDArray[np.int64]

MAX_CLASSES = 8
"""Most classes the branch search takes."""

MAX_VECTORS = 5**8
"""Most count vectors (the product of class sizes + 1) whose groups are listed at start-up: 32
GPUs in 8 classes never exceed it (~17 MiB of arrays kept at the limit)."""

FEW = 48
"""Most groups a node's slice may have to be walked in Python rather than with arrays."""

FIRST = 8
"""Children of a state listed (as Python) when it is expanded; four times as many each time a
search gets past them."""

MEMO_ENTRIES = 1 << 14
"""Most values of R (exact, or upper bounds) a node's search keeps from one request to the next,
over every size: ~160 bytes each, 2.5 MiB at the limit. Past it, the next request starts an empty
memo (a 2000-request run on a 32-GPU server, sizes 1-32, kept ~3 400)."""

HEAD = 256
"""Children of a state sorted at once, with those tied with the last (:data:`FIRST` of them
listed); the rest only when a search gets past them, which it seldom does: the top of an
all-free 32-GPU node has ~6 000 groups of 14, and the search tries one or two."""

LexKey = Callable[[IntArray], NDArray[np.uint64]]
"""For count vectors (rows), a key that orders their groups lexicographically: higher first. It
is made of one part per class, each on bits of its own (the class's GPUs in a group, as a mask
with the lowest GPU highest), so a vector's key rises with each class's part alone."""


def vectors(classes: Classes) -> int:
    """How many count vectors a node's classes have (every vector below the class sizes)."""
    return int(np.prod([len(members) + 1 for members in classes.members], dtype=np.int64))


def applies(classes: Classes) -> bool:
    """Whether the branch search takes a node with these classes."""
    return len(classes) <= MAX_CLASSES and vectors(classes) <= MAX_VECTORS


def compositions(low: IntArray, high: IntArray, total: int) -> IntArray:
    """Every integer vector v with ``low <= v <= high`` and ``sum(v) = total``, one per row, in
    lexicographic order."""
    rows = np.zeros((1, 0), dtype=np.int64)
    sums = np.zeros(1, dtype=np.int64)
    for c in range(len(low)):
        rest_high = int(high[c + 1 :].sum())
        rest_low = int(low[c + 1 :].sum())
        lo = np.maximum(low[c], total - sums - rest_high)
        hi = np.minimum(high[c], total - sums - rest_low)
        count = np.maximum(hi - lo + 1, 0)
        which = np.repeat(np.arange(len(rows)), count)
        offset = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        values = lo[which] + offset
        rows = np.hstack([rows[which], values[:, None]])
        sums = sums[which] + values
    return rows


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
        sizes = [len(members) for members in classes.members]
        m = len(sizes)
        self._m = m
        self._scores = classes.scores.astype(np.int64)
        self._inner = np.diag(self._scores).copy()
        self._twins = _twin_sets(self._scores, sizes)
        self._pairs = [pair for twins in self._twins for pair in itertools.pairwise(twins)]
        # Every count vector below the class sizes (row i: the vector whose mixed-radix digits
        # are i), and the memo key of each: the same for vectors that differ by a permutation
        # of twin classes' counts. Worked through in chunks, so start-up memory stays a few MB
        # above what is kept.
        # The key is the index of one arrangement: the counts sorted down, given to the twins
        # in decreasing size (it fits: the k-th largest count is at most the k-th largest size).
        grid = np.indices([size + 1 for size in sizes], dtype=np.int8).reshape(m, -1).T
        self._stride = np.cumprod([1] + [size + 1 for size in sizes[:0:-1]])[::-1].astype(np.int64)
        self._keys = np.empty(len(grid), dtype=np.int32)
        by_size = [sorted(twins, key=lambda c: -sizes[c]) for twins in self._twins]
        for start in range(0, len(grid), CHUNK):
            columns = list(grid[start : start + CHUNK].T)  # one class's counts each (int8)
            for twins, ranked in zip(self._twins, by_size, strict=True):
                for c, count in zip(ranked, _sorted_down([columns[d] for d in twins]), strict=True):
                    columns[c] = count
            key = np.zeros(len(columns[0]), dtype=np.int64)
            for c, count in enumerate(columns):
                key += count.astype(np.int64) * self._stride[c]
            self._keys[start : start + CHUNK] = key
        # The same vectors ordered by size and then by first class, so the groups of size k
        # whose first class is c are one slice; with each one's index above, twice its score
        # and which pairs of twins it takes out of order (a bit per pair).
        total = grid.sum(axis=1, dtype=np.int32)
        first = np.where(total > 0, np.argmax(grid > 0, axis=1), m).astype(np.int32)
        keys = total * np.int32(m + 1) + first
        order = np.argsort(keys, kind="stable")
        self._groups = np.ascontiguousarray(grid[order])
        self._slices = np.searchsorted(keys[order], np.arange((sum(sizes) + 1) * (m + 1) + 1))
        self._position = np.empty(len(order), dtype=np.int32)
        self._position[order] = np.arange(len(order), dtype=np.int32)
        del grid, total, first, keys
        self._bound = CountBound(self._scores, sizes)
        # What a state's children need of each group, one column per group (int32): twice its
        # score, its index, which pairs of twins it takes out of order (a bit per pair) and its
        # index in each tabulated part, so the groups that fit a state are taken out with one
        # array operation. Filled in place, a chunk at a time (no second copy at start-up).
        tabulated = [part for part in self._bound.parts if part.tabulated]
        self._columns = np.zeros((3 + len(tabulated), len(self._groups)), dtype=np.int32)
        self._twice, self._index, self._disorder = self._columns[:3]
        self._index[:] = order
        del order
        for row, part in enumerate(tabulated, start=3):
            part.index, part.row = self._columns[row], row
        for start in range(0, len(self._groups), CHUNK):
            chunk = self._groups[start : start + CHUNK].astype(np.int64)
            self._twice[start : start + CHUNK] = self.twice(chunk)
            for bit, (c, d) in enumerate(self._pairs):
                flags = (chunk[:, c] < chunk[:, d]).astype(np.int32) << bit
                self._disorder[start : start + CHUNK] |= flags
            for part in tabulated:
                part.index[start : start + CHUNK] = chunk[:, part.classes] @ part.stride
        if len(tabulated) == len(self._bound.parts):
            self._bound.rows = slice(3, 3 + len(tabulated))  # filled in this order above
        # Each group packed into one integer, a digit of ``_width`` bits per class with the top
        # bit of each digit kept clear: ``g <= y`` digit by digit is then one subtraction
        # (``(y | guard) - g`` keeps every guard bit exactly when no digit of g exceeds y's).
        # Above the digits, its disorder bits: from a field of ones they subtract without a
        # borrow, leaving the bits the group does *not* take out of order, so a state's test
        # of fit and of twin order is one subtraction, one mask and one comparison
        # (:meth:`_Query._fitting`).
        self._width = max(sizes).bit_length() + 1
        self._top = self._width * m
        assert self._top + len(self._pairs) < 63, "eight classes of at most 32 GPUs fit"
        self._shift = np.arange(m, dtype=np.int64) * self._width
        self._guard = sum(1 << (self._width * c + self._width - 1) for c in range(m))
        self._ones = ((1 << len(self._pairs)) - 1) << self._top
        self._packed = np.empty(len(self._groups), dtype=np.int64)
        for start in range(0, len(self._groups), CHUNK):
            chunk = self._groups[start : start + CHUNK].astype(np.int64)
            disorder = self._disorder[start : start + CHUNK].astype(np.int64) << self._top
            self._packed[start : start + CHUNK] = (chunk << self._shift).sum(axis=1) | disorder
        # Slices of a few groups are walked in Python (cheaper than a dozen array operations):
        # (position, index, twice the score, disorder, counts, index in each tabulated part,
        # packed).
        self._few: dict[tuple[int, int], list[_Entry]] = {}
        for size in range(sum(sizes) + 1):
            for lead in range(m):
                row = size * (m + 1) + lead
                lo, hi = int(self._slices[row]), int(self._slices[row + 1])
                if 0 < hi - lo <= FEW:
                    self._few[(size, lead)] = [
                        _Entry(
                            p,
                            int(self._index[p]),
                            int(self._twice[p]),
                            int(self._disorder[p]),
                            tuple(self._groups[p].tolist()),
                            self._bound.indices(p),
                            int(self._packed[p]) & ((1 << self._top) - 1),
                        )
                        for p in range(lo, hi)
                    ]

    def memo(self, size: int) -> dict[int, tuple[int, bool]]:
        """The memo of R for requests of ``size`` (by state key: twice R and whether exact, else
        an upper bound), emptied first when all sizes' together hold ``memo_entries``."""
        with self._memos_lock:
            if sum(len(memo) for memo in self._memos.values()) >= self._memo_entries:
                self._memos = {}
            return self._memos.setdefault(size, {})

    @property
    def nbytes(self) -> int:
        arrays = (self._groups, self._position, self._keys, self._packed, self._columns)
        return sum(a.nbytes for a in arrays) + self._bound.nbytes

    def twice(self, x: IntArray) -> IntArray:
        """Twice the score of each group (count vector) in ``x``."""
        result: IntArray = ((x @ self._scores) * x).sum(axis=-1) - x @ self._inner
        return result

    def groups(
        self, size: int, high: list[int], low: list[int], sides: list[list[int]]
    ) -> tuple[NDArray[np.intp], NDArray[np.int32]]:
        """Positions (in the size-ordered list) of the count vectors of ``size`` GPUs between
        ``low`` and ``high``, one arrangement of the counts of twins that are equal on every side
        in ``sides`` (non-increasing there), and their columns (``_columns``)."""
        # Only the slices of groups whose first class is one ``high`` has, up to ``low``'s first.
        row = size * (self._m + 1)
        first = next((c for c, count in enumerate(high) if count), self._m)
        last = next((c for c, count in enumerate(low) if count), self._m)
        lo, hi = int(self._slices[row + first]), int(self._slices[row + last + 1])
        packed = self._packed[lo:hi]
        equal = sum(
            1 << bit
            for bit, (c, d) in enumerate(self._pairs)
            if all(side[c] == side[d] for side in sides)
        )
        mask = np.int64(self._guard | equal << self._top)  # fit and twin order (``_packed``)
        fits = ((np.int64(self._pack(high) | self._guard | self._ones) - packed) & mask) == mask
        if any(low):
            guard = np.int64(self._guard)
            fits &= (((packed | guard) - np.int64(self._pack(low))) & guard) == guard
        picked = np.flatnonzero(fits)
        return picked + lo, self._columns[:, lo:hi][:, picked]

    def _pack(self, counts: list[int]) -> int:
        """A count vector as one integer (see ``_packed``)."""
        return sum(count << (self._width * c) for c, count in enumerate(counts))

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
        query = _Query(self, int(available.sum()), size, deadline)
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
            positions, columns = self.groups(size, sides[0], sides[1], sides)
            kids = query.arrays(top, positions, size, columns)
            ranked = query.ranked(kids)
            need = int(kids.bounds.max()) if len(kids.bounds) else 0
            candidates: Iterator[_Arrays] = iter([kids])
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
        blocks = _blocks(sides, self._twins)
        reach: list[int] = []
        level = None
        arranged: dict[int, IntArray] = {}  # a tier's groups' best arrangements, by position
        for kids, f, tier in _reaching(candidates, opt):
            if not every and len(tier) > 1:
                positions = kids.positions[tier]
                rows = _best_arrangements(self._groups[positions], blocks, lex)
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
            best = _arrangements(self._groups[reach].astype(np.int64), blocks)
        elif reach[0] in arranged:
            best = arranged[reach[0]][None]
        else:
            best = _best_arrangements(self._groups[reach], blocks, lex)
        return Answer(opt, level, best)

    def _tiers(
        self, query: _Query, top: _State, size: int, sides: list[list[int]]
    ) -> Iterator[_Arrays]:
        """The top's children through every group of ``size`` that fits it, highest own score
        first, in runs of whole tiers of one own score: :data:`FIRST` groups, then four times
        as many each time, so the bounds of the groups that cannot be the answer's (most of
        them: lower own scores) are seldom computed."""
        positions, columns = self.groups(size, sides[0], sides[1], sides)
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
        query = _Query(self, int(available.sum()), size, None)
        out = self.twice(candidates)
        for i, row in enumerate(available - candidates):
            value, exact = query.rest(query.state(row), 0, UNKNOWN)
            assert exact
            out[i] += value
        return out

    def partition(self, rest: IntArray, size: int) -> tuple[list[IntArray], IntArray]:
        """A best partition of ``rest`` (counts per class): its full groups and its leftover, as
        count vectors (for ``--explain``)."""
        query = _Query(self, int(rest.sum()), size, None)
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


UNKNOWN = 1 << 62
"""The cap of a state nothing above has bounded."""


@dataclass(frozen=True)
class _Entry:
    """A group of a small slice (:data:`FEW`), unpacked for Python."""

    position: int
    index: int
    twice: int
    disorder: int
    counts: tuple[int, ...]
    parts: tuple[int, ...]
    packed: int


@dataclass(slots=True)
class _State:
    """A count vector to partition: its counts, index (mixed-radix digits), total, memo key."""

    counts: tuple[int, ...]
    index: int
    total: int
    key: int

    @property
    def y(self) -> IntArray:
        return np.asarray(self.counts, dtype=np.int64)


@dataclass(frozen=True)
class _Arrays:
    """The states one group below a state, as arrays: the groups' positions (size-ordered
    list), their own scores (twice), the children's memo keys and twice an upper bound on each
    child's ``own + R`` (exact for children that hold at most one group: ``terminal``)."""

    positions: NDArray[np.intp]
    own: IntArray
    keys: NDArray[np.int32]
    bounds: IntArray
    terminal: NDArray[np.bool_]

    @staticmethod
    def of(items: list[Item]) -> _Arrays:
        """Children found in Python, as arrays."""
        bounds, exact, own, keys, positions = zip(*items, strict=True)
        return _Arrays(
            np.asarray(positions, dtype=np.intp),
            np.asarray(own, dtype=np.int64),
            np.asarray(keys, dtype=np.int32),
            np.asarray(bounds, dtype=np.int64),
            np.asarray(exact, dtype=np.bool_),
        )

    @staticmethod
    def join(parts: list[_Arrays]) -> _Arrays:
        return _Arrays(
            np.concatenate([p.positions for p in parts]),
            np.concatenate([p.own for p in parts]),
            np.concatenate([p.keys for p in parts]),
            np.concatenate([p.bounds for p in parts]),
            np.concatenate([p.terminal for p in parts]),
        )


Item = tuple[int, bool, int, int, int]
"""A child as the search walks it: (bound, exact, own score (twice), memo key, position)."""


@dataclass
class _Children:
    """The children worth trying, highest bound first (:data:`Item`). Children whose bound
    cannot beat the best exact one are left out. A search seldom tries more than a few, so they
    are listed (as Python) a few at a time: ``listed`` the first, ``pending`` the others, as
    indices into ``kids`` in runs; a run marked ordered is highest bound first, the others are
    sorted (the :data:`HEAD` highest first) when :meth:`items` gets to them. All the children of
    one run have higher bounds than those of later runs (one request's object: the memo of a
    :class:`_Query`)."""

    listed: list[Item]
    kids: _Arrays | None = None
    pending: list[tuple[NDArray[np.intp], bool]] = field(default_factory=list)
    count: int = FIRST
    _more: _Children | None = field(default=None, repr=False)

    @staticmethod
    def of(
        kids: _Arrays,
        kept: NDArray[np.intp] | None,
        ordered: bool = False,
        count: int = FIRST,
        pending: list[tuple[NDArray[np.intp], bool]] | None = None,
    ) -> _Children:
        """The children ``kept`` (indices into ``kids``; None: all; ``ordered``: already highest
        bound first), highest bound first (stable), the first ``count`` listed; ``pending``:
        runs of lower bounds still to come."""
        bounds = kids.bounds
        later = list(pending or [])
        if kept is None:
            kept = np.arange(len(bounds))
        if not ordered:
            if len(kept) > HEAD:
                values = bounds[kept]
                cut = np.partition(values, len(kept) - HEAD)[len(kept) - HEAD]
                later.insert(0, (kept[values < cut], False))
                kept = kept[values >= cut]
            kept = kept[np.argsort(-bounds[kept], kind="stable")]
        if len(kept) > count:
            later.insert(0, (kept[count:], True))
            kept = kept[:count]
        listed = zip(
            bounds[kept].tolist(),
            kids.terminal[kept].tolist(),
            kids.own[kept].tolist(),
            kids.keys[kept].tolist(),
            kids.positions[kept].tolist(),
            strict=True,
        )
        return _Children(list(listed), kids, later, count)

    @staticmethod
    def ranked(items: list[Item]) -> _Children:
        """The children worth trying of ``items`` (in the order they were found), in Python:
        those whose bound beats the best exact one, and the first exact one that has it,
        highest bound first (stable)."""
        floor = max((item[0] for item in items if item[1]), default=None)
        if floor is not None:
            kept: list[Item] = []
            tied = False
            for item in items:
                if item[0] > floor:
                    kept.append(item)
                elif item[0] == floor and item[1] and not tied:
                    kept.append(item)
                    tied = True
            items = kept
        items.sort(key=_down)
        return _Children(items)

    def items(self) -> Iterator[Item]:
        """Every child, highest bound first."""
        chunk: _Children | None = self
        while chunk is not None:
            yield from chunk.listed
            if chunk.pending and chunk._more is None:
                assert chunk.kids is not None
                (indices, ordered), *later = chunk.pending
                count = chunk.count * 4
                chunk._more = _Children.of(chunk.kids, indices, ordered, count, later)
            chunk = chunk._more


def _down(item: Item) -> int:
    return -item[0]


class _Query:
    """One request's search state: the group size, the bound's constants and the memo.

    ``rest(state, need, cap)`` is the search. ``cap`` is an upper bound on the state's R known
    from above (a state one group g below a state of R at most C has R at most ``C - f(g)``),
    so a state whose best meets its cap is solved without trying its other children."""

    def __init__(self, search: BranchSearch, gpus: int, size: int, deadline: float | None) -> None:
        self._search = search
        self._size = size
        self._deadline = deadline
        t = np.arange(gpus + 1, dtype=np.int64)
        whole, part = np.divmod(t, size)
        self._cmax = whole * (size * (size - 1)) + part * (part - 1)
        self._cmax_list: list[int] = self._cmax.tolist()
        self._memo = search.memo(size)
        self._expanded: dict[int, _Children] = {}  # each state's children, listed once

    def state(self, y: IntArray) -> _State:
        index = int(y @ self._search._stride)
        return _State(tuple(y.tolist()), index, int(y.sum()), int(self._search._keys[index]))

    def child(self, parent: _State, position: int, key: int) -> _State:
        search = self._search
        group = search._groups[position].tolist()
        counts = tuple(map(sub, parent.counts, group))
        index = parent.index - int(search._index[position])
        return _State(counts, index, parent.total - sum(group), key)

    def arrays(
        self,
        parent: _State,
        positions: NDArray[np.intp],
        k: int,
        columns: NDArray[np.int32] | None = None,
        starts: tuple[int, ...] | None = None,
    ) -> _Arrays:
        """The children through the groups of ``k`` GPUs at ``positions`` (``columns``: those
        groups' columns of the search, when already taken out; ``starts``: the parent's index
        in each part, when known)."""
        search = self._search
        if columns is None:
            own = search._twice[positions]
            index = parent.index - search._index[positions].astype(np.int64)
        else:
            own = columns[0]
            index = parent.index - columns[1]
        keys = search._keys[index]
        total = parent.total - k
        if total <= self._size:  # one group or none left: exact
            rest = search._twice[search._position[index]] if self._size > 1 else 0
            bounds = own + rest
        else:
            bounds = own + search._bound.of(
                parent,
                positions,
                total,
                self._size,
                self._cmax_list,
                search._groups,
                columns,
                starts,
            )
        terminal = np.full(len(positions), total <= self._size)
        return _Arrays(positions, own, keys, bounds, terminal)

    def ranked(
        self, kids: _Arrays, found: list[Item] | None = None, first: bool = True
    ) -> _Children:
        """The children worth trying (:class:`_Children`) from their arrays, and from those
        ``found`` in Python (listed before the arrays' when ``first``): none whose bound cannot
        beat the best exact one, but the first exact one that has it."""
        if found:
            both = [_Arrays.of(found), kids]
            kids = _Arrays.join(both if first else both[::-1])
        bounds, terminal = kids.bounds, kids.terminal
        if not terminal.any():
            return _Children.of(kids, None)
        floor = int(bounds[terminal].max())
        keep = bounds > floor
        keep[np.flatnonzero(terminal & (bounds == floor))[0]] = True
        return _Children.of(kids, np.flatnonzero(keep))

    def children(self, parent: _State) -> _Children:
        """The children through the groups holding the parent's first class (one per
        arrangement of twins): of the group size, and of the leftover's when one is due. Small
        slices of groups are walked in Python, the others with arrays."""
        done = self._expanded.get(parent.index)
        if done is not None:
            return done
        search = self._search
        counts = parent.counts
        first = next(c for c, count in enumerate(counts) if count)
        sizes = sorted({self._size, parent.total % self._size} - {0})
        equal = sum(1 << bit for bit, (c, d) in enumerate(search._pairs) if counts[c] == counts[d])
        starts = search._bound.starts(counts)
        few = [k for k in sizes if (k, first) in search._few]
        found = self._few(parent, few, first, equal, starts) if few else []
        if len(few) == len(sizes):
            done = _Children.ranked(found)
        else:
            high = np.int64(search._pack(list(counts)) | search._guard | search._ones)
            mask = np.int64(search._guard | equal << search._top)
            many = [
                self._fitting(parent, k, first, high, mask, starts) for k in sizes if k not in few
            ]
            kids = many[0] if len(many) == 1 else _Arrays.join(many)
            done = self.ranked(kids, found, bool(few) and few[0] == sizes[0])
        self._expanded[parent.index] = done
        return done

    def _fitting(
        self,
        parent: _State,
        k: int,
        first: int,
        high: np.int64,
        mask: np.int64,
        starts: tuple[int, ...],
    ) -> _Arrays:
        """The children through the groups of ``k`` GPUs that hold the parent's ``first`` class
        (one arrangement of twins with equal counts): :meth:`BranchSearch.groups` and
        :meth:`arrays` in one selection of the groups' columns. ``high``: the parent's counts
        packed, guard bits and disorder bits set; ``mask``: the guard bits and the bits of the
        twin pairs whose counts are equal (``BranchSearch._packed``)."""
        search = self._search
        row = k * (search._m + 1) + first
        lo, hi = int(search._slices[row]), int(search._slices[row + 1])
        picked = np.flatnonzero(((high - search._packed[lo:hi]) & mask) == mask)
        return self.arrays(parent, picked + lo, k, search._columns[:, lo:hi][:, picked], starts)

    def _few(
        self, parent: _State, sizes: list[int], first: int, equal: int, starts: tuple[int, ...]
    ) -> list[Item]:
        """The children through small slices of groups, in Python, in the order found (those
        exact ones that cannot be the first exact one of the best bound left out)."""
        search, size, counts = self._search, self._size, parent.counts
        guard = search._guard
        high = search._pack(list(counts)) | guard
        one, cmax = search._bound.one, self._cmax_list
        keys_of, twice, position = search._keys, search._twice, search._position
        found: list[Item] = []
        floor = -1
        for k in sizes:
            total = parent.total - k
            for entry in search._few[(k, first)]:
                if entry.disorder & equal:
                    continue
                if (high - entry.packed) & guard != guard:  # some class short (``_packed``)
                    continue
                index = parent.index - entry.index
                exact = total <= size
                if exact:
                    bound = entry.twice + (int(twice[position[index]]) if size > 1 else 0)
                    if bound <= floor:
                        continue
                    floor = bound
                else:
                    bound = entry.twice + one(starts, entry, counts, total, size, cmax)
                found.append((bound, exact, entry.twice, int(keys_of[index]), entry.position))
        return found

    def first_bound(self, state: _State) -> int:
        """An upper bound on the state's R to start the search with: what the memo knows of it
        (an earlier request may have solved it), else the highest bound of its children; 0
        where R needs no search."""
        if state.total <= self._size or self._size == 1:
            return 0
        known = self._memo.get(state.key)
        if known is not None:
            return known[0]
        return next(iter(self.children(state).items()))[0]

    def rest(self, state: _State, need: int, cap: int) -> tuple[int, bool]:
        """Twice R(y) and True; or, when R(y) < ``need``, possibly an upper bound below ``need``
        and False. ``cap``: an upper bound on R(y) (twice)."""
        known = self._memo.get(state.key)
        if known is not None and (known[1] or known[0] < need):
            return known
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise OutOfTime
        if state.total <= self._size or self._size == 1:
            value = 0 if self._size == 1 else int(self._search.twice(state.y[None, :])[0])
            result = (value, True)
        else:
            if known is not None:
                cap = min(cap, known[0])
            best, upper = self.best_child(state, self.children(state), need, -1, cap)
            result = (best, True) if upper <= best else (upper, False)
        self._memo[state.key] = result
        return result

    def best_child(
        self, parent: _State, children: _Children, need: int, best: int, cap: int
    ) -> tuple[int, int]:
        """Over the children: the best exact ``own + R(child)`` (at least ``best``) and an upper
        bound on the children not solved exactly (-1 when every one that could beat the best
        was). No child scores more than ``cap``."""
        upper = -1
        memo = self._memo
        for bound, exact, f, key, position in children.items():
            bound = min(bound, cap)
            if bound <= best:
                break  # no child left can beat the best
            if exact:  # its bound is its value
                best = bound
                continue
            if bound < need:
                upper = max(upper, bound)
                break  # none left can reach what the caller needs
            known = memo.get(key)
            if known is not None and not known[1]:  # a bound learnt below: tighter
                if known[0] + f <= best:
                    continue
                if known[0] + f < need:
                    upper = max(upper, known[0] + f)
                    continue
            child = self.child(parent, position, key)
            value, solved = self.rest(child, max(need, best + 1) - f, bound - f)
            if solved:
                best = max(best, value + f)
            elif value + f > best:
                upper = max(upper, value + f)
        return best, upper

    def best_group(self, state: _State, value: int) -> IntArray:
        """A group g holding y's first class with ``f(g) + R(y - g) = value`` (``value`` = R(y))."""
        children = self.children(state)
        for _, _, f, key, position in children.items():
            child, exact = self.rest(self.child(state, position, key), value - f, value - f)
            if exact and child + f == value:
                found: IntArray = self._search._groups[position].astype(np.int64)
                return found
        raise AssertionError("R(y) is reached by some group")


def _sorted_down(columns: list[NDArray[np.int8]]) -> list[NDArray[np.int8]]:
    """The columns' values sorted down in each row (the first column the highest): an odd-even
    transposition network, a few element-wise max/min over whole columns rather than a sort per
    row of a few values."""
    out = list(columns)
    for step in range(len(out)):
        for i in range(step % 2, len(out) - 1, 2):
            out[i], out[i + 1] = np.maximum(out[i], out[i + 1]), np.minimum(out[i], out[i + 1])
    return out


def _twin_sets(scores: IntArray, sizes: list[int]) -> list[list[int]]:
    """Sets of two or more interchangeable classes: the same score to every other class, the
    same score inside (and both of one GPU, or both of more: a class of one GPU has no inside
    score)."""
    m = len(sizes)
    out: list[list[int]] = []
    placed: set[int] = set()
    for c in range(m):
        if c in placed:
            continue
        same = [c]
        for d in range(c + 1, m):
            if d in placed or scores[c, c] != scores[d, d] or (sizes[c] > 1) != (sizes[d] > 1):
                continue
            if all(scores[c, e] == scores[d, e] for e in range(m) if e not in (c, d)):
                same.append(d)
                placed.add(d)
        if len(same) > 1:
            out.append(same)
    return out


def _reaching(candidates: Iterator[_Arrays], opt: int) -> Iterator[tuple[_Arrays, int, list[int]]]:
    """The candidates whose bound reaches ``opt``, a tier of one own score at a time, highest
    first (``candidates`` come in whole tiers, highest first): their arrays, the own score and
    the tier's indices into them."""
    for kids in candidates:
        near = np.flatnonzero(kids.bounds >= opt)
        for f in sorted(set(kids.own[near].tolist()), reverse=True):
            yield kids, f, near[kids.own[near] == f].tolist()


def _blocks(sides: list[list[int]], twins: list[list[int]]) -> list[list[int]]:
    """The sets of two or more twin classes whose counts are equal on every side: the classes
    whose counts a group's arrangements permute (:meth:`BranchSearch.groups`)."""
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
    """Every arrangement of each group (the inverse of :meth:`BranchSearch.groups`' choice of
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
