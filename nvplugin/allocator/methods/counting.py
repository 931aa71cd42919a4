"""Count vectors as GPUs, for the methods that work on classes of twins: which group of a count
vector a request gets (the must-include GPUs and the lowest other free ones per class), the lex
key the branch search orders groups by, and the explanation of a group: the best partition that
holds it and the contenders, one group per composition of the classes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from nvplugin.allocator.base import Allocation, Request
from nvplugin.allocator.methods.base import POLICY
from nvplugin.allocator.methods.classes import Classes
from nvplugin.node.model import Topology

IntArray = NDArray[np.int64]

ALL_CONTENDERS = 4096
"""Most compositions an explanation checks one by one to list every contender; beyond it only
those with the best own score are listed."""

LexKey = Callable[[IntArray], NDArray[np.uint64]]
"""For count vectors (rows), a key that orders their groups lexicographically: higher first. It
is made of one part per class, each on bits of its own (the class's GPUs in a group, as a mask
with the lowest GPU highest), so a vector's key rises with each class's part alone."""


class CountSearch(Protocol):
    """What an explanation asks of an exact search over count vectors (twice the scores, so
    pairs count whole)."""

    @property
    def classes(self) -> Classes: ...

    def twice(self, x: IntArray) -> IntArray:
        """Twice the score of each group (count vector) in ``x``."""
        ...

    def totals(self, available: IntArray, candidates: IntArray, size: int) -> IntArray:
        """Twice the best score of a partition of ``available`` that has each candidate as a
        full group."""
        ...

    def partition(self, rest: IntArray, size: int) -> tuple[list[IntArray], IntArray]:
        """A best partition of ``rest``: its full groups and its leftover, as count vectors."""
        ...


def free_per_class(classes: Classes, request: Request) -> list[list[int]]:
    """Per class, its available GPUs that are not must-include, lowest first."""
    required = set(request.must_include)
    out: list[list[int]] = [[] for _ in range(len(classes))]
    for gpu in request.available:
        if gpu not in required:
            out[classes.of[gpu]].append(gpu)
    return out


def members(
    request: Request, vectors: IntArray, taken: IntArray, free: list[list[int]]
) -> list[tuple[int, ...]]:
    """For each count vector, the lex-smallest group with those GPUs per class: the
    must-include GPUs, then in each class the lowest other available ones (``taken``: the
    must-include GPUs per class; ``free``: :func:`free_per_class`)."""
    out = []
    for vector in (vectors - taken).tolist():
        chosen = list(request.must_include)
        for c, k in enumerate(vector):
            chosen.extend(free[c][:k])
        out.append(tuple(sorted(chosen)))
    return out


def lex_key(gpus: int, request: Request, taken: IntArray, free: list[list[int]]) -> LexKey:
    """For count vectors, a key that is higher the lex-smaller their groups (R plus the lowest other
    available GPUs per class) on a node of ``gpus`` GPUs: sorted index tuples of one length compare
    as their bit-reversed masks do, in reverse. ``taken``: the must-include GPUs per class;
    ``free``: :func:`free_per_class`. Its table is made at the first call (most requests make none:
    only groups whose twins can be arranged in more than one way are compared)."""
    top = gpus - 1

    @functools.cache
    def table() -> tuple[NDArray[np.uint64], NDArray[np.intp], np.uint64]:
        prefix: list[list[int]] = []
        for pool in free:
            chain = [0]
            for gpu in pool:
                chain.append(chain[-1] | 1 << (top - gpu))
            prefix.append(chain)
        # One row per class (padded), looked up for every class of every vector at once.
        width = max(len(chain) for chain in prefix)
        rows = np.zeros((len(prefix), width), dtype=np.uint64)
        for c, chain in enumerate(prefix):
            rows[c, : len(chain)] = chain
        base = np.uint64(sum(1 << (top - gpu) for gpu in request.must_include))
        return rows, np.arange(len(prefix)), base

    def key(vectors: IntArray) -> NDArray[np.uint64]:
        rows, classes, base = table()
        parts = rows[classes, vectors - taken]
        out: NDArray[np.uint64] = np.bitwise_or.reduce(parts, axis=1) | base
        return out

    return key


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


def explain(
    search: CountSearch,
    topology: Topology,
    request: Request,
    group: tuple[int, ...],
    *,
    contenders: bool,
) -> Allocation:
    """``group``'s score and the best partition of the available GPUs holding it; with
    ``contenders`` (``group`` is then the answer), one group per composition of the classes
    that reaches OPT, best own score first (all of them up to :data:`ALL_CONTENDERS`
    compositions, else those of the answer's own score)."""
    classes = search.classes
    s = request.size
    available = classes.counts(request.available)
    x = classes.counts(group)
    total = int(search.totals(available, x[None, :], s)[0]) // 2
    full, leftover = search.partition(available - x, s)
    pools: list[list[int]] = [[] for _ in range(len(classes))]
    for gpu in request.available:
        if gpu not in group:
            pools[classes.of[gpu]].append(gpu)

    def take(counts: IntArray) -> tuple[int, ...]:
        out: list[int] = []
        for c, k in enumerate(counts.tolist()):
            out.extend(pools[c][:k])
            del pools[c][:k]
        return tuple(sorted(out))

    others = sorted((take(g) for g in full), key=lambda g: g[0])
    chosen = tuple(sorted(group))
    own = topology.group_score(chosen)
    answer = Allocation(POLICY, chosen, own, total, (chosen, *others), take(leftover))
    if not contenders:
        return answer
    required = classes.counts(request.must_include)
    candidates = compositions(required, available, s)
    complete = len(candidates) <= ALL_CONTENDERS
    if not complete:
        candidates = candidates[search.twice(candidates) == 2 * own]
    best = candidates[search.totals(available, candidates, s) == 2 * total]
    ranked = sorted(
        zip(
            members(request, best, required, free_per_class(classes, request)),
            (search.twice(best) // 2).tolist(),
            strict=True,
        ),
        key=lambda item: (-item[1], item[0]),
    )
    note = "one group per composition of the node's classes of interchangeable GPUs"
    if not complete:
        note += "; only compositions with the best own score are listed"
    return dataclasses.replace(answer, contenders=tuple(ranked), contenders_note=note)
