"""Subset tables that make the exact best-effort objective a handful of array operations, and
the ``tables`` method, which builds them at start-up on nodes of up to :data:`TABLE_GPUS` GPUs.

A set of GPUs is a bitmask (bit i = GPU i) of a node's n GPUs. For the objective in
docs/allocation.md two numbers per subset are enough:

- ``setscore[m]``: the sum of pair scores inside m.
- ``rest[s][m]``: the best score of a partition of m into groups of exactly s plus one leftover
  group of ``popcount(m) mod s`` GPUs (whose pairs count too).

A full group G (|G| = s) of the available set A then belongs to a best partition of A that
contains it with score ``setscore[G] + rest[s][A ^ G]`` (the rest of such a partition is a
partition of A \\ G with the same leftover size), so OPT is the maximum of that over every G
with R ⊆ G ⊆ A, and the answer is read off the same numbers: no partition is enumerated.

``rest[s]`` comes from a lowest-element-first recurrence: the lowest GPU of m is either in a full
group G (``setscore[G] + rest[s][m ^ G]``) or, when r = popcount(m) mod s > 0, in the leftover L
(``setscore[L] + rest[s][m ^ L]``; that remainder divides by s, so it is an exact partition).
Each popcount level depends only on lower ones, so a level is one vectorised step over all its
masks. Special cases that need no recurrence: s = 1 (every partition scores 0), popcount < s
(the whole set is the leftover: ``setscore``), and s > n/2 (A \\ G has fewer than s GPUs, so
``rest`` is ``setscore``). A query only ever reads ``rest[s]`` at popcount <= n - s, so levels
above that are left as ``setscore`` and must not be read.

For 16 GPUs the tables are nine int64 arrays over the 2^16 masks (setscore, and sizes 1..8);
``bench/bench_allocator.py`` measures their size and build time.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from nvplugin.allocator.base import OutOfTime
from nvplugin.allocator.methods.base import warmed
from nvplugin.allocator.methods.smalltables import TablesMethod, split
from nvplugin.node.model import Topology

IntArray = NDArray[np.int64]

TABLE_GPUS = 16
"""Largest node whose tables are built once at start-up (2^16 masks), and the most available
GPUs the ``search`` method builds tables over for one request."""

_CHUNK = 1 << 17
"""Elements per temporary (masks x candidate groups) matrix, so peak memory stays small."""


def _check(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise OutOfTime


def set_scores(scores: Sequence[Sequence[int]]) -> IntArray:
    """``setscore`` for all 2^n masks: a mask whose highest bit is b scores its lower part plus
    b's pair scores with the lower members (a subset sum of row b, built by doubling)."""
    n = len(scores)
    table = np.zeros(1 << n, dtype=np.int64)
    for b in range(1, n):
        half = 1 << b
        row = np.zeros(half, dtype=np.int64)
        for j in range(b):
            step = 1 << j
            row[step : 2 * step] = row[:step] + scores[b][j]
        table[half : 2 * half] = table[:half] + row
    return table


def popcounts(n: int) -> NDArray[np.uint8]:
    counts = np.zeros(1 << n, dtype=np.uint8)
    for j in range(n):
        step = 1 << j
        counts[step : 2 * step] = counts[:step] + 1
    return counts


def _members(masks: IntArray, n: int, k: int) -> IntArray:
    """(len(masks), k) matrix of each mask's member bits, lowest first."""
    bits = (masks[:, None] >> np.arange(n, dtype=np.int64)) & 1
    _, cols = np.nonzero(bits)  # row-major: each row's set bits ascending
    return (np.int64(1) << cols.astype(np.int64)).reshape(len(masks), k)


