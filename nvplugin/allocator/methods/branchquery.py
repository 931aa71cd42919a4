"""One request's walk of the branch search (:mod:`nvplugin.allocator.methods.branch`): the
states (count vectors still to partition), their children (one group less) ranked by bound and
listed a few at a time, and the fail-soft recursion over them that solves R, the best partition
score of a state, against the node's memo. It reads the node's :class:`Layout` and nothing else of
the search.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import sub
from typing import Any

import numpy as np
from numpy.typing import NDArray

from nvplugin.allocator.base import OutOfTime
from nvplugin.allocator.methods.branchlayout import Layout

IntArray = NDArray[np.int64]

FIRST = 8
"""Children of a state listed (as Python) when it is expanded; four times as many each time a
search gets past them."""

HEAD = 256
"""Children of a state sorted at once, with those tied with the last (:data:`FIRST` of them
listed); the rest only when a search gets past them, which it seldom does: the top of an
all-free 32-GPU node has ~6 000 groups of 14, and the search tries one or two."""

UNKNOWN = 1 << 62
"""The cap of a state nothing above has bounded."""


@dataclass(slots=True)
class State:
    """A count vector to partition: its counts, index (mixed-radix digits), total, memo key."""

    counts: tuple[int, ...]
    index: int
    total: int
    key: int

    @property
    def y(self) -> IntArray:
        return np.asarray(self.counts, dtype=np.int64)


@dataclass(frozen=True)
class Arrays:
    """The states one group below a state, as arrays: the groups' positions (size-ordered
    list), their own scores (twice), the children's memo keys and twice an upper bound on each
    child's ``own + R`` (exact for children that hold at most one group: ``terminal``)."""

    positions: NDArray[np.intp]
    own: NDArray[np.signedinteger[Any]]
    keys: NDArray[np.int32]
    bounds: IntArray
    terminal: NDArray[np.bool_]

    @staticmethod
    def of(items: list[Item]) -> Arrays:
        """Children found in Python, as arrays."""
        bounds, exact, own, keys, positions = zip(*items, strict=True)
        return Arrays(
            np.asarray(positions, dtype=np.intp),
            np.asarray(own, dtype=np.int64),
            np.asarray(keys, dtype=np.int32),
            np.asarray(bounds, dtype=np.int64),
            np.asarray(exact, dtype=np.bool_),
        )

    @staticmethod
    def join(parts: list[Arrays]) -> Arrays:
        return Arrays(
            np.concatenate([p.positions for p in parts]),
            np.concatenate([p.own for p in parts]),
            np.concatenate([p.keys for p in parts]),
            np.concatenate([p.bounds for p in parts]),
            np.concatenate([p.terminal for p in parts]),
        )


Item = tuple[int, bool, int, int, int]
"""A child as the search walks it: (bound, exact, own score (twice), memo key, position)."""


