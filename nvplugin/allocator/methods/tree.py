"""The ``tree`` method: the exact objective on nodes whose classes of interchangeable GPUs hang
from a tree (a PCIe tree, with or without an NVSwitch fabric every GPU reaches alike: a DGX-2), by
a dynamic programme over the tree's subtrees, in plain Python so that such a node never loads
numpy.

Class scores that form an ultrametric (:mod:`nvplugin.allocator.methods.twins`) are read back as a
tree (:func:`hierarchy`). A partition's score is a sum over tree nodes of each node's score step
times the pairs the groups' *pieces* leave inside it, so a subtree's best value per *profile* (the
marked group's piece, the multiset of the others') follows from its children's by matching their
pieces. The value compared is the packed triple (partition score, the marked group's own score,
its lex key): exactly OPT, then the highest own score, then the lex-smallest group
(docs/allocation.md#the-tree-programme).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from nvplugin.allocator.base import Allocation, Request
from nvplugin.allocator.methods.base import Best, warmed
from nvplugin.allocator.methods.twins import class_scores, twin_members
from nvplugin.node.model import Topology

TREE_GPUS = 16
"""Largest node the tree method takes: beyond, a 16-GPU socket has hundreds of profiles (203 on
a 32-GPU server of eight switches, every GPU free, against 30 on a DGX-2) and the branch search of
:mod:`nvplugin.allocator.methods.branch` is faster."""

CACHED = 1 << 12
"""Most results each of the piece functions below keeps (how pieces match, complete, cut), so a
long-lived ``serve`` holds them within a bound (docs/allocation.md has what a DGX-2 keeps)."""

OWN_BITS = 48
"""Width of the own-score field of a packed value (:class:`TreeSearch`): far above any group's
score, positive or negative."""

Profile = tuple[int, tuple[int, ...]]
"""A subtree's pieces: the marked group's piece, and the other groups' pieces (descending)."""

Table = dict[Profile, int]
"""A subtree's profiles, each with its best packed value (:class:`TreeSearch`)."""


@dataclass(frozen=True, slots=True)
class Node:
    """A subtree: ``delta`` is the score step of its pairs over its parent's (module
    docstring); a leaf is one class (``leaf``, -1 otherwise) and has no ``children``."""

    delta: int
    leaf: int
    children: tuple[Node, ...]


def hierarchy(scores: Sequence[Sequence[int]], sizes: Sequence[int]) -> Node | None:
    """The tree of classes whose scores between them (diagonal: inside) are ``scores``, and
    whose GPU counts are ``sizes``; None when the scores are not an ultrametric. A class of one
    GPU holds no pair, so its diagonal is never read."""
    m = len(sizes)
    for c in range(m):
        for d in range(m):
            if d == c:
                continue
            for e in range(m):
                if e not in (c, d) and scores[c][e] < min(scores[c][d], scores[d][e]):
                    return None

    def build(group: list[int], parent: int) -> Node:
        if len(group) == 1:
            c = group[0]
            inside = scores[c][c] if sizes[c] > 1 else parent
            return Node(inside - parent, c, ())
        t = min(scores[c][d] for c in group for d in group if c < d)
        blocks: list[list[int]] = []
        for c in group:
            block = next((b for b in blocks if scores[b[0]][c] > t), None)
            if block is None:
                blocks.append([c])
            else:
                block.append(c)
        children = tuple(build(block, t) for block in blocks)
        return Node(t - parent, -1, children)

    return build(list(range(m)), 0) if m else None


@dataclass(frozen=True)
class Answer:
    """A request's answer: the group (ascending), OPT and the group's own score."""

    group: tuple[int, ...]
    opt: int
    own: int


class TreeSearch:
    """The dynamic programme over one node's tree of classes (module docstring). Read-only
    after construction: threads may share one."""

    def __init__(self, scores: Sequence[Sequence[int]]) -> None:
        members, of = twin_members(scores)
        self.members = members
        self.of = of
        self.gpus = len(of)
        self.root = hierarchy(class_scores(scores, members), [len(g) for g in members])
        # The packed value: partition score, own score and lex key, each in bits of its own.
        # Partial sums of the own score may be negative (a step below a node can be), so the
        # own field is far wider than any score and the fields are compared as one integer.
        self._own_shift = self.gpus
        self._total_shift = self.gpus + OWN_BITS

    def best(self, available: Sequence[int], required: Sequence[int], size: int) -> Answer:
        """The answer to a possible request (``required`` within ``available``, ``len(required)
        <= size <= len(available)``; GPU indices)."""
        assert self.root is not None
        top = self.gpus - 1
        free: list[list[int]] = [[] for _ in self.members]
        must: list[list[int]] = [[] for _ in self.members]
        needed = set(required)
        for gpu in sorted(available):
            (must if gpu in needed else free)[self.of[gpu]].append(gpu)
        whole, left = divmod(len(available), size)
        cap = whole - 1 + (left > 0)  # pieces besides the marked one: one per other group
        request = _Request(size, cap, free, must, top, self._own_shift, self._total_shift)
        value = request.top_value(self.root, whole, left)
        own_total = value >> self._own_shift
        lex = value - (own_total << self._own_shift)
        opt = (own_total + (1 << (OWN_BITS - 1))) >> OWN_BITS  # the own field may be negative
        own = own_total - (opt << OWN_BITS)
        group = tuple(gpu for gpu in range(self.gpus) if lex >> (top - gpu) & 1)
        return Answer(group, opt, own)


