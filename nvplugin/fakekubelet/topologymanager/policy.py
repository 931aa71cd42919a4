"""Hints, their merge, and the four policies (docs/kubelet-behaviour.md#merge-and-policies; the
kubelet's ``policy*.go`` and ``numa_info.go``).

A hint provider answers, per resource, a list of :class:`TopologyHint` (``None`` = "don't care",
``[]`` = "impossible"). The policy filters those answers into one list per resource, merges every
combination that takes one hint per list (AND of the masks; preferred only if every hint is
preferred and all non-nil masks are identical), and keeps the best merged hint.

**Why the fast merge is exact.** The kubelet walks the whole cross product (``hints^resources``
combinations: 255^3 = 16.6 million for 8 NUMA nodes and 3 resources) and folds the merged hints
with a pairwise "best of two" rule. That rule is a strict total order on distinct (mask,
preferred) pairs (preferred first; then, for preferred, narrower / closer / numerically lower;
for non-preferred, the count rule around B), so the fold's answer is simply the best element of
the *set* of merged hints: the iteration order, duplicate hints and duplicate combinations cannot
change it (which is also why the Go map order the kubelet iterates in does not matter).
:meth:`HintMerger.merge` therefore builds that set resource by resource, keeping only the distinct
partial results (at most 2^nodes non-preferred masks plus the few still-preferred states), and
then folds it with the very same :meth:`HintMerger.compare`. :meth:`HintMerger.merge_naive` is the
kubelet's iteration, kept for the property test and the benchmark.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import product
from typing import Protocol

from nvplugin.fakekubelet.topologymanager.bitmask import BitMask
from nvplugin.fakekubelet.topologymanager.options import (
    POLICY_BEST_EFFORT,
    POLICY_NONE,
    POLICY_RESTRICTED,
    POLICY_SINGLE_NUMA_NODE,
    PolicyOptions,
    StartupError,
)


@dataclass(frozen=True, slots=True)
class TopologyHint:
    """A NUMA affinity (``None`` = any / don't care) and whether it is a preferred one."""

    numa_affinity: BitMask | None
    preferred: bool

    def __str__(self) -> str:
        mask = "nil" if self.numa_affinity is None else str(self.numa_affinity)
        return f"{mask}{'P' if self.preferred else 'N'}"


ResourceHints = Mapping[str, Sequence[TopologyHint] | None]
"""One provider's answer: resource name -> hints (``None``: don't care; ``[]``: impossible)."""

ProviderHints = ResourceHints | None
"""A provider may also answer ``None`` or ``{}``: no preference for any resource."""

DONT_CARE = TopologyHint(None, True)
IMPOSSIBLE = TopologyHint(None, False)


@dataclass(frozen=True)
class NumaInfo:
    """The machine's NUMA nodes and (optionally) their SLIT distances.

    ``distances[a][b]`` is indexed by position in ``nodes``; None when unknown (the kubelet then
    refuses ``prefer-closest-numa-nodes``).
    """

    nodes: tuple[int, ...]
    distances: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.distances is not None and (
            len(self.distances) != len(self.nodes)
            or any(len(row) != len(self.nodes) for row in self.distances)
        ):
            raise ValueError("NUMA distance matrix must be square over the NUMA nodes")

    @classmethod
    def from_distances(cls, distances: Sequence[Sequence[int]]) -> NumaInfo:
        """Nodes 0..k-1 with the given distance matrix (as ``Topology.numa_distances``)."""
        return cls(tuple(range(len(distances))), tuple(tuple(row) for row in distances))

    @property
    def default_affinity(self) -> BitMask:
        """Every NUMA node of the machine."""
        return BitMask.of(*self.nodes)

    def average_distance(self, mask: BitMask) -> float:
        """Mean distance over all ordered pairs of nodes in ``mask``, self-pairs included."""
        bits = mask.get_bits()
        if not bits or self.distances is None:
            return 0.0
        index = {node: i for i, node in enumerate(self.nodes)}
        total = 0.0
        for a in bits:
            row = self.distances[index[a]]
            for b in bits:
                total += float(row[index[b]])
        return total / float(len(bits) * len(bits))

    @staticmethod
    def narrowest(m1: BitMask, m2: BitMask) -> BitMask:
        return m1 if m1.is_narrower_than(m2) else m2

    def closest(self, m1: BitMask, m2: BitMask) -> BitMask:
        """Narrower first; equally wide: lower average distance; equal: numerically lower."""
        if m1.count() != m2.count():
            return self.narrowest(m1, m2)
        d1, d2 = self.average_distance(m1), self.average_distance(m2)
        if d1 == d2:
            return m1 if m1.is_less_than(m2) else m2
        return m1 if d1 < d2 else m2


def filter_providers_hints(providers_hints: Sequence[ProviderHints]) -> list[list[TopologyHint]]:
    """One hint list per resource, in provider order then each provider's resource order."""
    filtered: list[list[TopologyHint]] = []
    for hints in providers_hints:
        if not hints:
            filtered.append([DONT_CARE])
            continue
        for resource_hints in hints.values():
            if resource_hints is None:
                filtered.append([DONT_CARE])
            elif len(resource_hints) == 0:
                filtered.append([IMPOSSIBLE])
            else:
                filtered.append(list(resource_hints))
    return filtered


def filter_single_numa_hints(
    filtered: Sequence[Sequence[TopologyHint]],
) -> list[list[TopologyHint]]:
    """Keep only ``{nil, preferred}`` and preferred single-node hints (may leave a list empty)."""
    return [
        [
            h
            for h in hints
            if h.preferred and (h.numa_affinity is None or h.numa_affinity.count() == 1)
        ]
        for hints in filtered
    ]


def merge_permutation(default: BitMask, permutation: Sequence[TopologyHint]) -> TopologyHint:
    """AND of the masks (nil = all nodes); preferred iff all preferred and non-nil masks equal."""
    preferred = True
    first: BitMask | None = None
    merged = default.value
    for hint in permutation:
        mask = hint.numa_affinity
        if mask is not None:
            if first is None:
                first = mask
            elif mask.value != first.value:
                preferred = False
            merged &= mask.value
        if not hint.preferred:
            preferred = False
    return TopologyHint(BitMask(merged), preferred)


def max_of_min_affinity_counts(filtered: Sequence[Sequence[TopologyHint]]) -> int:
    """B: over the resources, the largest bit count of each resource's narrowest non-nil hint."""
    best = 0
    for hints in filtered:
        # The narrowest mask has the fewest bits (ties are broken by value, not by count).
        counts = [h.numa_affinity.count() for h in hints if h.numa_affinity is not None]
        if counts:
            best = max(best, min(counts))
    return best


def iterate_all_provider_hints(
    filtered: Sequence[Sequence[TopologyHint]],
) -> Iterator[tuple[TopologyHint, ...]]:
    """Every combination taking one hint per list, first list outermost (the kubelet's order)."""
    return product(*filtered)


class HintMerger:
    """Finds the best merged hint for one set of filtered hint lists (the kubelet's HintMerger)."""

    def __init__(
        self,
        numa: NumaInfo,
        filtered: Sequence[Sequence[TopologyHint]],
        policy_name: str,
        options: PolicyOptions,
    ) -> None:
        self.numa = numa
        self.hints = [list(h) for h in filtered]
        self.best_non_preferred_count = max_of_min_affinity_counts(self.hints)
        self._closest = policy_name != POLICY_SINGLE_NUMA_NODE and options.prefer_closest_numa

    def _compare_masks(self, current: TopologyHint, candidate: TopologyHint) -> TopologyHint:
        cur, cand = current.numa_affinity, candidate.numa_affinity
        assert cur is not None and cand is not None
        if cand.value == cur.value:
            return current
        best = self.numa.closest(cur, cand) if self._closest else self.numa.narrowest(cur, cand)
        return current if best.value == cur.value else candidate

    def compare(self, current: TopologyHint | None, candidate: TopologyHint) -> TopologyHint | None:
        """The kubelet's "best of two" between the current best and a merged candidate."""
        cand_mask = candidate.numa_affinity
        assert cand_mask is not None
        if cand_mask.count() == 0:
            return current
        if current is None:
            return candidate
        if not current.preferred and candidate.preferred:
            return candidate
        if current.preferred and not candidate.preferred:
            return current
        if current.preferred and candidate.preferred:
            return self._compare_masks(current, candidate)
        # Both non-preferred: get as close to B as possible, from below rather than above.
        bound = self.best_non_preferred_count
        cur_mask = current.numa_affinity
        assert cur_mask is not None
        cur_count, cand_count = cur_mask.count(), cand_mask.count()
        if cur_count > bound:
            return self._compare_masks(current, candidate)
        if cur_count == bound:
            if cand_count != bound:
                return current
            return self._compare_masks(current, candidate)
        if cand_count > bound:
            return current
        if cand_count == bound:
            return candidate
        if cand_count > cur_count:
            return candidate
        if cand_count < cur_count:
            return current
        return self._compare_masks(current, candidate)

    def _finish(self, best: TopologyHint | None) -> TopologyHint:
        return best if best is not None else TopologyHint(self.numa.default_affinity, False)

    def merge_naive(self) -> TopologyHint:
        """The kubelet's merge, combination by combination (exponential; for tests and bench)."""
        default = self.numa.default_affinity
        best: TopologyHint | None = None
        for permutation in iterate_all_provider_hints(self.hints):
            best = self.compare(best, merge_permutation(default, permutation))
        return self._finish(best)

    def merged_hints(self, *, preferred_only: bool = False) -> set[TopologyHint]:
        """The set of distinct non-empty merged hints over all combinations (see module doc);
        with ``preferred_only`` only the preferred ones (the others are not worked out).

        Partial states after each list: preferred-so-far states keyed by the common non-nil
        mask (None while every hint so far was nil), and non-preferred masks already ANDed with
        the machine's nodes. Empty partial masks are dropped: AND only shrinks them.
        """
        default = self.numa.default_affinity.value
        preferred_states: set[int | None] = {None}
        other_states: set[int] = set()
        for hints in self.hints:
            next_preferred: set[int | None] = set()
            next_other: set[int] = set()
            masks: set[int] = set()
            has_none = None in preferred_states
            keys = {k for k in preferred_states if k is not None}
            for hint in {(h.numa_affinity, h.preferred) for h in hints}:
                mask, preferred = hint
                m = default if mask is None else mask.value
                masks.add(m)
                # Per state key, as the combination-by-combination merge would: a preferred nil
                # hint keeps every state; a preferred hint keeps the state of its own mask (or
                # starts one from None); anything else turns the state non-preferred.
                if preferred and mask is None:
                    next_preferred.update(preferred_states)
                    continue
                if preferred_only:
                    if preferred and has_none and default & m:
                        next_preferred.add(m)
                    if preferred and m in keys:
                        next_preferred.add(m)
                    continue
                if preferred:
                    if has_none and default & m:
                        next_preferred.add(m)
                    if m in keys:
                        next_preferred.add(m)
                        others = keys - {m}
                    else:
                        others = keys
                else:
                    if has_none:
                        next_other.add(default & m)
                    others = keys
                next_other.update(map((default & m).__and__, others))
            if other_states and masks:
                for m in masks:
                    next_other.update(map(m.__and__, other_states))
            next_other.discard(0)
            preferred_states, other_states = next_preferred, next_other
        result = {TopologyHint(BitMask(default & m), False) for m in other_states}
        for key in preferred_states:
            merged = default if key is None else default & key
            if merged:
                result.add(TopologyHint(BitMask(merged), True))
        return result

    def merge(self) -> TopologyHint:
        """Same answer as :meth:`merge_naive`: the best of the distinct preferred merged hints,
        or without one the first mask in the compare rule's order that some combination makes
        (:meth:`best_non_preferred`)."""
        best: TopologyHint | None = None
        # A preferred hint beats every non-preferred one, so those matter only without one.
        merged = self.merged_hints(preferred_only=True)
        if not merged:
            return self._finish(self.best_non_preferred())
        # Sorted only for reproducible runs; the compare rule is a total order.
        for hint in sorted(merged, key=_hint_sort_key):
            best = self.compare(best, hint)
        return self._finish(best)

    def non_preferred_order(self) -> Sequence[int]:
        """Every non-empty mask of the machine, best first by :meth:`compare`'s rule for two
        non-preferred hints: B's count first; then fewer bits, the most first; then more bits,
        the fewest first; equal counts by :meth:`_compare_masks` (closest, then lowest)."""
        default = self.numa.default_affinity.value
        bound = self.best_non_preferred_count
        if not self._closest:
            return _non_preferred_order(default, bound)

        def key(m: int) -> tuple[int, int, float, int]:
            return (*_tier(m.bit_count(), bound), self.numa.average_distance(BitMask(m)), m)

        return sorted(_submasks(default), key=key)

    def best_non_preferred(self) -> TopologyHint | None:
        """The best merged hint where no combination merges preferred: the first mask, in
        :meth:`non_preferred_order`, that the AND of one hint per list makes (None when no
        combination exists). Equal to folding :meth:`merged_hints` with :meth:`compare`, without
        making every combination's AND."""
        default = self.numa.default_affinity.value
        lists = [
            {default if h.numa_affinity is None else default & h.numa_affinity.value for h in hints}
            for hints in self.hints
        ]
        if any(not masks for masks in lists):
            return None
        for m in self.non_preferred_order():
            if _and_makes(lists, m):
                return TopologyHint(BitMask(m), False)
        return None


@lru_cache(maxsize=256)
def _non_preferred_order(default: int, bound: int) -> tuple[int, ...]:
    """:meth:`HintMerger.non_preferred_order` without distances, kept per machine and B."""
    return tuple(sorted(_submasks(default), key=lambda m: (*_tier(m.bit_count(), bound), m)))


def _tier(count: int, bound: int) -> tuple[int, int]:
    """Where a non-preferred mask of ``count`` bits ranks against B (``bound``): B's count
    first; then fewer bits, the most first; then more bits, the fewest first."""
    if count == bound:
        return (0, 0)
    return (1, -count) if count < bound else (2, count)


def _submasks(default: int) -> list[int]:
    """Every non-empty mask within ``default`` (NUMA ids need not be contiguous)."""
    out = []
    sub = default
    while sub:
        out.append(sub)
        sub = (sub - 1) & default
    return out


def _and_makes(lists: Sequence[set[int]], mask: int) -> bool:
    """Whether one mask from each list ANDs to exactly ``mask``: each pick must hold ``mask``,
    and the bits they add beyond it must have nothing in common."""
    extras: list[set[int]] = []
    for masks in lists:
        found = {m & ~mask for m in masks if m & mask == mask}
        if not found:
            return False
        if 0 in found:
            continue  # this list gives exactly the mask: it clears every other extra
        extras.append(found)
    if len(extras) < len(lists):
        return True
    # Every list adds something: walk the lists keeping the distinct ANDs of extras so far.
    reached = extras[0]
    for found in extras[1:]:
        reached = {a & b for a in reached for b in found}
        if 0 in reached:
            return True
    return 0 in reached


def _hint_sort_key(hint: TopologyHint) -> tuple[bool, int]:
    mask = hint.numa_affinity
    return (not hint.preferred, 0 if mask is None else mask.value)


class Policy(Protocol):
    """A topology manager policy: merge the providers' hints and say whether to admit."""

    @property
    def name(self) -> str: ...

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]: ...


