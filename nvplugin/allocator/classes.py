"""Interchangeable GPUs: the twin classes of a node and the score matrix between them.

Two GPUs are *twins* when they have the same pair score to every other GPU: the GPUs under one
PCIe switch, or the GPUs of one socket on an NVSwitch fabric. Twinship is an equivalence (if i, j
and j, k are twins, every pair among i, j, k has the same score), so a node splits into classes,
and within a class of two or more GPUs every pair has the same score. A group's score then
depends only on how many GPUs it takes from each class: ``f(x) = (xᵀMx - wᵀx) / 2`` with ``M``
the class score matrix (diagonal ``w``: the score inside a class). That is what lets the exact
count search (:mod:`nvplugin.allocator.counts`) work on count vectors instead of subsets.

:meth:`Classes.convex` says whether that search's vertex argument holds on this node: ``M`` must be
positive semidefinite on vectors that sum to zero (then every partition score is a convex function
on the transportation polytope of group-by-class counts, and a best partition sits at a vertex).
PCIe trees (deeper common ancestor, higher score) and NVSwitch fabrics (links = min of both GPUs')
always pass; the check is exact (integer arithmetic), as a float eigenvalue near zero would decide
exactness by rounding. A class of one GPU never holds a pair, so its diagonal is free: it can be
taken as large as needed, and only classes of two or more GPUs are checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations

import numpy as np
from numpy.typing import NDArray

from nvplugin.allocator.twins import class_scores, twin_members

IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class Classes:
    """The twin classes of a node, in order of their lowest GPU index.

    ``members[c]`` are the GPUs of class c (ascending), ``of[i]`` the class of GPU i,
    ``scores[c][d]`` the pair score between a GPU of c and one of d (the diagonal: inside c; 0 for
    a class of one GPU).
    """

    members: tuple[tuple[int, ...], ...]
    of: tuple[int, ...]
    scores: IntArray

    def __len__(self) -> int:
        return len(self.members)

    def counts(self, indices: Sequence[int]) -> IntArray:
        """How many of ``indices`` fall into each class."""
        return np.bincount(
            np.asarray([self.of[i] for i in indices], dtype=np.int64), minlength=len(self)
        ).astype(np.int64)

    def convex(self) -> bool:
        """Whether the score matrix passes the check of the module docstring. Exact, and
        exponential in the number of classes of two or more GPUs: ask only for a few classes."""
        paired = [c for c, group in enumerate(self.members) if len(group) > 1]
        return conditionally_psd(self.scores[np.ix_(paired, paired)])


def twin_classes(scores: Sequence[Sequence[int]]) -> Classes:
    """The twin classes of the GPUs whose pair scores are ``scores``
    (:func:`nvplugin.allocator.twins.twin_members`)."""
    members, of = twin_members(scores)
    return Classes(
        tuple(tuple(group) for group in members),
        tuple(of),
        np.asarray(class_scores(scores, members), dtype=np.int64).reshape(
            len(members), len(members)
        ),
    )


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