def _best_with_lowest(
    rest: IntArray,
    setscore: IntArray,
    masks: IntArray,
    members: IntArray,
    size: int,
    deadline: float | None,
) -> IntArray:
    """For each mask: max over groups g of ``size`` that contain its lowest member of
    ``setscore[g] + rest[mask ^ g]``."""
    k = members.shape[1]
    others = np.array(list(itertools.combinations(range(1, k), size - 1)), dtype=np.intp)
    if others.ndim == 1:  # size 1: the single empty combination
        others = others.reshape(1, 0)
    count = len(others)
    out = np.empty(len(masks), dtype=np.int64)
    step = max(1, _CHUNK // count)
    for start in range(0, len(masks), step):
        _check(deadline)
        block = members[start : start + step]
        groups = np.repeat(block[:, :1], count, axis=1)
        for t in range(size - 1):
            groups |= block[:, others[:, t]]
        remainder = masks[start : start + step, None] ^ groups
        out[start : start + step] = (setscore[groups] + rest[remainder]).max(axis=1)
    return out


def levels(
    counts: NDArray[np.uint8], n: int, sizes: Sequence[int]
) -> dict[int, tuple[IntArray, IntArray]]:
    """Per popcount k that the tables of ``sizes`` read: the masks with k members and their
    member bits (``_members``). Every size reads the same levels, so they are made once."""
    wanted = sorted({k for s in sizes if 1 < s <= n // 2 for k in range(s, n - s + 1)})
    out = {}
    for k in wanted:
        masks = np.flatnonzero(counts == k).astype(np.int64)
        out[k] = (masks, _members(masks, n, k))
    return out


def partition_table(
    setscore: IntArray,
    by_count: Mapping[int, tuple[IntArray, IntArray]],
    n: int,
    s: int,
    deadline: float | None = None,
) -> IntArray:
    """``rest[s]`` (module docstring), exact for every mask of popcount <= n - s, from the
    :func:`levels`; raises :class:`OutOfTime` past ``deadline``."""
    if s == 1:
        return np.zeros_like(setscore)
    rest = setscore.copy()
    for k in range(s, n - s + 1):
        masks, members = by_count[k]
        best = _best_with_lowest(rest, setscore, masks, members, s, deadline)
        r = k % s
        if r:
            best = np.maximum(best, _best_with_lowest(rest, setscore, masks, members, r, deadline))
        rest[masks] = best
    return rest


def groups_in_lex_order(counts: NDArray[np.uint8], n: int, s: int) -> IntArray:
    """Every s-subset of the n GPUs as a mask, in lexicographic order of its sorted indices
    (``itertools.combinations`` order), so the first of any filtered run is the lex-smallest.

    For equal-size sets that order is the descending order of the bit-reversed mask: the first
    index where two sorted tuples differ is the highest differing bit once reversed.
    """
    masks = np.flatnonzero(counts == s).astype(np.int64)
    reversed_ = np.zeros_like(masks)
    for j in range(n):
        reversed_ |= ((masks >> j) & 1) << (n - 1 - j)
    return masks[np.argsort(-reversed_, kind="stable")]


@dataclass(frozen=True)
class Tables:
    """The tables for a set of n GPUs (indices 0..n-1) and the group sizes asked for."""

    n: int
    setscore: IntArray
    rest: dict[int, IntArray]
    groups: dict[int, IntArray]

    @classmethod
    def build(
        cls,
        scores: Sequence[Sequence[int]],
        sizes: Sequence[int],
        deadline: float | None = None,
    ) -> Tables:
        """The tables for ``sizes``; raises :class:`OutOfTime` once past ``deadline``
        (``time.monotonic()``), so a caller with a time budget can stop an exact build."""
        n = len(scores)
        setscore = set_scores(scores)
        counts = popcounts(n)
        by_count = levels(counts, n, sizes)
        rest: dict[int, IntArray] = {}
        groups: dict[int, IntArray] = {}
        for s in sizes:
            rest[s] = setscore if 2 * s > n else partition_table(setscore, by_count, n, s, deadline)
            groups[s] = groups_in_lex_order(counts, n, s)
        return cls(n, setscore, rest, groups)

    @property
    def nbytes(self) -> int:
        tables = {id(a): a for a in (self.setscore, *self.rest.values(), *self.groups.values())}
        return sum(a.nbytes for a in tables.values())

    def candidates(
        self, available: int, required: int, s: int
    ) -> tuple[IntArray, IntArray, IntArray]:
        """The s-subsets of ``available`` that contain ``required``, in lex order, with each
        one's own score and the best score of a partition of ``available`` containing it."""
        groups = self.groups[s]
        ok = (groups & ~available) == 0
        if required:
            ok &= (groups & required) == required
        chosen = groups[ok]
        own = self.setscore[chosen]
        return chosen, own, own + self.rest[s][available ^ chosen]

    def best_group(self, available: int, required: int, s: int) -> tuple[int, int, int] | None:
        """The answer for a well-formed, possible request: (group mask, group score, OPT).

        OPT is the best total over the candidates; among groups reaching it the highest own
        score wins, and ``argmax`` takes the first (lex-smallest) of those.
        """
        chosen, own, total = self.candidates(available, required, s)
        if not len(chosen):
            return None
        opt = total.max()
        pick = int(np.where(total == opt, own, -1).argmax())
        return int(chosen[pick]), int(own[pick]), int(opt)

    def ranked(self, available: int, required: int, s: int) -> list[tuple[int, int]]:
        """Every group reaching OPT as (group, own score), best own score first, then lex."""
        chosen, own, total = self.candidates(available, required, s)
        if not len(chosen):
            return []
        optimal = total == total.max()
        found = zip(chosen[optimal].tolist(), own[optimal].tolist(), strict=True)
        return sorted(found, key=lambda item: -item[1])  # stable: lex order within a score

    def split(self, mask: int, s: int) -> tuple[list[int], int]:
        """A best partition of ``mask`` (popcount <= n - s): its full groups and its leftover,
        as masks (:func:`nvplugin.allocator.methods.smalltables.split`)."""
        return split(self.setscore, self.rest[s], mask, s)


class TableMethod(TablesMethod):
    """The ``tables`` method on nodes of :data:`TABLE_GPUS` GPUs or fewer: the tables of every
    size, built at start-up."""

    @classmethod
    def build(cls, topology: Topology) -> TableMethod | None:
        n = len(topology)
        if n > TABLE_GPUS:
            return None
        tables = Tables.build(topology.scores, range(1, n + 1))
        return warmed(cls(tables), n, [max(1, n // 2)])
