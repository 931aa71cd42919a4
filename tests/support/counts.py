"""A test oracle: the exact best-effort objective on nodes of a few classes of interchangeable
GPUs, by the count search over forest shapes (:mod:`tests.support.forests`).

It was the product's method for nodes beyond 32 GPUs in at most four classes; only generated test
nodes are that large behind one kubelet (tests/support/bignodes.py), and the product answers them
with the budgeted search. It stays here as an independent exact method on such nodes: the tests
check it against brute force, the subset tables and a plain count recursion, then check the
product's branch search and budgeted search against it.

On such a node (:mod:`nvplugin.allocator.methods.classes`) a group is a count vector x (GPUs per
class) and its score ``f(x)`` depends on nothing else. With A the available GPUs (a per class), R
the must-include ones (r per class) and s the size, the objective of docs/allocation.md reads:

- OPT = max over x (``|x| = s``, ``r <= x <= a``) of ``f(x) + rest(a - x)``, rest being the best
  partition score of what is left (:mod:`tests.support.forests`);
- the answer's count vector is, among the x reaching OPT, one with the highest ``f(x)``; and the
  answer itself is the lex-smallest group with such a vector: R plus, in each class, the lowest
  other available GPUs. (Lowest members per class give a group whose sorted indices are
  element-wise no larger than any other group's with that vector, so it is lex-smallest; the
  must-include GPUs only shift the lower bound r, as GPUs of a class are otherwise alike.)

Nothing is enumerated per GPU. A request first evaluates every forest shape with a designated
group once: the best shape gives OPT and the best own score f* among groups of best partitions
(the partition score plus a tiny multiple of the designated group's score is still convex, so a
vertex reaches both). Then only the count vectors with ``f(x) = f*`` are listed (without listing
the others) and checked for ``f(x) + rest(a - x) = OPT``: usually a handful.

The vertex argument needs the class scores to be convex (:func:`convex`): ``M`` positive
semidefinite on vectors that sum to zero (then every partition score is a convex function on the
transportation polytope of group-by-class counts, and a best partition sits at a vertex). PCIe
trees (deeper common ancestor, higher score) and NVSwitch fabrics (links = min of both GPUs')
always pass; the check is exact (integer arithmetic), as a float eigenvalue near zero would decide
exactness by rounding. A class of one GPU never holds a pair, so its diagonal is free: it can be
taken as large as needed, and only classes of two or more GPUs are checked.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations

import numpy as np
from numpy.typing import NDArray

from nvplugin.allocator.base import check_request
from nvplugin.allocator.methods.classes import Classes, twin_classes
from nvplugin.node.model import Topology
from tests.support.forests import FULL, Forests

IntArray = NDArray[np.int64]

MAX_CLASSES = 4
"""Most classes the count search takes (shapes with a designated group and a leftover: 1 934 on
four classes, 33 470 on five)."""

BATCH_SLOTS = 1 << 18
"""Count vectors x shape edges per array operation, so temporaries stay a few MB."""

_NONE = np.iinfo(np.int64).min // 4


def applies(classes: Classes) -> bool:
    """Whether the count search answers exactly on a node with these classes."""
    return len(classes) <= MAX_CLASSES and convex(classes)


def convex(classes: Classes) -> bool:
    """Whether the class score matrix passes the check of the module docstring. Exact, and
    exponential in the number of classes of two or more GPUs: ask only for a few classes."""
    paired = [c for c, group in enumerate(classes.members) if len(group) > 1]
    return conditionally_psd(classes.scores[np.ix_(paired, paired)])


def conditionally_psd(matrix: IntArray) -> bool:
    """Whether ``vᵀ matrix v >= 0`` for every real v whose entries sum to zero.

    On the basis ``e_i - e_last`` of that subspace the form is ``B[i][j] = M[i][j] - M[i][k] -
    M[k][j] + M[k][k]``; B is positive semidefinite exactly when all its principal minors are
    non-negative (leading minors alone do not decide the semidefinite case).
    """
    k = len(matrix) - 1
    if k <= 0:
        return True
    last = matrix[k]
    basis = [
        [int(matrix[i, j] - matrix[i, k] - last[j] + last[k]) for j in range(k)] for i in range(k)
    ]
    return all(
        _determinant([[basis[i][j] for j in rows] for i in rows]) >= 0
        for size in range(1, k + 1)
        for rows in combinations(range(k), size)
    )


def _determinant(rows: list[list[int]]) -> Fraction:
    """Exact determinant by Gaussian elimination over fractions (tiny matrices only)."""
    work = [[Fraction(v) for v in row] for row in rows]
    size = len(work)
    result = Fraction(1)
    for col in range(size):
        pivot = next((r for r in range(col, size) if work[r][col] != 0), None)
        if pivot is None:
            return Fraction(0)
        if pivot != col:
            work[col], work[pivot] = work[pivot], work[col]
            result = -result
        result *= work[col][col]
        for r in range(col + 1, size):
            factor = work[r][col] / work[col][col]
            for c in range(col, size):
                work[r][c] -= factor * work[col][c]
    return result


@dataclass(frozen=True)
class Counts:
    """A request's answer in count vectors: OPT and the best own score (both doubled, as the
    shapes keep integers), and the count vectors that reach both."""

    opt2: int
    own2: int
    best: IntArray


class CountSearch:
    """The count search over one node's classes (see the module docstring)."""

    def __init__(self, classes: Classes) -> None:
        self.classes = classes
        self._scores = classes.scores
        self._inner = np.diag(classes.scores).copy()
        self._joint = {
            flag: Forests(classes.scores, designated=True, leftover=flag) for flag in (False, True)
        }
        self._rest = {
            flag: Forests(classes.scores, designated=False, leftover=flag) for flag in (False, True)
        }

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in (*self._joint.values(), *self._rest.values()))

    def twice(self, x: IntArray) -> IntArray:
        """Twice the score of each group (count vector) in ``x``."""
        result: IntArray = ((x @ self._scores) * x).sum(axis=-1) - x @ self._inner
        return result

    def search(self, available: IntArray, required: IntArray, size: int) -> Counts:
        """OPT, the best own score and the count vectors reaching both, for a possible request
        (``required <= available``, ``sum(required) <= size <= sum(available)``)."""
        if size == int(required.sum()):  # the must-include GPUs are the group
            best = required[None, :]
            return Counts(
                int(self.totals(available, best, size)[0]), int(self.twice(best)[0]), best
            )
        if required.any():
            opt, best_own, known = self._best_shape(available, required, size)
        else:
            opt, best_own, known = self._best_vertex(available, size)
        # The groups of best vertices with the best own score reach OPT by construction; the
        # other count vectors of that score need a check.
        level = self.level(required, available, size, best_own)
        check = ~(level[:, None, :] == known[None, :, :]).all(axis=2).any(axis=1)
        reach = ~check
        reach[check] = self.totals(available, level[check], size) == opt
        best = level[reach]
        assert len(best), "a best shape's designated group has a count vector reaching OPT"
        return Counts(opt, best_own, best)

    def level(self, low: IntArray, high: IntArray, size: int, target: int) -> IntArray:
        """Every count vector x with ``low <= x <= high``, ``|x| = size`` and twice its score
        equal to ``target``, without listing the others.

        All classes but the last two are listed (a grid); along the last two, with their sum
        fixed, twice the score is a quadratic in the first one's count u, solved exactly in
        integers (float square roots only guess; every root is checked).
        """
        m = len(low)
        if m == 1:
            x = np.asarray([[size]], dtype=np.int64)
            fits = (low <= x).all(axis=1) & (x <= high).all(axis=1) & (self.twice(x) == target)
            single: IntArray = x[fits]
            return single
        head = m - 2
        shape = tuple((high[:head] - low[:head] + 1).tolist())
        grid = np.indices(shape).reshape(head, -1).T if head else np.zeros((1, 0), dtype=np.int64)
        prefix = grid.astype(np.int64) + low[:head]
        spare = size - prefix.sum(axis=1)
        u_low = np.maximum(low[head], spare - high[head + 1])
        u_high = np.minimum(high[head], spare - low[head + 1])
        keep = u_low <= u_high
        prefix, spare, u_low, u_high = prefix[keep], spare[keep], u_low[keep], u_high[keep]
        # x = start + u * step with start = (prefix, 0, spare), step = e[m-2] - e[m-1]:
        # twice the score is a u² + b u + (twice the start's score).
        start = np.hstack([prefix, np.zeros((len(prefix), 1), dtype=np.int64), spare[:, None]])
        step = np.zeros(m, dtype=np.int64)
        step[head], step[head + 1] = 1, -1
        pulled = start @ self._scores
        a = int(step @ self._scores @ step)
        b = 2 * (pulled @ step) - int(self._inner @ step)
        c = (pulled * start).sum(axis=1) - start @ self._inner - target
        if a:
            root = np.sqrt(np.maximum(b * b - 4 * a * c, 0).astype(np.float64)).astype(np.int64)
            guesses = [(-b + sign * (root + d)) // (2 * a) for sign in (-1, 1) for d in (-1, 0, 1)]
        else:
            guesses = [-c // np.where(b != 0, b, 1)]
        rows = [np.zeros((0, m), dtype=np.int64)]
        for u in guesses:
            hit = (u >= u_low) & (u <= u_high) & (a * u * u + b * u + c == 0)
            rows.append(start[hit] + u[hit, None] * step)
        if not a:  # b = c = 0: every u in range
            flat = (b == 0) & (c == 0)
            span = (u_high - u_low + 1) * flat
            which = np.repeat(np.arange(len(prefix)), span)
            u = u_low[which] + np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span)
            rows.append(start[which] + u[:, None] * step)
        found: IntArray = np.unique(np.vstack(rows), axis=0)
        return found

    def totals(self, available: IntArray, candidates: IntArray, size: int) -> IntArray:
        """Twice the best score of a partition of ``available`` that has each candidate as a
        full group."""
        result: IntArray = self.twice(candidates) + self._rest_twice(available, candidates, size)
        return result

    def partition(self, rest: IntArray, size: int) -> tuple[list[IntArray], IntArray]:
        """A best partition of ``rest`` (counts per class): its full groups and its leftover, as
        count vectors."""
        leftover = int(rest.sum()) % size
        forests = self._rest[leftover > 0]
        fit = forests.fit(rest[None, :], size, leftover, 0)
        shape = int(np.where(fit.valid[0], -fit.loss[0], _NONE).argmax())
        full: list[IntArray] = []
        left = np.zeros(len(rest), dtype=np.int64)
        used = np.zeros(len(rest), dtype=np.int64)
        for kind, counts in forests.groups(fit.entries[0], shape):
            used += counts
            if kind == FULL:
                full.append(counts)
            else:
                left = counts
        for c, pure in enumerate(((rest - used) // size).tolist()):
            full.extend(np.eye(len(rest), dtype=np.int64)[c] * size for _ in range(pure))
        return full, left

    def _best_vertex(self, available: IntArray, size: int) -> tuple[int, int, IntArray]:
        """(OPT, best own score), doubled, and count vectors known to reach both, without
        must-include GPUs: then the designated group is any full group, so the best partitions'
        vertices (shapes without one) hold it, as their best full group, mixed or pure."""
        leftover = int(available.sum()) % size
        forests = self._rest[leftover > 0]
        fit = forests.fit(available[None, :], size, leftover, 0)
        total = (size - 1) * int(available @ self._inner) - fit.loss[0]
        total = np.where(fit.valid[0], total, _NONE)
        opt = int(total.max())
        pure = np.eye(len(available), dtype=np.int64) * size
        rows: list[IntArray] = []
        for shape in np.flatnonzero(total == opt).tolist():
            used = np.zeros(len(available), dtype=np.int64)
            for kind, counts in forests.groups(fit.entries[0], shape):
                used += counts
                if kind == FULL:
                    rows.append(counts)
            rows.extend(pure[available - used >= size])
        groups = np.asarray(rows, dtype=np.int64).reshape(-1, len(available))
        own = self.twice(groups)
        best_own = int(own.max())
        return opt, best_own, groups[own == best_own]

    def _best_shape(
        self, available: IntArray, required: IntArray, size: int
    ) -> tuple[int, int, IntArray]:
        """(OPT, best own score), doubled, and count vectors known to reach both, from the
        shapes with a designated group."""
        leftover = int(available.sum()) % size
        forests = self._joint[leftover > 0]
        inside = size - int(required.sum())
        fit = forests.fit((available - required)[None, :], size, leftover, inside)
        groups = forests.designated_counts(fit.entries)[0] + required
        own = self.twice(groups)
        total = own + (size - 1) * ((available - groups) @ self._inner) - fit.loss[0]
        total = np.where(fit.valid[0], total, _NONE)
        opt = int(total.max())
        best_own = int(own[total == opt].max())
        return opt, best_own, groups[(total == opt) & (own == best_own)]

    def _rest_twice(self, available: IntArray, candidates: IntArray, size: int) -> IntArray:
        """Twice the best partition score of ``available - x`` for each candidate x."""
        leftover = (int(available.sum()) - size) % size
        forests = self._rest[leftover > 0]
        out = np.empty(len(candidates), dtype=np.int64)
        for start, stop in _batches(len(candidates), max(1, BATCH_SLOTS // max(1, forests.edges))):
            rest = available - candidates[start:stop]
            fit = forests.fit(rest, size, leftover, 0)
            best = np.where(fit.valid, -fit.loss, _NONE).max(axis=1)
            out[start:stop] = (size - 1) * (rest @ self._inner) + best
        return out


def _batches(count: int, step: int) -> Iterator[tuple[int, int]]:
    for start in range(0, count, step):
        yield start, min(count, start + step)


class CountOracle:
    """The count search as a policy-like oracle over a topology: :meth:`answer` is the group
    docs/allocation.md asks for (``[]`` when impossible), :meth:`opt` its OPT. Only for nodes
    where :func:`applies` holds."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.classes = twin_classes(topology.scores)
        assert applies(self.classes), f"{topology.name}: the count search does not apply"
        self.search = CountSearch(self.classes)

    def found(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> tuple[list[int], int]:
        """The answer and OPT of a possible request."""
        request = check_request(len(self.topology), available, must_include, size)
        assert not request.impossible, request.impossible
        a = self.classes.counts(request.available)
        r = self.classes.counts(request.must_include)
        counted = self.search.search(a, r, request.size)
        free: list[list[int]] = [[] for _ in range(len(self.classes))]
        for gpu in request.available:
            if gpu not in request.must_include:
                free[self.classes.of[gpu]].append(gpu)
        groups = []
        for vector in (counted.best - r).tolist():
            chosen = list(request.must_include)
            for c, k in enumerate(vector):
                chosen.extend(free[c][:k])
            groups.append(sorted(chosen))
        return min(groups), counted.opt2 // 2

    def answer(self, available: Sequence[int], must_include: Sequence[int], size: int) -> list[int]:
        request = check_request(len(self.topology), available, must_include, size)
        if request.impossible:
            return []
        return self.found(available, must_include, size)[0]

    def opt(self, available: Sequence[int], must_include: Sequence[int], size: int) -> int:
        return self.found(available, must_include, size)[1]