@dataclass(frozen=True)
class NonePolicy:
    """``none``: no merge; everything is admitted (the scope does not even ask for hints)."""

    name: str = POLICY_NONE

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        return TopologyHint(None, False), True


@dataclass(frozen=True)
class BestEffortPolicy:
    """``best-effort``: merge, store the best hint, always admit."""

    numa: NumaInfo
    options: PolicyOptions = field(default_factory=PolicyOptions)
    naive: bool = False
    name: str = POLICY_BEST_EFFORT

    def best_hint(self, providers_hints: Sequence[ProviderHints]) -> TopologyHint:
        merger = HintMerger(
            self.numa, filter_providers_hints(providers_hints), self.name, self.options
        )
        return merger.merge_naive() if self.naive else merger.merge()

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        return self.best_hint(providers_hints), True


@dataclass(frozen=True)
class RestrictedPolicy(BestEffortPolicy):
    """``restricted``: as best-effort, but admit only a preferred result."""

    name: str = POLICY_RESTRICTED

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        best = self.best_hint(providers_hints)
        return best, best.preferred


@dataclass(frozen=True)
class SingleNumaNodePolicy:
    """``single-numa-node``: only don't-care and preferred one-node hints take part; a result
    spanning every node becomes nil; admit only a preferred result."""

    numa: NumaInfo
    options: PolicyOptions = field(default_factory=PolicyOptions)
    naive: bool = False
    name: str = POLICY_SINGLE_NUMA_NODE

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        filtered = filter_single_numa_hints(filter_providers_hints(providers_hints))
        merger = HintMerger(self.numa, filtered, self.name, self.options)
        best = merger.merge_naive() if self.naive else merger.merge()
        mask = best.numa_affinity
        if mask is not None and mask.value == self.numa.default_affinity.value:
            best = TopologyHint(None, best.preferred)
        return best, best.preferred


def new_policy(
    name: str, numa: NumaInfo, options: PolicyOptions | None = None, naive: bool = False
) -> Policy:
    """The policy called ``name``; ``naive`` selects the kubelet's exponential merge."""
    options = options or PolicyOptions()
    if name == POLICY_NONE:
        return NonePolicy()
    if name == POLICY_BEST_EFFORT:
        return BestEffortPolicy(numa, options, naive)
    if name == POLICY_RESTRICTED:
        return RestrictedPolicy(numa, options, naive)
    if name == POLICY_SINGLE_NUMA_NODE:
        return SingleNumaNodePolicy(numa, options, naive)
    raise StartupError(f'unknown policy: "{name}"')
