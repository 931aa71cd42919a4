"""The subset tables of :mod:`nvplugin.allocator.methods.tables` for nodes of at most
:data:`SMALL_GPUS` GPUs, in plain Python: the same numbers, the same answers, no numpy.

Why a second form: on 2^8 = 256 masks a query reads at most C(8, 4) = 70 candidate groups, so
numpy buys nothing there, while importing it costs the process memory and start-up time
(docs/allocation.md#how-it-is-computed). Most nodes in a fleet have at most eight GPUs (a DGX or
HGX A100/H100, a PCIe server of four or eight cards): with these tables their plugin never loads
numpy. The module also holds the ``tables`` method on such nodes, and how either form of the
tables explains a group (:func:`explain_table`).

The recurrence and the reading rules are those of :mod:`nvplugin.allocator.methods.tables` (its
docstring): ``setscore[m]`` is the sum of pair scores inside mask m; ``rest[s][m]`` is the best
score of a partition of m into groups of s plus one leftover group of ``popcount(m) mod s``,
exact for popcounts up to n - s. The candidate groups of a size are listed in lex order of their
sorted indices, and the answer is the first group with the best own score among those reaching
OPT: exactly what :meth:`Tables.best_group` picks (tests/allocator/test_smalltables.py checks
every query of random nodes against it).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, SupportsInt

from nvplugin.allocator.base import Allocation, Request
from nvplugin.allocator.methods.base import POLICY, Best, warmed
from nvplugin.node.model import Topology

SMALL_GPUS = 8
"""Largest node these tables are for (2^8 masks)."""


def set_scores(scores: Sequence[Sequence[int]]) -> list[int]:
    """``setscore`` for all 2^n masks: a mask scores its part without its lowest member plus
    that member's pair scores with the rest."""
    n = len(scores)
    table = [0] * (1 << n)
    for mask in range(1, 1 << n):
        low = (mask & -mask).bit_length() - 1
        rest = mask & (mask - 1)
        row = scores[low]
        table[mask] = table[rest] + sum(row[j] for j in range(low + 1, n) if rest >> j & 1)
    return table


class ScoreTable(Protocol):
    """A table read by mask: a list here, an int64 array in
    :mod:`nvplugin.allocator.methods.tables`."""

    def __getitem__(self, mask: int, /) -> SupportsInt: ...


def _with_lowest(mask: int, s: int) -> list[int]:
    """The groups the recurrence tries for ``mask``: those holding its lowest member, of ``s``
    GPUs, then of the leftover's ``popcount(mask) mod s`` when there is one."""
    members = [1 << i for i in range(mask.bit_length()) if mask >> i & 1]
    low, others = members[0], members[1:]
    k = len(members)
    sizes = (s, k % s) if k % s else (s,)
    return [low | sum(c) for size in sizes for c in itertools.combinations(others, size - 1)]


def levels(n: int) -> dict[int, list[int]]:
    """The masks of each popcount (every size's recurrence reads the same levels)."""
    by_count: dict[int, list[int]] = {}
    for mask in range(1 << n):
        by_count.setdefault(mask.bit_count(), []).append(mask)
    return by_count


def partition_table(
    setscore: list[int], by_count: dict[int, list[int]], n: int, s: int
) -> list[int]:
    """``rest[s]``: levels by popcount (:func:`levels`), lowest first, each from the levels
    below it."""
    if s == 1:
        return [0] * len(setscore)
    rest = list(setscore)
    for k in range(s, n - s + 1):
        for mask in by_count[k]:
            rest[mask] = max([setscore[g] + rest[mask ^ g] for g in _with_lowest(mask, s)])
    return rest


def split(setscore: ScoreTable, rest: ScoreTable, mask: int, s: int) -> tuple[list[int], int]:
    """A best partition of ``mask`` (popcount <= n - s) into groups of ``s`` and a leftover, as
    masks, walking ``rest`` back lowest GPU first (both table forms; only ``--explain`` uses
    it)."""
    groups: list[int] = []
    while mask:
        if mask.bit_count() < s:
            return groups, mask
        target = int(rest[mask])
        found = next(
            (g for g in _with_lowest(mask, s) if int(setscore[g]) + int(rest[mask ^ g]) == target),
            0,
        )
        assert found, "rest table inconsistent"
        if found.bit_count() == s:
            groups.append(found)
            mask ^= found
        else:
            # The leftover holds the lowest GPU; the remainder splits into full groups.
            inner, _ = split(setscore, rest, mask ^ found, s)
            return groups + inner, found
    return groups, 0