@dataclass
class _Request:
    """One request's constants and its table of every subtree (:meth:`table`)."""

    size: int
    cap: int
    free: list[list[int]]
    must: list[list[int]]
    top: int
    own_shift: int
    total_shift: int

    def top_value(self, root: Node, whole: int, left: int) -> int:
        """The best value of the root's one wanted profile: the marked group of s, ``whole -
        1`` other groups of s and the leftover of ``left``. The root's last child is matched to
        it, not merged: for each profile of the other children, the pieces the last child must
        bring are known but for which piece is the leftover's (:func:`_complements`)."""
        size = self.size
        target: Profile = (size, (size,) * (whole - 1) + ((left,) if left else ()))
        if root.leaf >= 0:  # one class: its table holds its step already
            return self._leaf(root)[target]
        step = _pairs(target) * (root.delta << self.total_shift) + _half(size) * (
            root.delta << self.own_shift
        )
        tables = self._children(root)
        if len(tables) == 1:
            return tables[0][target] + step
        *first, last = tables
        rest = self._merged(first)
        best = None
        for (m1, o1), v1 in rest.items():
            for o2 in _complements(o1, size, whole - 1, left):
                v2 = last.get((size - m1, o2))
                if v2 is not None and (best is None or v1 + v2 > best):
                    best = v1 + v2
        assert best is not None, "some partition holds a full group with the must-include GPUs"
        return best + step

    def table(self, node: Node) -> Table:
        """Every profile of ``node``'s subtree that can be part of a partition, with its best
        value (its pairs' Δ included up to this node)."""
        if node.leaf >= 0:
            return self._leaf(node)
        merged = self._merged(self._children(node))
        if node.delta:
            step_total = node.delta << self.total_shift
            step_own = node.delta << self.own_shift
            merged = {
                key: value + _pairs(key) * step_total + _half(key[0]) * step_own
                for key, value in merged.items()
            }
        return merged

    def _merged(self, tables: list[Table]) -> Table:
        """The profiles of sibling subtrees taken together (:func:`_merge`, one at a time)."""
        merged = tables[0]
        for other in tables[1:]:
            merged = _merge(merged, other, self.size, self.cap)
        return merged

    def _children(self, node: Node) -> list[Table]:
        """The tables of ``node``'s children that hold an available GPU (one empty table when
        none does)."""
        tables = [self.table(child) for child in node.children]
        return [t for t in tables if len(t) != 1 or (0, ()) not in t] or [{(0, ()): 0}]

    def _leaf(self, node: Node) -> Table:
        c = node.leaf
        free, must = self.free[c], self.must[c]
        required = len(must)
        total = len(free) + required
        lex = 0
        for gpu in must:
            lex |= 1 << (self.top - gpu)
        step_total = node.delta << self.total_shift
        step_own = node.delta << self.own_shift
        out: Table = {}
        for marked in range(required, min(total, self.size) + 1):
            if marked > required:
                lex |= 1 << (self.top - free[marked - required - 1])
            inside = _half(marked)
            for parts in _partitions(total - marked, self.size, self.cap):
                key = (marked, parts)
                out[key] = _pairs(key) * step_total + inside * step_own + lex
        return out


def _half(k: int) -> int:
    """C(k, 2): the pairs inside a piece of k GPUs."""
    return k * (k - 1) // 2


def _pairs(key: Profile) -> int:
    """The pairs inside a profile's pieces, the marked one's included."""
    return _half(key[0]) + sum(_half(p) for p in key[1])


@functools.lru_cache(maxsize=CACHED)
def _partitions(k: int, size: int, cap: int) -> tuple[tuple[int, ...], ...]:
    """Every way to cut k GPUs into at most ``cap`` pieces of at most ``size``, each as its
    piece sizes in descending order."""
    out: list[tuple[int, ...]] = []

    def cut(rest: int, largest: int, pieces: tuple[int, ...]) -> None:
        if rest == 0:
            out.append(pieces)
            return
        if len(pieces) == cap:
            return
        for p in range(min(rest, largest), 0, -1):
            cut(rest - p, p, (*pieces, p))

    cut(k, size, ())
    return tuple(out)


