"""Slow references the fast best-effort policy is checked against.

:class:`BruteForce` follows docs/allocation.md word for word: it lists every partition of the
available GPUs and reads OPT and the answer off that list. It is only feasible up to ~10 GPUs.
:class:`MemoSearch` is for the 16-GPU node: a plain memoised recursion over sets (highest GPU
first, Python integers, no tables), written independently of ``nvplugin.allocator.methods.tables``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from nvplugin.node.model import Topology

Group = tuple[int, ...]


def impossible(available: Sequence[int], must_include: Sequence[int], size: int) -> bool:
    """docs/allocation.md's well-formed requests without an answer (the policy answers [])."""
    return size == 0 or size > len(available) or len(must_include) > size


def partitions(items: Sequence[int], s: int) -> Iterator[tuple[tuple[Group, ...], Group]]:
    """Every partition of ``items`` into ``len // s`` groups of ``s`` plus a leftover group of
    ``len % s``, each exactly once, as (full groups, leftover)."""
    r = len(items) % s
    for leftover in itertools.combinations(items, r):
        rest = tuple(i for i in items if i not in leftover)
        for groups in _groupings(rest, s):
            yield groups, leftover


def _groupings(items: Group, s: int) -> Iterator[tuple[Group, ...]]:
    """Every way to cut ``items`` (a multiple of s long) into groups of s, each once: the first
    item's group is chosen, then the rest is cut the same way."""
    if not items:
        yield ()
        return
    first, others = items[0], items[1:]
    for mates in itertools.combinations(others, s - 1):
        remaining = tuple(i for i in others if i not in mates)
        for tail in _groupings(remaining, s):
            yield ((first, *mates), *tail)


class BruteForce:
    """docs/allocation.md's objective by listing partitions (memoised per available set and
    size)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._best: dict[tuple[Group, int], dict[Group, int]] = {}

    def best_partition_per_group(self, available: Group, s: int) -> dict[Group, int]:
        """For every full group that appears in some partition of ``available``: the best
        score of a partition that contains it."""
        key = (available, s)
        if key not in self._best:
            best: dict[Group, int] = {}
            score = self.topology.group_score
            for groups, leftover in partitions(available, s):
                total = sum(score(g) for g in groups) + score(leftover)
                for g in groups:
                    if best.get(g, -1) < total:
                        best[g] = total
            self._best[key] = best
        return self._best[key]

    def answer(self, available: Sequence[int], must_include: Sequence[int], size: int) -> list[int]:
        """The answer for a well-formed request ([] when impossible)."""
        avail = tuple(sorted(available))
        if impossible(avail, must_include, size):
            return []
        best = self.best_partition_per_group(avail, size)
        fitting = {g: v for g, v in best.items() if set(must_include) <= set(g)}
        opt = max(fitting.values())
        in_optimal = [g for g, v in fitting.items() if v == opt]
        top = max(self.topology.group_score(g) for g in in_optimal)
        return list(min(g for g in in_optimal if self.topology.group_score(g) == top))

    def opt(self, available: Sequence[int], must_include: Sequence[int], size: int) -> int:
        best = self.best_partition_per_group(tuple(sorted(available)), size)
        return max(v for g, v in best.items() if set(must_include) <= set(g))


class MemoSearch:
    """The same objective by memoised search over subsets, feasible on 16 GPUs."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._scores: dict[int, int] = {}
        self._rest: dict[tuple[int, int], int] = {}

    def members(self, mask: int) -> list[int]:
        return [i for i in range(len(self.topology)) if mask >> i & 1]

    def score(self, mask: int) -> int:
        if mask not in self._scores:
            self._scores[mask] = self.topology.group_score(self.members(mask))
        return self._scores[mask]

    def rest(self, mask: int, s: int) -> int:
        """Best score of splitting ``mask`` into groups of s plus one leftover group."""
        key = (mask, s)
        if key in self._rest:
            return self._rest[key]
        count = mask.bit_count()
        if count <= s:
            value = self.score(mask)
        else:
            top = mask.bit_length() - 1
            below = self.members(mask & ~(1 << top))
            value = -1
            for size in {s, count % s} - {0}:
                for mates in itertools.combinations(below, size - 1):
                    group = (1 << top) | sum(1 << m for m in mates)
                    value = max(value, self.score(group) + self.rest(mask & ~group, s))
        self._rest[key] = value
        return value

    def answer(self, available: Sequence[int], must_include: Sequence[int], size: int) -> list[int]:
        avail = sorted(available)
        if impossible(avail, must_include, size):
            return []
        all_mask = sum(1 << i for i in avail)
        best: tuple[int, int] | None = None
        chosen: Group = ()
        for group in itertools.combinations(avail, size):  # lexicographic order
            if not set(must_include) <= set(group):
                continue
            mask = sum(1 << i for i in group)
            own = self.score(mask)
            key = (own + self.rest(all_mask & ~mask, size), own)
            if best is None or key > best:  # strictly better only: the first (lex) tie stays
                best, chosen = key, group
        return list(chosen)