@dataclass
class Children:
    """The children worth trying, highest bound first (:data:`Item`). Children whose bound
    cannot beat the best exact one are left out. A search seldom tries more than a few, so they
    are listed (as Python) a few at a time: ``listed`` the first, ``pending`` the others, as
    indices into ``kids`` in runs; a run marked ordered is highest bound first, the others are
    sorted (the :data:`HEAD` highest first) when :meth:`items` gets to them. All the children of
    one run have higher bounds than those of later runs (one request's object: the memo of a
    :class:`Query`)."""

    listed: list[Item]
    kids: Arrays | None = None
    pending: list[tuple[NDArray[np.intp], bool]] = field(default_factory=list)
    count: int = FIRST
    _more: Children | None = field(default=None, repr=False)

    @staticmethod
    def of(
        kids: Arrays,
        kept: NDArray[np.intp] | None,
        ordered: bool = False,
        count: int = FIRST,
        pending: list[tuple[NDArray[np.intp], bool]] | None = None,
    ) -> Children:
        """The children ``kept`` (indices into ``kids``; None: all; ``ordered``: already highest
        bound first), highest bound first (stable), the first ``count`` listed; ``pending``:
        runs of lower bounds still to come."""
        bounds = kids.bounds
        later = list(pending or [])
        if kept is None:
            kept = np.arange(len(bounds))
        if not ordered:
            if len(kept) > HEAD:
                values = bounds[kept]
                cut = np.partition(values, len(kept) - HEAD)[len(kept) - HEAD]
                later.insert(0, (kept[values < cut], False))
                kept = kept[values >= cut]
            kept = kept[np.argsort(-bounds[kept], kind="stable")]
        if len(kept) > count:
            later.insert(0, (kept[count:], True))
            kept = kept[:count]
        listed = zip(
            bounds[kept].tolist(),
            kids.terminal[kept].tolist(),
            kids.own[kept].tolist(),
            kids.keys[kept].tolist(),
            kids.positions[kept].tolist(),
            strict=True,
        )
        return Children(list(listed), kids, later, count)

    @staticmethod
    def ranked(items: list[Item]) -> Children:
        """The children worth trying of ``items`` (in the order they were found), in Python:
        those whose bound beats the best exact one, and the first exact one that has it,
        highest bound first (stable)."""
        floor = max((item[0] for item in items if item[1]), default=None)
        if floor is not None:
            kept: list[Item] = []
            tied = False
            for item in items:
                if item[0] > floor:
                    kept.append(item)
                elif item[0] == floor and item[1] and not tied:
                    kept.append(item)
                    tied = True
            items = kept
        items.sort(key=_down)
        return Children(items)

    def items(self) -> Iterator[Item]:
        """Every child, highest bound first."""
        chunk: Children | None = self
        while chunk is not None:
            yield from chunk.listed
            if chunk.pending and chunk._more is None:
                assert chunk.kids is not None
                (indices, ordered), *later = chunk.pending
                count = chunk.count * 4
                chunk._more = Children.of(chunk.kids, indices, ordered, count, later)
            chunk = chunk._more


def _down(item: Item) -> int:
    return -item[0]


