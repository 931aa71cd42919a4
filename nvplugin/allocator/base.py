"""What every allocation policy shares: the request rules, the error, the result value.

The kubelet's GetPreferredAllocation request has two kinds of bad: *malformed* (an index that
is not a GPU, a duplicate, a must-include GPU that is not available, a negative size), which is
a bug in the caller and gets an :class:`AllocationError` naming the offending value; and
*impossible* (size 0, size above the available count, more must-include GPUs than the size),
which is a legitimate question with no answer: the policy returns an empty list and the kubelet
falls back to its own choice. Failing those would fail the pod's admission
(docs/allocation.md). Both checks live here once, so every policy agrees on them.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from nvplugin.errors import InputError


class AllocationError(InputError):
    """A malformed allocation request; the message names the offending index or value."""


class OutOfTime(Exception):
    """An exact method cannot answer in time: it passed its deadline (``time.monotonic()``)
    and stopped, or the request is beyond what it can answer in any budget."""


class Policy(Protocol):
    """A preferred-allocation policy over one node's fixed topology.

    ``allocate`` returns GPU indices in ascending order: ``[]`` for well-formed impossible
    requests, :class:`AllocationError` for malformed ones. All precomputation happens when the
    policy is made (:func:`nvplugin.allocator.make_policy`), never on a request.
    """

    @property
    def name(self) -> str: ...

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class Request:
    """A validated request: ``available`` and ``must_include`` ascending, duplicate-free, and
    ``must_include`` within ``available``. ``impossible`` says why no answer exists ("" if
    one does)."""

    available: tuple[int, ...]
    must_include: tuple[int, ...]
    size: int
    impossible: str

    @property
    def available_mask(self) -> int:
        return _mask(self.available)

    @property
    def must_include_mask(self) -> int:
        return _mask(self.must_include)


def _mask(indices: Sequence[int]) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask


def _integer(value: object, message: str) -> int:
    """``value`` as an int (numpy integers too); bools and everything else are errors."""
    if isinstance(value, bool):
        raise AllocationError(message)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise AllocationError(message) from None


def _indices(values: Sequence[int], what: str, gpus: int) -> tuple[int, ...]:
    if all(type(value) is int for value in values):  # plain ints (every request): checked at once
        seen = set(values)
        if len(seen) == len(values) and (not seen or (min(seen) >= 0 and max(seen) < gpus)):
            return tuple(sorted(seen))
    seen = set()  # one by one, to name the first bad value
    for raw in values:
        value = _integer(raw, f"{what}: {raw!r} is not a GPU index")
        if not 0 <= value < gpus:
            raise AllocationError(
                f"{what}: GPU index {value} out of range (this node has GPUs 0..{gpus - 1})"
                if gpus
                else f"{what}: GPU index {value} out of range (this node has no GPUs)"
            )
        if value in seen:
            raise AllocationError(f"{what}: GPU {value} listed twice")
        seen.add(value)
    return tuple(sorted(seen))


def check_request(
    gpus: int, available: Sequence[int], must_include: Sequence[int], size: int
) -> Request:
    """Validate a request against a node of ``gpus`` GPUs (see the module docstring)."""
    size = _integer(size, f"size {size!r} is not an integer")
    if size < 0:
        raise AllocationError(f"size {size} is negative")
    avail = _indices(available, "available", gpus)
    required = _indices(must_include, "must-include", gpus)
    missing = sorted(set(required) - set(avail))
    if missing:
        raise AllocationError(f"must-include GPU {missing[0]} is not available")
    impossible = ""
    if size == 0:
        impossible = "size 0 asks for no GPU"
    elif size > len(avail):
        impossible = f"size {size} exceeds the {len(avail)} available GPU(s)"
    elif len(required) > size:
        impossible = f"{len(required)} must-include GPUs exceed size {size}"
    return Request(avail, required, size, impossible)


@dataclass(frozen=True, slots=True)
class Allocation:
    """A policy's answer with the reasons behind it (for ``nvplugin preferred --explain``).

    ``indices`` is the chosen group, ascending; empty when the request is impossible (then
    ``reason`` says why and the scores are None). ``score`` is the group's own score;
    ``partition_score`` the best score of a partition of the available GPUs that contains the
    group as a full group (for best-effort that is OPT). ``groups`` is such a partition's full
    groups, the chosen one first, the others by lowest index; ``leftover`` its leftover group.
    """

    policy: str
    indices: tuple[int, ...]
    score: int | None
    partition_score: int | None
    groups: tuple[tuple[int, ...], ...] = ()
    leftover: tuple[int, ...] = ()
    reason: str = ""
    contenders: tuple[tuple[tuple[int, ...], int], ...] = ()
    """Best-effort only: every group that appears in a partition scoring OPT, with its own
    score, best first (then index order): the answer is the first. ``contenders_note`` says
    when the list is narrower than that (nodes beyond 16 GPUs)."""
    contenders_note: str = ""
    proven: bool = True
    """False when a time budget cut the search short: ``partition_score`` is the best found,
    and ``bound`` caps OPT."""
    bound: int | None = None
