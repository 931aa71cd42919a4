"""What the branch search (:mod:`nvplugin.allocator.methods.branch`) works out once per node, as
one frozen value its requests only read: every count vector below the class sizes, ordered so that
the groups of one size and first class are one slice, each with its score, memo key, twin order
and index in the bound's parts, and packed so that a state's test of fit is one subtraction.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from nvplugin.allocator.methods.classes import Classes
from nvplugin.allocator.methods.countbound import CHUNK, CountBound

IntArray = NDArray[np.int64]

MAX_VECTORS = 5**8
"""Most count vectors (the product of class sizes + 1) whose groups are listed at start-up: 32
GPUs in 8 classes never exceed it (docs/allocation.md has what they hold in memory)."""

FEW = 48
"""Most groups a node's slice may have to be walked in Python rather than with arrays."""


@dataclass(frozen=True)
class Entry:
    """A group of a small slice (:data:`FEW`), unpacked for Python."""

    position: int
    index: int
    twice: int
    disorder: int
    counts: tuple[int, ...]
    parts: tuple[int, ...]
    packed: int


@dataclass(frozen=True, eq=False, slots=True)
class Layout:
    """The count vectors of one node's classes and what the search reads of each (:meth:`build`).

    ``groups`` are the vectors ordered by size and then by first class (``slices``: where the
    groups of size k and first class c start, at row ``k * (m + 1) + c``); ``position`` the
    place in that order of the vector whose mixed-radix digits (``stride``) are i; ``keys`` the
    memo key of each vector (the same for vectors that differ by a permutation of twin classes'
    counts). ``columns`` holds, per group, twice its score (``twice_column``), its index
    (``index``), which pairs of twins it takes out of order (``disorder``, a bit per pair of
    ``pairs``) and its index in each tabulated part of the ``bound``. ``packed`` is each group
    as one integer (:meth:`build`), ``few`` the small slices unpacked for Python."""

    m: int
    scores: IntArray
    inner: IntArray
    twins: tuple[tuple[int, ...], ...]
    pairs: tuple[tuple[int, int], ...]
    stride: IntArray
    keys: NDArray[np.int32]
    groups: NDArray[np.int8]
    slices: NDArray[np.intp]
    position: NDArray[np.int32]
    bound: CountBound
    columns: NDArray[np.int32]
    twice_column: NDArray[np.int32]
    index: NDArray[np.int32]
    disorder: NDArray[np.int32]
    width: int
    top: int
    guard: int
    ones: int
    packed: IntArray
    few: Mapping[tuple[int, int], list[Entry]]

    @classmethod
    def build(cls, classes: Classes) -> Layout:
        sizes = [len(members) for members in classes.members]
        m = len(sizes)
        scores = classes.scores.astype(np.int64)
        inner = np.diag(scores).copy()
        twins = _twin_sets(scores, sizes)
        pairs = tuple(pair for same in twins for pair in itertools.pairwise(same))
        # Every count vector below the class sizes (row i: the vector whose mixed-radix digits
        # are i), and the memo key of each: the same for vectors that differ by a permutation
        # of twin classes' counts. Worked through in chunks, so start-up memory stays a few MB
        # above what is kept.
        # The key is the index of one arrangement: the counts sorted down, given to the twins
        # in decreasing size (it fits: the k-th largest count is at most the k-th largest size).
        grid = np.indices([size + 1 for size in sizes], dtype=np.int8).reshape(m, -1).T
        stride = np.cumprod([1] + [size + 1 for size in sizes[:0:-1]])[::-1].astype(np.int64)
        keys = np.empty(len(grid), dtype=np.int32)
        by_size = [sorted(same, key=lambda c: -sizes[c]) for same in twins]
        for start in range(0, len(grid), CHUNK):
            columns = list(grid[start : start + CHUNK].T)  # one class's counts each (int8)
            for same, ranked in zip(twins, by_size, strict=True):
                for c, count in zip(ranked, _sorted_down([columns[d] for d in same]), strict=True):
                    columns[c] = count
            key = np.zeros(len(columns[0]), dtype=np.int64)
            for c, count in enumerate(columns):
                key += count.astype(np.int64) * stride[c]
            keys[start : start + CHUNK] = key
        # The same vectors ordered by size and then by first class, so the groups of size k
        # whose first class is c are one slice; with each one's index above, twice its score
        # and which pairs of twins it takes out of order (a bit per pair).
        total = grid.sum(axis=1, dtype=np.int32)
        first = np.where(total > 0, np.argmax(grid > 0, axis=1), m).astype(np.int32)
        sort_keys = total * np.int32(m + 1) + first
        order = np.argsort(sort_keys, kind="stable")
        groups = np.ascontiguousarray(grid[order])
        slices = np.searchsorted(sort_keys[order], np.arange((sum(sizes) + 1) * (m + 1) + 1))
        position = np.empty(len(order), dtype=np.int32)
        position[order] = np.arange(len(order), dtype=np.int32)
        del grid, total, first, sort_keys
        bound = CountBound(scores, sizes)
        # What a state's children need of each group, one column per group (int32): twice its
        # score, its index, which pairs of twins it takes out of order (a bit per pair) and its
        # index in each tabulated part, so the groups that fit a state are taken out with one
        # array operation. Filled in place, a chunk at a time (no second copy at start-up).
        tabulated = [part for part in bound.parts if part.tabulated]
        table = np.zeros((3 + len(tabulated), len(groups)), dtype=np.int32)
        twice, index, disorder = table[:3]
        index[:] = order
        del order
        for row, part in enumerate(tabulated, start=3):
            part.index, part.row = table[row], row
        for start in range(0, len(groups), CHUNK):
            chunk = groups[start : start + CHUNK].astype(np.int64)
            twice[start : start + CHUNK] = _twice(scores, inner, chunk)
            for bit, (c, d) in enumerate(pairs):
                flags = (chunk[:, c] < chunk[:, d]).astype(np.int32) << bit
                disorder[start : start + CHUNK] |= flags
            for part in tabulated:
                part.index[start : start + CHUNK] = chunk[:, part.classes] @ part.stride
        if len(tabulated) == len(bound.parts):
            bound.rows = slice(3, 3 + len(tabulated))  # filled in this order above
        # Each group packed into one integer, a digit of ``width`` bits per class with the top
        # bit of each digit kept clear: ``g <= y`` digit by digit is then one subtraction
        # (``(y | guard) - g`` keeps every guard bit exactly when no digit of g exceeds y's).
        # Above the digits, its disorder bits: from a field of ones they subtract without a
        # borrow, leaving the bits the group does *not* take out of order, so a state's test
        # of fit and of twin order is one subtraction, one mask and one comparison
        # (:meth:`nvplugin.allocator.methods.branchquery.Query.children`).
        width = max(sizes).bit_length() + 1
        top = width * m
        assert top + len(pairs) < 63, "eight classes of at most 32 GPUs fit"
        shift = np.arange(m, dtype=np.int64) * width
        guard = sum(1 << (width * c + width - 1) for c in range(m))
        ones = ((1 << len(pairs)) - 1) << top
        packed = np.empty(len(groups), dtype=np.int64)
        for start in range(0, len(groups), CHUNK):
            chunk = groups[start : start + CHUNK].astype(np.int64)
            flags = disorder[start : start + CHUNK].astype(np.int64) << top
            packed[start : start + CHUNK] = (chunk << shift).sum(axis=1) | flags
        # Slices of a few groups are walked in Python (cheaper than a dozen array operations).
        few: dict[tuple[int, int], list[Entry]] = {}
        for size in range(sum(sizes) + 1):
            for lead in range(m):
                row = size * (m + 1) + lead
                lo, hi = int(slices[row]), int(slices[row + 1])
                if 0 < hi - lo <= FEW:
                    few[(size, lead)] = [
                        Entry(
                            p,
                            int(index[p]),
                            int(twice[p]),
                            int(disorder[p]),
                            tuple(groups[p].tolist()),
                            bound.indices(p),
                            int(packed[p]) & ((1 << top) - 1),
                        )
                        for p in range(lo, hi)
                    ]
        return cls(
            m,
            scores,
            inner,
            tuple(tuple(same) for same in twins),
            pairs,
            stride,
            keys,
            groups,
            slices,
            position,
            bound,
            table,
            twice,
            index,
            disorder,
            width,
            top,
            guard,
            ones,
            packed,
            few,
        )

    @property
    def nbytes(self) -> int:
        arrays = (self.groups, self.position, self.keys, self.packed, self.columns)
        return sum(a.nbytes for a in arrays) + self.bound.nbytes

    def twice(self, x: IntArray) -> IntArray:
        """Twice the score of each group (count vector) in ``x``."""
        return _twice(self.scores, self.inner, x)

    def pack(self, counts: list[int]) -> int:
        """A count vector as one integer (see ``packed``)."""
        return sum(count << (self.width * c) for c, count in enumerate(counts))

    def fitting(
        self, size: int, high: list[int], low: list[int], sides: list[list[int]]
    ) -> tuple[NDArray[np.intp], NDArray[np.int32]]:
        """Positions (in the size-ordered list) of the count vectors of ``size`` GPUs between
        ``low`` and ``high``, one arrangement of the counts of twins that are equal on every side
        in ``sides`` (non-increasing there), and their columns (``columns``)."""
        # Only the slices of groups whose first class is one ``high`` has, up to ``low``'s first.
        row = size * (self.m + 1)
        first = next((c for c, count in enumerate(high) if count), self.m)
        last = next((c for c, count in enumerate(low) if count), self.m)
        lo, hi = int(self.slices[row + first]), int(self.slices[row + last + 1])
        packed = self.packed[lo:hi]
        equal = sum(
            1 << bit
            for bit, (c, d) in enumerate(self.pairs)
            if all(side[c] == side[d] for side in sides)
        )
        mask = np.int64(self.guard | equal << self.top)  # fit and twin order (``packed``)
        fits = ((np.int64(self.pack(high) | self.guard | self.ones) - packed) & mask) == mask
        if any(low):
            guard = np.int64(self.guard)
            fits &= (((packed | guard) - np.int64(self.pack(low))) & guard) == guard
        picked = np.flatnonzero(fits)
        return picked + lo, self.columns[:, lo:hi][:, picked]


def _twice(scores: IntArray, inner: IntArray, x: IntArray) -> IntArray:
    result: IntArray = ((x @ scores) * x).sum(axis=-1) - x @ inner
    return result


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
