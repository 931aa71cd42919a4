"""The upper bound the branch search (:mod:`nvplugin.allocator.methods.branch`) prunes with: twice
an upper bound on R, the best partition score of a count vector, from the node's parts (sockets) and
the components of its score levels, tabulated at start-up where a part is small, with the pairing
term that ties a part's big pieces to other parts' small ones.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]

CHUNK = 1 << 14
"""Count vectors per array operation at start-up, so its temporaries (a few int64 copies of a
chunk's vectors: 2^14 vectors of at most 8 counts, 1 MiB) keep the start-up peak low; larger
chunks save no time (docs/allocation.md)."""


class _Child(Protocol):
    """A group of a state, as the search unpacks it: its counts and its index in each part."""

    @property
    def counts(self) -> tuple[int, ...]: ...

    @property
    def parts(self) -> tuple[int, ...]: ...


class _Parent(Protocol):
    """A state of the search: its counts, as a tuple and as an array."""

    @property
    def counts(self) -> tuple[int, ...]: ...

    @property
    def y(self) -> IntArray: ...


PART_VECTORS = 4096
"""Most count vectors a part of the node may have for :class:`CountBound` to tabulate it."""


class CountBound:
    """Twice an upper bound on R (:mod:`nvplugin.allocator.methods.branch`'s docstring), tightened
    where the classes split into parts joined by low scores (sockets): with W the highest score
    between two parts, every group's pairs score W each, plus, inside each part, what the part's own
    scores less W add. A part's share is at most the best split of its GPUs into pieces of at most
    s, whatever their number (the pieces of the groups that cross it), which is tabulated at
    start-up for every size over the part's count vectors (a few thousand at most): exact for the
    part, where the components bound only each level of it.

    What that leaves loose is how the parts' pieces pair up: a piece of more than s/2 GPUs (and
    fewer than s) needs, in its group, pieces of other parts totalling fewer than s/2, each
    *small* (under s/2 GPUs). So in any partition the big pieces number at most the small ones
    (plus one when the leftover group, of ``r`` GPUs, has ``2r > s``: it may hold one big piece
    alone). Hence, for any ``lambda >= 0``, R is also at most the same sum with every part's
    pieces scored ``lambda`` more when small and ``lambda`` less when big, plus ``lambda`` times
    that one: a second table per size (:attr:`lambdas`), and the bound is the lower of the two.
    It stops a server of 4-GPU switches from counting, for groups of 5, on every switch staying
    whole in both sockets."""

    def __init__(self, scores: IntArray, sizes: list[int]) -> None:
        self.low, parts = _split(scores)
        self.parts: list[_Part] = []
        # The pairing term (class docstring): for sizes 3 up to the largest part's GPUs, where
        # every part is tabulated, with lambda twice the highest score inside a part.
        every = all(np.prod([sizes[c] + 1 for c in classes]) <= PART_VECTORS for classes in parts)
        lam = 2 * max(int((scores[np.ix_(c, c)] - self.low).max()) for c in parts)
        top = max(sum(sizes[c] for c in classes) for classes in parts)
        self.lambdas: dict[int, list[int]] = (
            {size: [lam] for size in range(3, min(sum(sizes), 2 * top))}
            if every and lam > 0 and len(parts) > 1
            else {}
        )
        extra = [(size, lam) for size, ls in self.lambdas.items() for lam in ls]
        for classes in parts:
            inner = scores[np.ix_(classes, classes)] - self.low
            self.parts.append(_Part(classes, inner, [sizes[c] for c in classes], extra))
        # Where every part is tabulated at every size, each size's tables (without the pairing
        # term, then with each lambda) are also laid end to end, so that all parts and lambdas
        # are looked up at once: ``flat[size]`` holds them, the lambdas (0 first) and where
        # each table starts (a row per lambda, a column per part). The search sets ``rows``
        # (where the parts' indices lie among its columns).
        self.flat: dict[int, tuple[IntArray, IntArray, IntArray]] = {}
        self.rows: slice | None = None
        lengths = [int(np.prod([sizes[c] + 1 for c in classes])) for classes in parts]
        offsets = np.cumsum([0, *lengths[:-1]]).astype(np.int64)
        gpus = sum(sizes)
        if all(part.table(size) is not None for part in self.parts for size in range(2, gpus + 1)):
            for size in range(2, gpus + 1):
                lams = [0, *self.lambdas.get(size, [])]
                laid = [part.table(size) for part in self.parts]
                laid += [part.penalised(size, lam) for lam in lams[1:] for part in self.parts]
                starts = offsets[None, :] + sum(lengths) * np.arange(len(lams))[:, None]
                self.flat[size] = (
                    np.concatenate(laid),  # type: ignore[arg-type]
                    np.asarray(lams, dtype=np.int64),
                    starts,
                )
        # For :meth:`one`, per size: each part's table as a list (None where the part is not
        # tabulated) and, per lambda, each part's table with the pairing term (references to
        # the parts' lists, nothing copied), so a child's bound is a few list lookups.
        self._lookups: dict[int, tuple[list[list[int] | None], list[tuple[int, list[list[int]]]]]]
        self._lookups = {
            size: (
                [part.listed(size) for part in self.parts],
                [
                    (lam, [part.penalised_list(size, lam) for part in self.parts])
                    for lam in self.lambdas.get(size, [])
                ],
            )
            for size in range(2, gpus + 1)
        }

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def indices(self, position: int) -> tuple[int, ...]:
        """The group at ``position``: its index among each tabulated part's count vectors."""
        return tuple(int(part.index[position]) if len(part.index) else 0 for part in self.parts)

    def starts(self, counts: tuple[int, ...]) -> tuple[int, ...]:
        """A state's index among each part's count vectors."""
        return tuple(
            sum(counts[c] * step for c, step in zip(part.classes, part.steps, strict=True))
            for part in self.parts
        )

    def one(
        self,
        starts: tuple[int, ...],
        entry: _Child,
        counts: tuple[int, ...],
        total: int,
        size: int,
        cmax: list[int],
    ) -> int:
        """:meth:`of` for one child (``counts`` less ``entry``'s), in Python."""
        base = self.low * cmax[total]
        if size == 1:
            return base
        tables, penalised = self._lookups[size]
        value = base
        for table, start, index, part in zip(tables, starts, entry.parts, self.parts, strict=True):
            if table is not None:
                value += table[start - index]
            else:
                child = [counts[c] - entry.counts[c] for c in part.classes]
                value += part.scalar(child, size, cmax)
        if penalised:
            slack = 1 if 2 * (total % size) > size else 0
            for lam, lists in penalised:
                other = base + lam * slack
                for table, start, index in zip(lists, starts, entry.parts, strict=True):
                    other += table[start - index]
                if other < value:
                    value = other
        return value

    def of(
        self,
        parent: _Parent,
        positions: NDArray[np.intp],
        total: int,
        size: int,
        cmax: list[int],
        groups: NDArray[np.int8],
        columns: NDArray[np.int32] | None = None,
        starts: tuple[int, ...] | None = None,
    ) -> IntArray:
        """For the children of ``parent`` through the groups at ``positions`` (each leaving
        ``total`` GPUs); ``columns``: those groups' columns of the search, if taken out;
        ``starts``: :meth:`starts` of the parent, if known."""
        if starts is None:
            starts = self.starts(parent.counts)
        flat = self.flat.get(size)
        if flat is not None and self.rows is not None:
            if columns is None:
                taken = np.stack([part.index[positions] for part in self.parts])
            else:
                taken = columns[self.rows]
            laid, lambdas, offsets = flat
            at = (offsets + np.asarray(starts))[:, :, None] - taken  # lambda, part, group
            values = laid[at].sum(axis=1)
            slack = 1 if 2 * (total % size) > size else 0
            if len(lambdas) == 1:
                best: IntArray = values[0] + self.low * cmax[total]
                return best
            values += (self.low * cmax[total] + lambdas * slack)[:, None]
            least: IntArray = values.min(axis=0)
            return least
        result: IntArray = np.full(len(positions), self.low * cmax[total], dtype=np.int64)
        if size == 1:
            return result
        rows: IntArray | None = None
        picked = [
            (part.index[positions] if columns is None else columns[part.row])
            if len(part.index)
            else None
            for part in self.parts
        ]
        for part, start, index in zip(self.parts, starts, picked, strict=True):
            table = part.table(size)
            if table is not None and index is not None:
                result += table[start - index]
                continue
            if rows is None:
                rows = parent.y - groups[positions]
            result += part.bound(rows[:, part.classes], size, np.asarray(cmax))
        lams = self.lambdas.get(size)
        if lams:
            slack = 1 if 2 * (total % size) > size else 0
            for lam in lams:
                other = np.full(len(positions), self.low * cmax[total] + lam * slack)
                for part, start, index in zip(self.parts, starts, picked, strict=True):
                    assert index is not None  # every part is tabulated where lambdas are
                    other += part.penalised(size, lam)[start - index]
                result = np.minimum(result, other)
        return result


class _Part:
    """One part of :class:`CountBound`: its classes, its scores less the parts' link, and either
    the table of its best split into pieces per size or the components bound."""

    def __init__(
        self,
        classes: list[int],
        scores: IntArray,
        sizes: list[int],
        extra: list[tuple[int, int]],
    ) -> None:
        self.classes = classes
        self._scores = scores
        self._score_list: list[list[int]] = scores.tolist()
        self._inner = np.diag(scores).copy()
        self._gpus = sum(sizes)
        # Where no pair inside scores below the link (nested scores: PCIe trees), one piece of
        # every GPU is the best split once the size allows it; otherwise that is tabulated too.
        self._merge = bool((scores >= 0).all())
        self.stride = np.cumprod([1] + [s + 1 for s in sizes[:0:-1]])[::-1].astype(np.int64)
        self.steps: list[int] = self.stride.tolist()
        self._tables: dict[int, IntArray] = {}
        self._penalised: dict[tuple[int, int], IntArray] = {}
        self._penalised_lists: dict[tuple[int, int], list[int]] = {}
        self.index = np.zeros(0, dtype=np.int32)
        self.row = 0  # of the index among the search's columns (BranchSearch)
        vectors = int(np.prod([s + 1 for s in sizes]))
        if vectors <= PART_VECTORS:
            wanted = range(2, self._gpus if self._merge else self._gpus + 1)
            both = _pieces(scores, sizes, [(size, 0) for size in wanted] + extra)
            self._tables = {size: both[(size, 0)] for size in wanted}
            self._penalised = {key: both[key] for key in extra}
            self._penalised_lists = {key: t.tolist() for key, t in self._penalised.items()}
            if self._merge:  # from the part's size on: its own score
                self._tables[self._gpus] = _twice_all(scores, sizes)
        self._lists = {size: table.tolist() for size, table in self._tables.items()}
        self._components, self._steps = _components(np.maximum(scores, 0), sizes)
        self._members = [np.flatnonzero(column).tolist() for column in self._components.T]
        self._weights: list[int] = self._steps.tolist()

    @property
    def tabulated(self) -> bool:
        """Whether the part has tables (then the search fills :attr:`index`: each group's
        index among the part's count vectors)."""
        return bool(self._tables or self._penalised)

    @property
    def nbytes(self) -> int:
        tables = (*self._tables.values(), *self._penalised.values())
        return sum(table.nbytes for table in tables)  # the index is the search's

    def penalised(self, size: int, lam: int) -> IntArray:
        """The table of the part's share with the pairing term (:class:`CountBound`)."""
        return self._penalised[(size, lam)]

    def penalised_list(self, size: int, lam: int) -> list[int]:
        """:meth:`penalised` as a list (for single lookups)."""
        return self._penalised_lists[(size, lam)]

    def listed(self, size: int) -> list[int] | None:
        """:meth:`table` as a list (for single lookups)."""
        return self._lists.get(min(size, self._gpus))

    def scalar(self, counts: list[int], size: int, cmax: list[int]) -> int:
        """:meth:`bound` for one row, in Python."""
        if size >= self._gpus and self._merge:
            scores = self._score_list
            k = len(counts)
            return sum(
                counts[c] * (counts[d] - (c == d)) * scores[c][d]
                for c in range(k)
                for d in range(k)
            )
        return sum(
            weight * cmax[sum(counts[c] for c in members)]
            for members, weight in zip(self._members, self._weights, strict=True)
        )

    def table(self, size: int) -> IntArray | None:
        """The tabulated share for ``size``, if any (None where :meth:`bound` computes it)."""
        return self._tables.get(min(size, self._gpus))

    def bound(self, rows: IntArray, size: int, cmax: IntArray) -> IntArray:
        """Twice an upper bound on the part's share of R for each row (its counts)."""
        if size >= self._gpus and self._merge:
            one: IntArray = ((rows @ self._scores) * rows).sum(axis=1) - rows @ self._inner
            return one
        levels: IntArray = cmax[rows @ self._components] @ self._steps
        return levels


def _split(scores: IntArray) -> tuple[int, list[list[int]]]:
    """The lowest score that, kept as the only link, still splits the classes: the components
    of the classes joined by higher scores, and the highest score between two of them (the
    whole set and 0 when no score splits them)."""
    m = len(scores)
    for t in sorted({int(scores[c, d]) for c in range(m) for d in range(m) if c != d}):
        label = list(range(m))
        for c in range(m):
            for d in range(c + 1, m):
                if scores[c, d] > t:
                    old, new = label[d], label[c]
                    label = [new if x == old else x for x in label]
        parts = [[c for c in range(m) if label[c] == x] for x in sorted(set(label))]
        if len(parts) > 1:
            return t, parts
    return 0, [list(range(m))]


def _twice_all(scores: IntArray, sizes: list[int]) -> IntArray:
    """Twice the score of every count vector of classes of these sizes (mixed-radix order)."""
    vectors = np.indices([s + 1 for s in sizes]).reshape(len(sizes), -1).T.astype(np.int64)
    twice: IntArray = ((vectors @ scores) * vectors).sum(axis=1) - vectors @ np.diag(scores)
    return twice


def _pairing(pieces: Any, size: int, lam: int) -> Any:
    """The pairing term of pieces of ``pieces`` GPUs (an int or an array of them) in groups of
    ``size``: ``lam`` more for a small piece (under size/2 GPUs), ``lam`` less for a big one
    (over size/2, under size) (:class:`CountBound`)."""
    return lam * (2 * pieces < size) - lam * ((2 * pieces > size) & (pieces < size))


def _pieces(
    scores: IntArray, sizes: list[int], wanted: list[tuple[int, int]]
) -> dict[tuple[int, int], IntArray]:
    """For each (size, lambda) in ``wanted``: twice the best score of a split of each count
    vector (of classes of these sizes, indexed by mixed-radix digits) into pieces of at most that
    many GPUs, any number of them, a piece of fewer than size/2 GPUs scoring lambda more and one
    of more than size/2 (but fewer than size) lambda less (:class:`CountBound`). Which pieces fit
    which vector is worked out once for all of them.

    The vectors are worked through by their number of GPUs t, and a vector of t GPUs only reads
    vectors of fewer. Two (size, lambda) that treat every piece of at most t GPUs alike (allowed
    or not, and the same gain) therefore have the same values up to t: at each t they are
    computed once and copied (every size from t on, without lambda; the sizes above 2t, with
    it)."""
    shape = [s + 1 for s in sizes]
    vectors = np.indices(shape).reshape(len(sizes), -1).T.astype(np.int64)
    stride = np.cumprod([1, *shape[:0:-1]])[::-1].astype(np.int64)
    twice = ((vectors @ scores) * vectors).sum(axis=1) - vectors @ np.diag(scores)
    totals = vectors.sum(axis=1)
    first = np.argmax(vectors > 0, axis=1)
    index = vectors @ stride
    tables = {key: np.zeros(len(vectors), dtype=np.int64) for key in wanted}
    lowest = np.iinfo(np.int64).min
    # The pieces in order of size, so that those a (size, lambda) allows are a prefix of them
    # (a column slice, not a mask over all of them), and each one's gain worked out once.
    by_size = np.argsort(totals, kind="stable")
    by_size = by_size[totals[by_size] >= 1]
    sorted_sizes = totals[by_size]
    gains: dict[tuple[int, int], IntArray] = {}
    for size, lam in wanted:
        gains[(size, lam)] = twice[by_size] + _pairing(sorted_sizes, size, lam)
    for total in range(1, int(totals.max(initial=0)) + 1):
        states = np.flatnonzero(totals == total)
        count = int(np.searchsorted(sorted_sizes, total, side="right"))
        pieces = by_size[:count]
        piece_vectors = vectors[pieces]
        # Per (size, lambda): how it treats each piece size up to ``total`` (whether allowed,
        # and the gain's term); the first (size, lambda) of each kind is computed, the others
        # copy it. And how many of the pieces it allows.
        alike: dict[tuple[int, tuple[tuple[bool, int], ...]], tuple[int, int]] = {}
        copies: dict[tuple[int, int], tuple[int, int]] = {}
        for size, lam in wanted:
            kind = (
                lam,
                tuple(
                    (piece <= size, int(_pairing(piece, size, lam)))
                    for piece in range(1, total + 1)
                ),
            )
            copies[(size, lam)] = alike.setdefault(kind, (size, lam))
        computed = sorted(set(copies.values()), key=wanted.index)
        allows = {
            key: int(np.searchsorted(sorted_sizes[:count], key[0], side="right"))
            for key in computed
        }
        step = max(1, CHUNK // max(1, len(pieces)))
        for start in range(0, len(states), step):
            chunk = states[start : start + step]
            fits = (piece_vectors[None, :, :] <= vectors[chunk][:, None, :]).all(axis=2)
            fits &= piece_vectors[:, first[chunk]].T >= 1  # holds the state's first class
            rest = np.where(fits, index[chunk][:, None] - index[pieces][None, :], 0)
            for key in computed:
                k, best = allows[key], tables[key]
                value = np.where(fits[:, :k], gains[key][None, :k] + best[rest[:, :k]], lowest)
                best[chunk] = value.max(axis=1)
        for key, source in copies.items():
            if key != source:
                tables[key][states] = tables[source][states]
    return tables


def _components(scores: IntArray, sizes: list[int]) -> tuple[IntArray, IntArray]:
    """The bound's columns (module docstring): a 0/1 matrix of classes x components and each
    component's weight (the sum of its threshold steps)."""
    m = len(sizes)
    values = sorted(
        {int(scores[c, d]) for c in range(m) for d in range(m) if c != d or sizes[c] > 1}
    )
    weights: dict[tuple[int, ...], int] = {}
    previous = 0
    for t in values:
        step, previous = t - previous, t
        label = list(range(m))
        for c in range(m):
            for d in range(c + 1, m):
                if scores[c, d] >= t:
                    old, new = label[d], label[c]
                    label = [new if x == old else x for x in label]
        for label_ in sorted(set(label)):
            members = tuple(c for c in range(m) if label[c] == label_)
            root = members[0]
            if len(members) == 1 and not (sizes[root] > 1 and scores[root, root] >= t):
                continue
            weights[members] = weights.get(members, 0) + step
    matrix = np.zeros((m, len(weights)), dtype=np.int64)
    for j, members in enumerate(weights):
        matrix[list(members), j] = 1
    return matrix, np.asarray(list(weights.values()), dtype=np.int64)
