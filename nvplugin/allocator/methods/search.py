"""The ``search`` method, for nodes no exact method takes (beyond 16 GPUs without a few classes
of interchangeable GPUs, and every node beyond 32 GPUs), and the local search that answers any
request an exact method cannot answer within its budget.

On such nodes the objective of docs/allocation.md is a partition problem with no fast exact
method here. A request with at most :data:`~nvplugin.allocator.methods.tables.TABLE_GPUS`
available GPUs builds the subset tables over them, for its one size, and answers exactly if that
finishes within the exact share of its budget; any other request gets the best partition a local
search finds before its deadline:

- start from a greedy partition (the must-include GPUs first, then each group grown from the
  best-connected free pair by the GPU with the most score to the group's members);
- swap two GPUs of different groups while that raises the partition score (the best swap first,
  read off one matrix of GPU-to-group scores), the must-include GPUs staying in their group;
- at a local optimum, shake a few random pairs (seeded by the request, so an answer does not
  change from one call to the next unless the deadline cuts the search short) and descend again,
  keeping the best partition, until the deadline or a fixed number of shakes.

The answer is the best partition's group holding the must-include GPUs (without any, its full
group with the highest own score, lowest indices on ties). It is not proven optimal; ``bound``
caps OPT (each GPU's s - 1 best pair scores, halved), so ``bound - partition score`` is how far
from optimal it can be at most.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from nvplugin.allocator.base import Allocation, OutOfTime, Request
from nvplugin.allocator.methods.base import POLICY, Best, forced
from nvplugin.allocator.methods.smalltables import explain_table, gpus, relabel
from nvplugin.allocator.methods.tables import TABLE_GPUS, Tables
from nvplugin.node.model import Topology

IntArray = NDArray[np.int64]

SHAKES = 64
"""Most shake-and-descend rounds per request (fewer when the deadline comes first)."""


@dataclass(frozen=True)
class Found:
    """The best partition the search found: its full groups (the answer first) and leftover, as
    GPU indices, the answer's own score, the partition score and the upper bound on OPT."""

    groups: tuple[tuple[int, ...], ...]
    leftover: tuple[int, ...]
    score: int
    partition_score: int
    bound: int


def upper_bound(scores: IntArray, size: int) -> int:
    """A cap on any partition score of these GPUs into groups of at most ``size``: every GPU
    has at most size - 1 group mates, at best its highest pair scores; each pair counts twice."""
    if size < 2 or len(scores) < 2:
        return 0
    best = -np.sort(-(scores + np.diag(np.full(len(scores), -(1 << 40)))), axis=1)
    return int(best[:, : size - 1].clip(min=0).sum()) // 2


