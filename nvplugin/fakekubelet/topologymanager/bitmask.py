"""NUMA node sets as the kubelet's topology manager sees them (``topologymanager/bitmask``).

A :class:`BitMask` is an immutable set of NUMA node ids 0..63 stored as one integer, bit *i* =
node *i*. The orderings matter as much as the set: the kubelet breaks every tie between merged
hints by them, so they are reproduced exactly:

- :meth:`BitMask.is_narrower_than`: fewer bits, or the same number of bits and numerically lower
  ("more lower-numbered bits set");
- :meth:`BitMask.is_less_than` / :meth:`BitMask.is_greater_than`: plain numeric order.

:func:`iterate_bitmasks` yields every non-empty subset of a list of nodes in the kubelet's order
(by size, then lexicographically by position), which is also the order in which hint generators
emit their hints.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations

MAX_BITS = 64
"""The kubelet's bitmask is a uint64: NUMA node ids must be 0..63."""


def _bit(i: int) -> int:
    if not 0 <= i < MAX_BITS:
        raise ValueError("bit number must be in range 0-63")
    return 1 << i


@dataclass(frozen=True, slots=True)
class BitMask:
    """An immutable set of NUMA node ids; ``value`` has bit *i* set for node *i*."""

    value: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.value < (1 << MAX_BITS):
            raise ValueError(f"bitmask value {self.value} outside a 64-bit mask")

    @classmethod
    def of(cls, *bits: int) -> BitMask:
        """The mask with exactly ``bits`` set (``BitMask.of(0, 2)`` = nodes 0 and 2)."""
        value = 0
        for b in bits:
            value |= _bit(b)
        return cls(value)

    # --- set operations (each returns a new mask) ---
    def add(self, *bits: int) -> BitMask:
        value = self.value
        for b in bits:
            value |= _bit(b)
        return BitMask(value)

    def remove(self, *bits: int) -> BitMask:
        value = self.value
        for b in bits:
            value &= ~_bit(b)
        return BitMask(value)

    def and_(self, *masks: BitMask) -> BitMask:
        value = self.value
        for m in masks:
            value &= m.value
        return BitMask(value)

    def or_(self, *masks: BitMask) -> BitMask:
        value = self.value
        for m in masks:
            value |= m.value
        return BitMask(value)

    def __and__(self, other: BitMask) -> BitMask:
        return BitMask(self.value & other.value)

    def __or__(self, other: BitMask) -> BitMask:
        return BitMask(self.value | other.value)

    # --- queries ---
    def count(self) -> int:
        return self.value.bit_count()

    def is_empty(self) -> bool:
        return self.value == 0

    def is_set(self, bit: int) -> bool:
        return 0 <= bit < MAX_BITS and bool(self.value >> bit & 1)

    def any_set(self, bits: Iterable[int]) -> bool:
        return any(self.is_set(b) for b in bits)

    def get_bits(self) -> tuple[int, ...]:
        """The node ids in the mask, ascending."""
        value, out, i = self.value, [], 0
        while value:
            if value & 1:
                out.append(i)
            value >>= 1
            i += 1
        return tuple(out)

    def is_equal(self, other: BitMask) -> bool:
        return self.value == other.value

    def is_less_than(self, other: BitMask) -> bool:
        """Numerically lower: the kubelet's "more lower-numbered bits set"."""
        return self.value < other.value

    def is_greater_than(self, other: BitMask) -> bool:
        return self.value > other.value

    def is_narrower_than(self, other: BitMask) -> bool:
        """Fewer nodes, or as many and numerically lower (the kubelet's tie-break)."""
        mine, theirs = self.count(), other.count()
        if mine == theirs:
            return self.value < other.value
        return mine < theirs

    def __len__(self) -> int:
        return self.count()

    def __iter__(self) -> Iterator[int]:
        return iter(self.get_bits())

    def __contains__(self, bit: object) -> bool:
        return isinstance(bit, int) and self.is_set(bit)

    def __str__(self) -> str:
        return "{" + ",".join(str(b) for b in self.get_bits()) + "}"

    def __repr__(self) -> str:
        return f"BitMask.of({', '.join(str(b) for b in self.get_bits())})"


def and_masks(first: BitMask, *masks: BitMask) -> BitMask:
    """``first`` AND every mask (the kubelet's package-level ``And``)."""
    return first.and_(*masks)


def or_masks(first: BitMask, *masks: BitMask) -> BitMask:
    return first.or_(*masks)


def iterate_bitmasks(bits: Sequence[int], size: int | None = None) -> Iterator[BitMask]:
    """Every non-empty subset of ``bits`` (or only those of ``size`` bits), kubelet order.

    Sizes ascend; within a size, subsets come in lexicographic order of positions in ``bits``.
    """
    sizes = range(1, len(bits) + 1) if size is None else (size,)
    for k in sizes:
        if not 0 < k <= len(bits):
            continue
        for combo in combinations(bits, k):
            yield BitMask.of(*combo)
