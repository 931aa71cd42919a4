"""Interchangeable GPUs: the twin classes of a node and the score matrix between them.

Two GPUs are *twins* when they have the same pair score to every other GPU: the GPUs under one
PCIe switch, or the GPUs of one socket on an NVSwitch fabric. Twinship is an equivalence (if i, j
and j, k are twins, every pair among i, j, k has the same score), so a node splits into classes,
and within a class of two or more GPUs every pair has the same score. A group's score then
depends only on how many GPUs it takes from each class: ``f(x) = (xᵀMx - wᵀx) / 2`` with ``M``
the class score matrix (diagonal ``w``: the score inside a class). That is what lets the
branch search (:mod:`nvplugin.allocator.methods.branch`) work on count vectors instead of subsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from nvplugin.allocator.methods.twins import class_scores, twin_members

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


def twin_classes(scores: Sequence[Sequence[int]]) -> Classes:
    """The twin classes of the GPUs whose pair scores are ``scores``
    (:func:`nvplugin.allocator.methods.twins.twin_members`)."""
    members, of = twin_members(scores)
    return Classes(
        tuple(tuple(group) for group in members),
        tuple(of),
        np.asarray(class_scores(scores, members), dtype=np.int64).reshape(
            len(members), len(members)
        ),
    )