class CountReference:
    """The same objective on a node of twin classes, by plain memoised recursion over count
    vectors (no bounds, no shapes, no convexity): for nodes too large for :class:`MemoSearch`.

    ``classes`` are the GPU index lists of the twin classes and ``scores[c][d]`` the class pair
    scores (diagonal: inside a class), both written down by the test, not derived by the code
    under test.
    """

    def __init__(self, classes: Sequence[Sequence[int]], scores: Sequence[Sequence[int]]) -> None:
        self.classes = [tuple(c) for c in classes]
        self.scores = scores
        self._rest: dict[tuple[tuple[int, ...], int], int] = {}

    def score(self, x: Sequence[int]) -> int:
        m = len(x)
        total = sum(self.scores[c][c] * x[c] * (x[c] - 1) // 2 for c in range(m))
        return total + sum(
            self.scores[c][d] * x[c] * x[d] for c in range(m) for d in range(c + 1, m)
        )

    def groups(self, y: tuple[int, ...], k: int, first: int) -> Iterator[tuple[int, ...]]:
        """Every count vector g <= y with |g| = k and g[first] >= 1."""

        def extend(c: int, left: int, prefix: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
            if c == len(y):
                if left == 0:
                    yield prefix
                return
            low = 1 if c == first else 0
            for v in range(low, min(y[c], left) + 1):
                yield from extend(c + 1, left - v, (*prefix, v))

        yield from extend(0, k, ())

    def rest(self, y: tuple[int, ...], s: int) -> int:
        """Best partition score of y into groups of s plus one leftover group."""
        key = (y, s)
        if key in self._rest:
            return self._rest[key]
        n = sum(y)
        if n <= s:
            value = self.score(y)
        else:
            first = next(c for c in range(len(y)) if y[c])  # its first GPU is in some group
            value = -1
            for k in {s, n % s} - {0}:
                for g in self.groups(y, k, first):
                    rest = tuple(a - b for a, b in zip(y, g, strict=True))
                    value = max(value, self.score(g) + self.rest(rest, s))
        self._rest[key] = value
        return value

    def answer(self, available: Sequence[int], must_include: Sequence[int], size: int) -> list[int]:
        avail = sorted(available)
        if impossible(avail, must_include, size):
            return []
        a = tuple(sum(1 for i in avail if i in c) for c in self.classes)
        r = tuple(sum(1 for i in must_include if i in c) for c in self.classes)
        best: tuple[int, int] | None = None
        chosen: list[tuple[int, ...]] = []
        for x in self.groups(a, size, -1):
            if any(xc < rc for xc, rc in zip(x, r, strict=True)):
                continue
            own = self.score(x)
            rest = tuple(p - q for p, q in zip(a, x, strict=True))
            key = (own + self.rest(rest, size), own)
            if best is None or key > best:
                best, chosen = key, [x]
            elif key == best:
                chosen.append(x)
        return min(self._lowest(avail, must_include, x) for x in chosen)

    def _lowest(self, avail: list[int], must: Sequence[int], x: tuple[int, ...]) -> list[int]:
        group = list(must)
        for c, members in enumerate(self.classes):
            free = [i for i in avail if i in members and i not in must]
            group.extend(free[: x[c] - sum(1 for i in must if i in members)])
        return sorted(group)


class LatticeReference:
    """The same objective on a node of twin classes, by a plain bottom-up table over every count
    vector below the available counts (no bounds, no symmetry, no memo): vectorised, so it reaches
    the 18-32 GPU nodes that :class:`CountReference` is too slow for, as long as the available
    counts span at most some tens of thousands of vectors.

    ``classes`` and ``scores`` as for :class:`CountReference`, written down by the test.
    """

    CHUNK = 1 << 21
    """Most (state, group, class) cells one array operation holds."""

    def __init__(self, classes: Sequence[Sequence[int]], scores: Sequence[Sequence[int]]) -> None:
        import numpy as np

        self.classes = [tuple(c) for c in classes]
        self.scores = np.asarray(scores, dtype=np.int64)

    def twice(self, x: Any) -> Any:
        """Twice each row's group score (the inside score counts for pairs of one class)."""
        inner = self.scores.diagonal()
        return ((x @ self.scores) * x).sum(axis=-1) - x @ inner

    def answer(self, available: Sequence[int], must_include: Sequence[int], size: int) -> list[int]:
        import numpy as np

        avail = sorted(available)
        if impossible(avail, must_include, size):
            return []
        a = np.asarray([sum(1 for i in avail if i in c) for c in self.classes], dtype=np.int64)
        r = np.asarray([sum(1 for i in must_include if i in c) for c in self.classes])
        shape = tuple(int(v) + 1 for v in a)
        vectors = np.indices(shape).reshape(len(a), -1).T.astype(np.int64)
        stride = np.asarray([int(np.prod(shape[c + 1 :])) for c in range(len(a))], dtype=np.int64)
        rest = self._rest(vectors, stride, size)
        x = vectors[(vectors.sum(axis=1) == size) & (vectors >= r).all(axis=1)]
        own = self.twice(x)
        total = own + rest[(a - x) @ stride]
        best = (total == total.max()) & (own == own[total == total.max()].max())
        return min(self._lowest(avail, must_include, g) for g in x[best].tolist())

    def _rest(self, vectors: Any, stride: Any, s: int) -> Any:
        """R of every vector (indexed by its mixed-radix digits), lowest totals first."""
        import numpy as np

        totals = vectors.sum(axis=1)
        rest = np.zeros(len(vectors), dtype=np.int64)
        small = totals <= s
        if s > 1:
            rest[small] = self.twice(vectors[small])
        first = np.argmax(vectors > 0, axis=1)
        for total in range(s + 1, int(totals.max(initial=0)) + 1):
            if s == 1:
                break
            states = np.flatnonzero(totals == total)
            best = np.full(len(states), -1, dtype=np.int64)
            for k in {s, total % s} - {0}:
                groups = vectors[totals == k]
                gains = self.twice(groups)
                step = max(1, self.CHUNK // max(1, len(groups) * vectors.shape[1]))
                for start in range(0, len(states), step):
                    chunk = states[start : start + step]
                    y = vectors[chunk]
                    fits = (groups[None, :, :] <= y[:, None, :]).all(axis=2)
                    fits &= groups[:, first[chunk]].T >= 1  # holds the state's first class
                    child = chunk[:, None] - (groups @ stride)[None, :]
                    value = np.where(fits, gains[None, :] + rest[np.where(fits, child, 0)], -1)
                    best[start : start + step] = np.maximum(
                        best[start : start + step], value.max(axis=1)
                    )
            rest[states] = best
        return rest

    def _lowest(self, avail: list[int], must: Sequence[int], x: Sequence[int]) -> list[int]:
        group = list(must)
        for c, members in enumerate(self.classes):
            free = [i for i in avail if i in members and i not in must]
            group.extend(free[: x[c] - sum(1 for i in must if i in members)])
        return sorted(group)