def local_search(
    scores: Sequence[Sequence[int]],
    available: Sequence[int],
    must_include: Sequence[int],
    size: int,
    deadline: float,
    *,
    fixed: bool = False,
) -> Found:
    """The best partition found by ``deadline`` (``time.monotonic()``) for a possible request
    (module docstring). With ``fixed`` the must-include GPUs are the whole answer group, and only
    the others are searched (to score a group another policy chose)."""
    gpus = list(available)
    k = len(gpus)
    pair = np.asarray(scores, dtype=np.int64)[np.ix_(gpus, gpus)]
    position = {gpu: p for p, gpu in enumerate(gpus)}
    labels = _greedy(pair, [position[g] for g in must_include], size)
    locked = np.zeros(k, dtype=bool)
    locked[[position[g] for g in must_include]] = True
    if fixed:  # the group is given: none of its GPUs takes part in a swap
        locked = labels == 0
    full = k // size
    groups = full + (1 if k % size else 0)
    score = _descend(pair, labels, locked, groups, deadline)
    best, best_score = labels.copy(), score
    rng = random.Random(hash((tuple(gpus), tuple(must_include), size)) & 0xFFFFFFFF)
    movable = np.flatnonzero(~locked)
    for _ in range(SHAKES):
        if time.monotonic() > deadline or groups < 2 or len(movable) < 2:
            break
        labels = best.copy()
        for _ in range(max(1, k // 8)):
            i, j = rng.sample(movable.tolist(), 2)
            labels[i], labels[j] = labels[j], labels[i]
        score = _descend(pair, labels, locked, groups, deadline)
        if score > best_score:
            best, best_score = labels, score
    members = [tuple(sorted(gpus[p] for p in np.flatnonzero(best == g))) for g in range(groups)]
    own = [_score(pair, np.flatnonzero(best == g)) for g in range(groups)]
    chosen = 0 if must_include else min(range(full), key=lambda g: (-own[g], members[g]))
    others = sorted((members[g] for g in range(full) if g != chosen), key=lambda g: g[0])
    return Found(
        (members[chosen], *others),
        members[full] if groups > full else (),
        own[chosen],
        best_score,
        upper_bound(pair, size),
    )


def best_found(
    scores: Sequence[Sequence[int]], request: Request, deadline: float, *, fixed: bool
) -> Allocation:
    """:func:`local_search`'s answer as an explanation: unproven, but where the group is given
    (``fixed``: the must-include GPUs) and the partition meets the bound (another optimal
    partition could hold a group of a higher own score when the group is the search's)."""
    found = local_search(
        scores, request.available, request.must_include, request.size, deadline, fixed=fixed
    )
    return Allocation(
        POLICY,
        found.groups[0],
        found.score,
        found.partition_score,
        found.groups,
        found.leftover,
        contenders=((found.groups[0], found.score),),
        proven=fixed and found.partition_score == found.bound,
        bound=found.bound,
    )


class SearchMethod:
    """The ``search`` method (module docstring): it takes every node, and prepares nothing."""

    name = "search"

    def __init__(self, topology: Topology) -> None:
        self._topology = topology

    @classmethod
    def build(cls, topology: Topology) -> SearchMethod:
        return cls(topology)

    @property
    def nbytes(self) -> int:
        return 0

    def best(self, request: Request, deadline: float) -> Best:
        """Raises OutOfTime beyond the tables' reach: the local search answers then."""
        group = forced(request)
        if group is not None:
            return Best(group)
        tables, labels = self._tables(request, deadline)
        found = tables.best_group(
            relabel(request.available_mask, labels),
            relabel(request.must_include_mask, labels),
            request.size,
        )
        assert found is not None, "a possible request always has a candidate group"
        return Best(gpus(found[0], labels), found[1], found[2])

    def explain(
        self, request: Request, group: tuple[int, ...], deadline: float, *, contenders: bool
    ) -> Allocation:
        tables, labels = self._tables(request, deadline)
        return explain_table(tables, labels, request, group, contenders=contenders)

    def _tables(self, request: Request, deadline: float) -> tuple[Tables, tuple[int, ...]]:
        """The tables over the available GPUs for the request's size, and the GPU index of each
        table position; OutOfTime when they are too many or the build passes ``deadline``."""
        labels = request.available
        if len(labels) > TABLE_GPUS:
            raise OutOfTime
        scores = self._topology.scores
        sub = [[scores[a][b] for b in labels] for a in labels]
        return Tables.build(sub, [request.size], deadline), labels


def _score(pair: IntArray, positions: IntArray) -> int:
    return int(pair[np.ix_(positions, positions)].sum()) // 2


def _greedy(pair: IntArray, first: list[int], size: int) -> IntArray:
    """Group labels 0.. (full groups, then the leftover group last): group 0 starts from
    ``first``, every other group from the best-connected free pair; each grows by the free GPU
    with the most score to its members (lowest position on ties)."""
    k = len(pair)
    labels = np.full(k, -1, dtype=np.int64)
    group = 0
    while (labels < 0).any():
        free = np.flatnonzero(labels < 0)
        want = min(size, len(free))
        if group == 0 and first:
            members = list(first)
        elif want >= 2:
            sub = pair[np.ix_(free, free)] + np.diag(np.full(len(free), -(1 << 40)))
            a, b = divmod(int(sub.argmax()), len(free))
            members = [int(free[a]), int(free[b])]
        else:
            members = [int(free[0])]
        labels[members] = group
        while len(members) < want:
            free = np.flatnonzero(labels < 0)
            gain = pair[:, members][free].sum(axis=1)
            pick = int(free[int(gain.argmax())])
            labels[pick] = group
            members.append(pick)
        group += 1
    return labels


def _descend(
    pair: IntArray,
    labels: IntArray,
    locked: NDArray[np.bool_],
    groups: int,
    deadline: float,
) -> int:
    """Apply the best improving swap until there is none or the deadline passes; ``labels``
    changes in place. Returns the partition score."""
    k = len(pair)
    onehot = np.zeros((k, groups), dtype=np.int64)
    onehot[np.arange(k), labels] = 1
    affinity = pair @ onehot  # score of each GPU to each group's members
    score = int((affinity[np.arange(k), labels]).sum()) // 2
    blocked = locked[:, None] | locked[None, :]
    while time.monotonic() <= deadline:
        own = affinity[np.arange(k), labels]
        cross = affinity[:, labels]  # cross[i, j]: i's score to j's group
        gain = cross + cross.T - own[:, None] - own[None, :] - 2 * pair
        gain[blocked | (labels[:, None] == labels[None, :])] = 0
        flat = int(gain.argmax())
        if gain.flat[flat] <= 0:
            break
        i, j = divmod(flat, k)
        gi, gj = int(labels[i]), int(labels[j])
        affinity[:, gi] += pair[:, j] - pair[:, i]
        affinity[:, gj] += pair[:, i] - pair[:, j]
        labels[i], labels[j] = gj, gi
        score += int(gain.flat[flat])
    return score