def _merge(left: Table, right: Table, size: int, cap: int) -> Table:
    """The profiles of two sibling subtrees taken together: marked pieces add up, and each
    other piece of ``right`` joins at most one of ``left`` (:func:`_combine`)."""
    out: Table = {}
    get = out.get
    for (m1, o1), v1 in left.items():
        for (m2, o2), v2 in right.items():
            marked = m1 + m2
            if marked > size:
                continue
            value = v1 + v2
            for pieces in _combine(o1, o2, size, cap):
                key = (marked, pieces)
                old = get(key)
                if old is None or value > old:
                    out[key] = value
    return out


@functools.lru_cache(maxsize=CACHED)
def _complements(
    pieces: tuple[int, ...], size: int, groups: int, left: int
) -> tuple[tuple[int, ...], ...]:
    """The other pieces a last subtree must have so that, with ``pieces``, they make exactly
    ``groups`` groups of ``size`` and (``left`` > 0) one leftover group of ``left``: each piece
    short of its group gets its complement, the groups not met yet come whole. One answer per
    choice of the leftover's piece (none: the leftover comes whole)."""
    choices: list[int | None] = [None]
    if left:
        choices += sorted({p for p in pieces if p <= left})
    out = []
    for leftover in choices:
        rest = list(pieces)
        need: list[int] = []
        if leftover is not None:
            rest.remove(leftover)
            if leftover < left:
                need.append(left - leftover)
        elif left:
            need.append(left)
        if any(p > size for p in rest) or len(rest) > groups:
            continue
        need += [size - p for p in rest if p < size]
        need += [size] * (groups - len(rest))
        out.append(tuple(sorted(need, reverse=True)))
    return tuple(out)


@functools.lru_cache(maxsize=CACHED)
def _combine(
    left: tuple[int, ...], right: tuple[int, ...], size: int, cap: int
) -> tuple[tuple[int, ...], ...]:
    """Every multiset of pieces that matching some pieces of ``right`` with distinct pieces of
    ``left`` (two matched pieces: one group's, so at most ``size`` together) can give, with at
    most ``cap`` pieces; each once. Pieces of one size in ``right`` take partners in
    non-decreasing order (alone first), so no matching is listed twice."""
    if not left or not right:
        both = left or right
        return (both,) if len(both) <= cap else ()
    pool: dict[int, int] = {}
    for p in left:
        pool[p] = pool.get(p, 0) + 1
    values = sorted(pool)
    out: set[tuple[int, ...]] = set()
    last = len(right) - 1

    def match(i: int, merged: list[int], low: int) -> None:
        if len(merged) + max(sum(pool.values()), last - i + 1) > cap:
            return  # even if every piece left of ``right`` joined one, too many pieces
        if i > last:
            rest = [v for v in values for _ in range(pool[v])]
            out.add(tuple(sorted(merged + rest, reverse=True)))
            return
        p = right[i]
        same = i < last and right[i + 1] == p
        if low == 0:
            match(i + 1, [*merged, p], 0)
        for v in values:
            if v < low or v + p > size or not pool[v]:
                continue
            pool[v] -= 1
            match(i + 1, [*merged, v + p], v if same else 0)
            pool[v] += 1

    match(0, [], 0)
    return tuple(out)


class TreeMethod:
    """The ``tree`` method: nodes of :data:`TREE_GPUS` GPUs or fewer whose classes of twins
    hang from a tree."""

    name = "tree"

    def __init__(self, topology: Topology, search: TreeSearch) -> None:
        self._topology = topology
        self._search = search

    @classmethod
    def build(cls, topology: Topology) -> TreeMethod | None:
        n = len(topology)
        if n > TREE_GPUS:
            return None
        search = TreeSearch(topology.scores)
        if search.root is None:
            return None
        # One request per size fills the caches of how pieces match that later requests read.
        return warmed(cls(topology, search), n, range(1, n + 1))

    @property
    def nbytes(self) -> int:
        return 0  # the tree, and caches bounded by CACHED

    def best(self, request: Request, deadline: float) -> Best:
        answer = self._search.best(request.available, request.must_include, request.size)
        return Best(answer.group, answer.own, answer.opt)

    def explain(
        self, request: Request, group: tuple[int, ...], deadline: float, *, contenders: bool
    ) -> Allocation:
        """The programme keeps no partition and no contender, so an explanation (``nvplugin
        preferred --explain``, never ``serve``: it loads numpy) builds the branch search over
        the node's classes and reads them off it."""
        from nvplugin.allocator.methods import counting
        from nvplugin.allocator.methods.branch import BranchSearch
        from nvplugin.allocator.methods.classes import twin_classes

        search = BranchSearch(twin_classes(self._topology.scores))
        return counting.explain(search, self._topology, request, group, contenders=contenders)