@dataclass(frozen=True)
class SmallTables:
    """The tables for n <= :data:`SMALL_GPUS` GPUs and every group size (the interface of
    :class:`nvplugin.allocator.methods.tables.Tables` that best-effort uses)."""

    n: int
    setscore: list[int]
    rest: dict[int, list[int]]
    groups: dict[int, list[int]]

    @classmethod
    def build(cls, scores: Sequence[Sequence[int]]) -> SmallTables:
        n = len(scores)
        if n > SMALL_GPUS:
            raise ValueError(f"{n} GPUs: these tables are for at most {SMALL_GPUS}")
        setscore = set_scores(scores)
        by_count = levels(n)
        rest: dict[int, list[int]] = {}
        groups: dict[int, list[int]] = {}
        for s in range(1, n + 1):
            rest[s] = setscore if 2 * s > n else partition_table(setscore, by_count, n, s)
            groups[s] = [sum(1 << i for i in c) for c in itertools.combinations(range(n), s)]
        return cls(n, setscore, rest, groups)

    @property
    def nbytes(self) -> int:
        """The lists' own memory (their small ints are shared or a few bytes each)."""
        lists = {id(x): x for x in (self.setscore, *self.rest.values(), *self.groups.values())}
        return sum(sys.getsizeof(x) for x in lists.values())

    def candidates(self, available: int, required: int, s: int) -> list[tuple[int, int, int]]:
        """The s-subsets of ``available`` that contain ``required``, in lex order: (group, its
        own score, the best score of a partition of ``available`` containing it)."""
        setscore, rest = self.setscore, self.rest[s]
        out = []
        for group in self.groups[s]:
            if group & available == group and group & required == required:
                own = setscore[group]
                out.append((group, own, own + rest[available ^ group]))
        return out

    def best_group(self, available: int, required: int, s: int) -> tuple[int, int, int] | None:
        """(group mask, group score, OPT), as :meth:`Tables.best_group`."""
        best: tuple[int, int, int] | None = None
        for group, own, total in self.candidates(available, required, s):
            if best is None or total > best[2] or (total == best[2] and own > best[1]):
                best = (group, own, total)
        return best

    def ranked(self, available: int, required: int, s: int) -> list[tuple[int, int]]:
        """Every group reaching OPT as (group, own score), best own score first, then lex."""
        found = self.candidates(available, required, s)
        if not found:
            return []
        opt = max(total for _, _, total in found)
        optimal = [(group, own) for group, own, total in found if total == opt]
        return sorted(optimal, key=lambda item: -item[1])  # stable: lex order within a score

    def split(self, mask: int, s: int) -> tuple[list[int], int]:
        return split(self.setscore, self.rest[s], mask, s)


class TablesMethod:
    """The ``tables`` method over either form of the tables (:class:`Table`): answers and
    explanations read them; each form's subclass builds them."""

    name = "tables"

    def __init__(self, tables: Table) -> None:
        self._tables = tables

    @property
    def nbytes(self) -> int:
        return self._tables.nbytes

    def best(self, request: Request, deadline: float) -> Best:
        found = self._tables.best_group(
            request.available_mask, request.must_include_mask, request.size
        )
        assert found is not None, "a possible request always has a candidate group"
        return Best(gpus(found[0], ()), found[1], found[2])

    def explain(
        self, request: Request, group: tuple[int, ...], deadline: float, *, contenders: bool
    ) -> Allocation:
        return explain_table(self._tables, (), request, group, contenders=contenders)


class SmallTableMethod(TablesMethod):
    """The ``tables`` method on nodes of at most :data:`SMALL_GPUS` GPUs."""

    @classmethod
    def build(cls, topology: Topology) -> SmallTableMethod | None:
        n = len(topology)
        if n > SMALL_GPUS:
            return None
        return warmed(cls(SmallTables.build(topology.scores)), n, [max(1, n // 2)])


class Table(Protocol):
    """What an explanation reads of either form of the tables (this module's, or
    :class:`nvplugin.allocator.methods.tables.Tables`)."""

    @property
    def setscore(self) -> ScoreTable: ...

    @property
    def rest(self) -> Mapping[int, ScoreTable]: ...

    def ranked(self, available: int, required: int, s: int) -> list[tuple[int, int]]: ...

    def split(self, mask: int, s: int) -> tuple[list[int], int]: ...

    @property
    def nbytes(self) -> int: ...

    def best_group(self, available: int, required: int, s: int) -> tuple[int, int, int] | None: ...


def explain_table(
    tables: Table,
    labels: tuple[int, ...],
    request: Request,
    group: tuple[int, ...],
    *,
    contenders: bool,
) -> Allocation:
    """``group``'s score, the best partition of the available GPUs holding it and its score,
    read off ``tables`` (and with ``contenders``, every group reaching OPT, ranked). ``labels``:
    the GPU index of each table position (empty when positions are GPU indices)."""
    s = request.size
    available = relabel(request.available_mask, labels)
    chosen = relabel(sum(1 << gpu for gpu in group), labels)
    own = int(tables.setscore[chosen])
    total = own + int(tables.rest[s][available ^ chosen])
    full, leftover = tables.split(available ^ chosen, s)
    others = sorted((gpus(g, labels) for g in full), key=lambda g: g[0])
    answer = gpus(chosen, labels)
    ranked: tuple[tuple[tuple[int, ...], int], ...] = ()
    if contenders:
        required = relabel(request.must_include_mask, labels)
        ranked = tuple(
            (gpus(mask, labels), score) for mask, score in tables.ranked(available, required, s)
        )
    return Allocation(
        POLICY, answer, own, total, (answer, *others), gpus(leftover, labels), contenders=ranked
    )


def gpus(mask: int, labels: tuple[int, ...]) -> tuple[int, ...]:
    """A mask over table positions as GPU indices, ascending (positions are GPU indices when
    ``labels`` is empty)."""
    local = tuple(i for i in range(mask.bit_length()) if mask >> i & 1)
    return tuple(labels[i] for i in local) if labels else local


def relabel(mask: int, labels: tuple[int, ...]) -> int:
    """A mask over GPU indices as a mask over table positions (identity when no labels)."""
    if not labels:
        return mask
    return sum(1 << position for position, gpu in enumerate(labels) if mask >> gpu & 1)
