"""Which GPUs are interchangeable: the rule behind every method that works on classes of twins,
in plain Python (no numpy), so that the methods that need no arrays can use it too.

Two GPUs are *twins* when they have the same pair score to every other GPU (the cards behind one
PCIe switch, the GPUs of one socket on an NVSwitch fabric). Twinship is an equivalence, so a node
splits into classes; :class:`nvplugin.allocator.methods.classes.Classes` holds them with numpy
arrays for the count methods, :mod:`nvplugin.allocator.methods.tree` as plain lists.
"""

from __future__ import annotations

from collections.abc import Sequence


def twin_members(scores: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """The twin classes of the GPUs whose pair scores are ``scores``, in order of their lowest
    GPU: each class's GPUs (ascending), and the class of each GPU."""
    rows = [tuple(int(v) for v in row) for row in scores]
    n = len(rows)
    of = [-1] * n
    members: list[list[int]] = []
    for i in range(n):
        if of[i] >= 0:
            continue
        of[i] = len(members)
        group = [i]
        row = rows[i]
        for j in range(i + 1, n):
            if of[j] >= 0:
                continue
            other = rows[j]
            # j is a twin of i when their rows agree everywhere but in columns i and j.
            if (
                row[:i] == other[:i]
                and row[i + 1 : j] == other[i + 1 : j]
                and row[j + 1 :] == (other[j + 1 :])
            ):
                of[j] = of[i]
                group.append(j)
        members.append(group)
    return members, of


def class_scores(
    scores: Sequence[Sequence[int]], members: Sequence[Sequence[int]]
) -> list[list[int]]:
    """The pair score between a GPU of class c and one of class d; on the diagonal the score
    inside c (0 for a class of one GPU, which holds no pair)."""
    out = [[0] * len(members) for _ in members]
    for c, group in enumerate(members):
        for d, other in enumerate(members):
            if c != d:
                out[c][d] = int(scores[group[0]][other[0]])
            elif len(group) > 1:
                out[c][c] = int(scores[group[0]][group[1]])
    return out
