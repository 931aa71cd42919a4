"""Best partitions of count vectors, read off a fixed list of forest shapes (for the count
search oracle, :mod:`tests.support.counts`).

The count search needs, for a vector ``y`` of GPUs per class and a group size s, the best score
of a partition of y into full groups of s and one leftover group of ``|y| mod s`` (and, once per
request, the same with one *designated* group of a given size). Write a partition as a matrix X:
one row per group, one column per class, row sums the group sizes, column sums y. On a convex
node (:func:`tests.support.counts.convex`) the partition score is a convex function over the
polytope of such real matrices, so some best partition is a vertex, and the vertices of this
*transportation polytope* are the matrices whose non-zero entries form a forest in the bipartite
graph of groups and classes. Three facts make that a short list:

- A group taking only one class (*pure*) is a leaf of the forest; all the others (*mixed*) have
  at least two edges, so there are at most (classes - 1) of them. Pure full groups change
  nothing but a class's count, so a vertex is a *shape* (the supports of its mixed groups, the
  leftover's support and the designated group's support, with no cycle) plus pure groups.
- On a forest, each entry is fixed by the margins: cutting edge (group g, class c) leaves a side
  A holding c, and ``X[g][c] = sum of y over A's classes - sum of A's group sizes``. Full groups
  vanish modulo s and a mixed entry lies in 1..s-1, so the entry is that sum modulo s: it depends
  on y only through ``y mod s``.
- The pure groups are what is left: ``(y_c - z_c) / s`` per class, where z_c sums the shape's
  entries in class c; the shape fits y when those are whole and non-negative.

So every shape is evaluated at once, for many y, with a few integer array operations, and the
best fitting shape is the best partition. Scores use the "loss" form: with ``w`` the class score
matrix's diagonal and ``D[c][d] = w_c + w_d - 2 M[c][d]``, a full group x scores
``((s - 1) w·x - sum_{c<d} D[c][d] x_c x_d) / 2`` and a leftover group L of r GPUs
``((s - 1) w·L - (s - r) w·L - sum_{c<d} D[c][d] L_c L_d) / 2``: pure full groups lose nothing,
so a partition of y scores ``((s - 1) w·y - loss) / 2`` with the loss summed over the shape alone.

There are 1 934 shapes with a designated group and a leftover on four classes (11.8 k edges),
33 470 on five: the count search stops at four classes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

DESIGNATED, FULL, LEFTOVER = 0, 1, 2
"""Group kinds: the designated group (the answer's), a mixed full group, the leftover group."""

Shape = tuple[tuple[int, tuple[int, ...]], ...]
"""A shape: its groups as (kind, support), the designated and leftover groups first."""


def shapes(classes: int, designated: bool, leftover: bool) -> list[Shape]:
    """Every forest shape on ``classes`` classes: any designated and leftover supports (one class
    or more), then every set of mixed full supports (two classes or more) that adds no cycle.

    A group joins its classes into one tree; it closes a cycle exactly when two of its classes
    are already connected, so the search only tracks which classes are connected.
    """
    singles = [s for k in range(1, classes + 1) for s in itertools.combinations(range(classes), k)]
    mixed = [s for s in singles if len(s) > 1]
    out: list[Shape] = []

    def join(labels: tuple[int, ...], support: tuple[int, ...]) -> tuple[int, ...] | None:
        seen = {labels[c] for c in support}
        if len(seen) < len(support):
            return None
        target = min(seen)
        return tuple(target if label in seen else label for label in labels)

    def grow(start: int, labels: tuple[int, ...], groups: Shape) -> None:
        out.append(groups)
        for i in range(start, len(mixed)):
            joined = join(labels, mixed[i])
            if joined is not None:
                grow(i + 1, joined, (*groups, (FULL, mixed[i])))

    for first in singles if designated else [None]:
        for last in singles if leftover else [None]:
            labels: tuple[int, ...] | None = tuple(range(classes))
            groups: Shape = ()
            for kind, support in ((DESIGNATED, first), (LEFTOVER, last)):
                if support is not None and labels is not None:
                    labels = join(labels, support)
                    groups = (*groups, (kind, support))
            if labels is not None:
                grow(0, labels, groups)
    return out


def _ranges(values: IntArray, bounds: IntArray) -> IntArray:
    """Row-wise sums of ``values`` over the column ranges ``bounds[k]:bounds[k + 1]`` (empty
    ranges sum to 0)."""
    total = np.zeros((values.shape[0], values.shape[1] + 1), dtype=np.int64)
    np.cumsum(values, axis=1, out=total[:, 1:])
    result: IntArray = total[:, bounds[1:]] - total[:, bounds[:-1]]
    return result


def _starts(values: IntArray, starts: IntArray) -> IntArray:
    """Row-wise sums of ``values`` over the non-empty column ranges that begin at ``starts``."""
    if not len(starts):
        return np.zeros((values.shape[0], 0), dtype=np.int64)
    result: IntArray = np.add.reduceat(values, starts, axis=1)
    return result


def _modulo(values: IntArray, divisor: int) -> IntArray:
    """``values % divisor`` by table lookup (integer division is the slowest step otherwise)."""
    low = int(values.min(initial=0))
    table = np.arange(low, int(values.max(initial=0)) + 1, dtype=np.int64) % divisor
    result: IntArray = table[values - low]
    return result


@dataclass(frozen=True)
class Fit:
    """Every shape evaluated at N count vectors: ``valid`` (N x shapes), ``loss`` (N x shapes,
    meaningful where valid) and the entries of every edge (N x edges)."""

    valid: BoolArray
    loss: IntArray
    entries: IntArray


class Forests:
    """The shapes for a number of classes, laid out as edge arrays for :meth:`fit`.

    Edges are stored shape by shape and, within a shape, group by group, so per-group and
    per-shape sums are range sums.
    """

    def __init__(self, scores: IntArray, *, designated: bool, leftover: bool) -> None:
        """The shapes over the classes of the class score matrix ``scores`` (M)."""
        classes = len(scores)
        self.classes = classes
        self.shapes = shapes(classes, designated, leftover)
        self._inner = np.diag(scores).astype(np.int64)
        pair_loss = self._inner[:, None] + self._inner[None, :] - 2 * scores
        side: list[int] = []  # bitmask of the classes on the edge's far side
        far: list[tuple[bool, bool]] = []  # designated / leftover group on that side
        edge_kind: list[int] = []
        pure: list[bool] = []
        edge_shape: list[int] = []
        edge_class: list[int] = []
        edge_group: list[int] = []
        group_kind: list[int] = []
        group_shape: list[int] = []
        pairs: list[tuple[int, int]] = []
        pair_shape: list[int] = []
        for number, shape in enumerate(self.shapes):
            for g, (kind, support) in enumerate(shape):
                first = len(side)
                for c in support:
                    mask, sides = _far_side(shape, g, c)
                    side.append(mask)
                    far.append(sides)
                    edge_kind.append(kind)
                    pure.append(len(support) == 1)
                    edge_shape.append(number)
                    edge_class.append(c)
                    edge_group.append(len(group_kind))
                group_kind.append(kind)
                group_shape.append(number)
                if kind != DESIGNATED:  # the designated group is scored whole, not as a loss
                    for a, b in itertools.combinations(range(first, len(side)), 2):
                        pairs.append((a, b))
                        pair_shape.append(number)
        count = len(self.shapes)
        bits = np.asarray(side, dtype=np.int64)
        side_matrix = (bits[None, :] >> np.arange(classes)[:, None]) & 1
        # One product gives each entry before the modulo: residues times the classes on the
        # edge's far side, less the designated and leftover sizes when those lie there too.
        far_sizes = -np.asarray(far, dtype=np.int64).reshape(-1, 2).T
        self._side = np.vstack([side_matrix, far_sizes])
        self._kind = np.asarray(edge_kind, dtype=np.int64)
        self._full = self._kind == FULL
        self._pure = np.asarray(pure, dtype=bool)
        self._class = np.asarray(edge_class, dtype=np.int64)
        edge_shape_array = np.asarray(edge_shape, dtype=np.int64)
        self._group_kind = np.asarray(group_kind, dtype=np.int64)
        self._groups_of_shape = np.searchsorted(
            np.asarray(group_shape, dtype=np.int64), np.arange(count + 1)
        )  # for groups()
        self._edges_of_group = np.searchsorted(
            np.asarray(edge_group, dtype=np.int64), np.arange(len(group_kind) + 1)
        )
        self._edges_of_shape = np.searchsorted(edge_shape_array, np.arange(count + 1))
        pair_array = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        self._pair_a, self._pair_b = pair_array[:, 0], pair_array[:, 1]
        self._pairs_of_shape = np.searchsorted(
            np.asarray(pair_shape, dtype=np.int64), np.arange(count + 1)
        )
        self._pair_weight = pair_loss[self._class[self._pair_a], self._class[self._pair_b]]
        self._leftover_inner = np.where(self._kind == LEFTOVER, self._inner[self._class], 0)
        # Class totals per (shape, class) cell: edges sorted by cell, summed by range.
        key = edge_shape_array * classes + self._class
        self._by_cell = np.argsort(key, kind="stable")
        cells, starts = np.unique(key[self._by_cell], return_index=True)
        self._cell_starts = starts.astype(np.int64)
        self._cell_of_edge = np.empty(len(key), dtype=np.int64)
        self._cell_of_edge[self._by_cell] = np.searchsorted(cells, key[self._by_cell])
        self._group_of_edge = np.asarray(edge_group, dtype=np.int64)
        self._cell_class = (cells % classes).astype(np.int64)
        untouched = np.ones((count, classes), dtype=np.int64)
        untouched[cells // classes, cells % classes] = 0
        self._untouched = untouched.T.copy()
        self._designated_edges = np.flatnonzero(self._kind == DESIGNATED)
        self._designated_cells = (
            edge_shape_array[self._designated_edges] * classes + self._class[self._designated_edges]
        )

    @property
    def edges(self) -> int:
        return len(self._kind)

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))

    def fit(self, columns: IntArray, size: int, leftover: int, designated: int) -> Fit:
        """Evaluate every shape at each row of ``columns`` (N x classes: GPUs per class to
        partition). ``leftover`` and ``designated`` are those groups' sizes (the designated
        group's size after its must-include GPUs are taken out of ``columns``)."""
        s = size
        rows = len(columns)
        residue = _modulo(columns, s)
        knowns = np.hstack([residue, np.tile([designated, leftover], (rows, 1))])
        # Integers: a float product goes to the BLAS library, whose worker threads spin on a
        # busy node (milliseconds of wall time for a product of a few thousand cells).
        raw = knowns @ self._side
        group_sizes = np.asarray([designated, s, leftover], dtype=np.int64)
        sizes = group_sizes[self._kind]
        # A group of one class holds its whole size (the formula gives it modulo s).
        entries = np.where(self._pure, sizes, _modulo(raw, s))
        bad_edge = (entries < 1) | (entries > np.where(self._full, s - 1, sizes))
        bad_group = _starts(entries, self._edges_of_group[:-1]) != group_sizes[self._group_kind]
        totals = _starts(entries[:, self._by_cell], self._cell_starts)
        spare = columns[:, self._cell_class] - totals
        bad_cell = (spare < 0) | (_modulo(spare, s) != 0)
        # Every group and cell has an edge: mark each bad one on its edges, sum per shape once.
        bad_edge |= bad_group[:, self._group_of_edge] | bad_cell[:, self._cell_of_edge]
        bad = _ranges(bad_edge.astype(np.int64), self._edges_of_shape)
        bad += (residue != 0).astype(np.int64) @ self._untouched
        products = entries[:, self._pair_a] * entries[:, self._pair_b] * self._pair_weight
        loss = _ranges(products, self._pairs_of_shape) + _ranges(
            entries * ((s - leftover) * self._leftover_inner), self._edges_of_shape
        )
        return Fit(bad == 0, loss, entries)

    def designated_counts(self, entries: IntArray) -> IntArray:
        """The designated group's entries per shape: N x shapes x classes."""
        out = np.zeros((entries.shape[0], len(self.shapes) * self.classes), dtype=np.int64)
        out[:, self._designated_cells] = entries[:, self._designated_edges]
        return out.reshape(entries.shape[0], len(self.shapes), self.classes)

    def groups(self, entries: IntArray, shape: int) -> list[tuple[int, IntArray]]:
        """The groups of ``shape`` (kind, counts per class) with the entries of one row."""
        out = []
        for g in range(int(self._groups_of_shape[shape]), int(self._groups_of_shape[shape + 1])):
            counts = np.zeros(self.classes, dtype=np.int64)
            edges = slice(int(self._edges_of_group[g]), int(self._edges_of_group[g + 1]))
            counts[self._class[edges]] = entries[edges]
            out.append((int(self._group_kind[g]), counts))
        return out


def _far_side(shape: Shape, group: int, cls: int) -> tuple[int, tuple[bool, bool]]:
    """The classes (as a bitmask) and whether the designated / leftover group lie on ``cls``'s
    side of the forest once edge (``group``, ``cls``) is cut."""
    classes = {cls}
    groups: set[int] = set()
    todo = [cls]
    while todo:
        c = todo.pop()
        for g, (_, support) in enumerate(shape):
            if g != group and g not in groups and c in support:
                groups.add(g)
                for d in support:
                    if d not in classes:
                        classes.add(d)
                        todo.append(d)
    kinds = {shape[g][0] for g in groups}
    return sum(1 << c for c in classes), (DESIGNATED in kinds, LEFTOVER in kinds)