class Query:
    """One request's search state: the group size, the bound's constants and the memo.

    ``rest(state, need, cap)`` is the search. ``cap`` is an upper bound on the state's R known
    from above (a state one group g below a state of R at most C has R at most ``C - f(g)``),
    so a state whose best meets its cap is solved without trying its other children."""

    def __init__(
        self,
        layout: Layout,
        memo: dict[int, tuple[int, bool]],
        gpus: int,
        size: int,
        deadline: float | None,
    ) -> None:
        """``memo``: the node's memo of R for ``size`` (twice R, and whether exact, by state
        key), shared with the node's other requests of that size; ``gpus``: the most GPUs a
        state has."""
        self._layout = layout
        self._size = size
        self._deadline = deadline
        whole, part = np.divmod(np.arange(gpus + 1, dtype=np.int64), size)
        self.cmax: list[int] = (whole * (size * (size - 1)) + part * (part - 1)).tolist()
        """Twice the most pairs groups of ``size`` can hold among k GPUs, for each k."""
        self._memo = memo
        self._expanded: dict[int, Children] = {}  # each state's children, listed once

    def state(self, y: IntArray) -> State:
        index = int(y @ self._layout.stride)
        return State(tuple(y.tolist()), index, int(y.sum()), int(self._layout.keys[index]))

    def child(self, parent: State, position: int, key: int) -> State:
        layout = self._layout
        group = layout.groups[position].tolist()
        counts = tuple(map(sub, parent.counts, group))
        index = parent.index - int(layout.index[position])
        return State(counts, index, parent.total - sum(group), key)

    def arrays(
        self,
        parent: State,
        positions: NDArray[np.intp],
        k: int,
        columns: NDArray[np.int32] | None = None,
        starts: tuple[int, ...] | None = None,
    ) -> Arrays:
        """The children through the groups of ``k`` GPUs at ``positions`` (``columns``: those
        groups' columns of the search, when already taken out; ``starts``: the parent's index
        in each part, when known)."""
        layout = self._layout
        if columns is None:
            own = layout.twice_column[positions]
            index = parent.index - layout.index[positions].astype(np.int64)
        else:
            own = columns[0]
            index = parent.index - columns[1]
        keys = layout.keys[index]
        total = parent.total - k
        if total <= self._size:  # one group or none left: exact
            rest = layout.twice_column[layout.position[index]] if self._size > 1 else 0
            bounds = own + rest
        else:
            bounds = own + layout.bound.of(
                parent,
                positions,
                total,
                self._size,
                self.cmax,
                layout.groups,
                columns,
                starts,
            )
        terminal = np.full(len(positions), total <= self._size)
        return Arrays(positions, own, keys, bounds, terminal)

    def ranked(self, kids: Arrays, found: list[Item] | None = None, first: bool = True) -> Children:
        """The children worth trying (:class:`Children`) from their arrays, and from those
        ``found`` in Python (listed before the arrays' when ``first``): none whose bound cannot
        beat the best exact one, but the first exact one that has it."""
        if found:
            both = [Arrays.of(found), kids]
            kids = Arrays.join(both if first else both[::-1])
        bounds, terminal = kids.bounds, kids.terminal
        if not terminal.any():
            return Children.of(kids, None)
        floor = int(bounds[terminal].max())
        keep = bounds > floor
        keep[np.flatnonzero(terminal & (bounds == floor))[0]] = True
        return Children.of(kids, np.flatnonzero(keep))

    def children(self, parent: State) -> Children:
        """The children through the groups holding the parent's first class (one per
        arrangement of twins): of the group size, and of the leftover's when one is due. Small
        slices of groups are walked in Python, the others with arrays."""
        done = self._expanded.get(parent.index)
        if done is not None:
            return done
        layout = self._layout
        counts = parent.counts
        first = next(c for c, count in enumerate(counts) if count)
        sizes = sorted({self._size, parent.total % self._size} - {0})
        equal = sum(1 << bit for bit, (c, d) in enumerate(layout.pairs) if counts[c] == counts[d])
        starts = layout.bound.starts(counts)
        few = [k for k in sizes if (k, first) in layout.few]
        found = self._few(parent, few, first, equal, starts) if few else []
        if len(few) == len(sizes):
            done = Children.ranked(found)
        else:
            high = np.int64(layout.pack(list(counts)) | layout.guard | layout.ones)
            mask = np.int64(layout.guard | equal << layout.top)
            many = [
                self._fitting(parent, k, first, high, mask, starts) for k in sizes if k not in few
            ]
            kids = many[0] if len(many) == 1 else Arrays.join(many)
            done = self.ranked(kids, found, bool(few) and few[0] == sizes[0])
        self._expanded[parent.index] = done
        return done

    def _fitting(
        self,
        parent: State,
        k: int,
        first: int,
        high: np.int64,
        mask: np.int64,
        starts: tuple[int, ...],
    ) -> Arrays:
        """The children through the groups of ``k`` GPUs that hold the parent's ``first`` class
        (one arrangement of twins with equal counts): :meth:`Layout.fitting` and
        :meth:`arrays` in one selection of the groups' columns. ``high``: the parent's counts
        packed, guard bits and disorder bits set; ``mask``: the guard bits and the bits of the
        twin pairs whose counts are equal (``Layout.packed``)."""
        layout = self._layout
        row = k * (layout.m + 1) + first
        lo, hi = int(layout.slices[row]), int(layout.slices[row + 1])
        picked = np.flatnonzero(((high - layout.packed[lo:hi]) & mask) == mask)
        return self.arrays(parent, picked + lo, k, layout.columns[:, lo:hi][:, picked], starts)

    def _few(
        self, parent: State, sizes: list[int], first: int, equal: int, starts: tuple[int, ...]
    ) -> list[Item]:
        """The children through small slices of groups, in Python, in the order found (those
        exact ones that cannot be the first exact one of the best bound left out)."""
        layout, size, counts = self._layout, self._size, parent.counts
        guard = layout.guard
        high = layout.pack(list(counts)) | guard
        one, cmax = layout.bound.one, self.cmax
        keys_of, twice, position = layout.keys, layout.twice_column, layout.position
        found: list[Item] = []
        floor = -1
        for k in sizes:
            total = parent.total - k
            for entry in layout.few[(k, first)]:
                if entry.disorder & equal:
                    continue
                if (high - entry.packed) & guard != guard:  # some class short (``_packed``)
                    continue
                index = parent.index - entry.index
                exact = total <= size
                if exact:
                    bound = entry.twice + (int(twice[position[index]]) if size > 1 else 0)
                    if bound <= floor:
                        continue
                    floor = bound
                else:
                    bound = entry.twice + one(starts, entry, counts, total, size, cmax)
                found.append((bound, exact, entry.twice, int(keys_of[index]), entry.position))
        return found

    def first_bound(self, state: State) -> int:
        """An upper bound on the state's R to start the search with: what the memo knows of it
        (an earlier request may have solved it), else the highest bound of its children; 0
        where R needs no search."""
        if state.total <= self._size or self._size == 1:
            return 0
        known = self._memo.get(state.key)
        if known is not None:
            return known[0]
        return next(iter(self.children(state).items()))[0]

    def rest(self, state: State, need: int, cap: int) -> tuple[int, bool]:
        """Twice R(y) and True; or, when R(y) < ``need``, possibly an upper bound below ``need``
        and False. ``cap``: an upper bound on R(y) (twice)."""
        known = self._memo.get(state.key)
        if known is not None and (known[1] or known[0] < need):
            return known
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise OutOfTime
        if state.total <= self._size or self._size == 1:
            value = 0 if self._size == 1 else int(self._layout.twice(state.y[None, :])[0])
            result = (value, True)
        else:
            if known is not None:
                cap = min(cap, known[0])
            best, upper = self.best_child(state, self.children(state), need, -1, cap)
            result = (best, True) if upper <= best else (upper, False)
        self._memo[state.key] = result
        return result

    def best_child(
        self, parent: State, children: Children, need: int, best: int, cap: int
    ) -> tuple[int, int]:
        """Over the children: the best exact ``own + R(child)`` (at least ``best``) and an upper
        bound on the children not solved exactly (-1 when every one that could beat the best
        was). No child scores more than ``cap``."""
        upper = -1
        memo = self._memo
        for bound, exact, f, key, position in children.items():
            bound = min(bound, cap)
            if bound <= best:
                break  # no child left can beat the best
            if exact:  # its bound is its value
                best = bound
                continue
            if bound < need:
                upper = max(upper, bound)
                break  # none left can reach what the caller needs
            known = memo.get(key)
            if known is not None and not known[1]:  # a bound learnt below: tighter
                if known[0] + f <= best:
                    continue
                if known[0] + f < need:
                    upper = max(upper, known[0] + f)
                    continue
            child = self.child(parent, position, key)
            value, solved = self.rest(child, max(need, best + 1) - f, bound - f)
            if solved:
                best = max(best, value + f)
            elif value + f > best:
                upper = max(upper, value + f)
        return best, upper

    def best_group(self, state: State, value: int) -> IntArray:
        """A group g holding y's first class with ``f(g) + R(y - g) = value`` (``value`` = R(y))."""
        children = self.children(state)
        for _, _, f, key, position in children.items():
            child, exact = self.rest(self.child(state, position, key), value - f, value - f)
            if exact and child + f == value:
                found: IntArray = self._layout.groups[position].astype(np.int64)
                return found
        raise AssertionError("R(y) is reached by some group")
