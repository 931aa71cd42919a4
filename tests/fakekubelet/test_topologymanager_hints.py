"""The shared hint generator: docs/kubelet-behaviour.md#worked-examples 8-10, and the rules of
docs/kubelet-behaviour.md#topology-hints."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest

from nvplugin.fakekubelet.topologymanager import generate_hints
from tests.support.hints import show


def gen(
    available: Sequence[str],
    reusable: Sequence[str],
    request: int,
    numa: dict[str, Sequence[int] | None],
    nodes: Sequence[int] = (0, 1),
) -> list[str]:
    return [show(x) for x in generate_hints(available, reusable, request, numa, nodes)]


def test_example_8_one_device_per_node() -> None:
    numa: dict[str, Sequence[int] | None] = {"Dev1": (0,), "Dev2": (1,)}
    assert gen(["Dev1", "Dev2"], [], 1, numa) == ["0P", "1P", "0,1N"]
    assert gen(["Dev1", "Dev2"], [], 2, numa) == ["0,1P"]


def test_example_9_device_without_numa_never_counts() -> None:
    numa: dict[str, Sequence[int] | None] = {"Dev1": None, "Dev2": (1,)}
    assert gen(["Dev1", "Dev2"], [], 1, numa) == ["1P", "0,1N"]


def test_example_10_request_larger_than_capacity() -> None:
    numa: dict[str, Sequence[int] | None] = {f"Dev{i}": (i % 2,) for i in range(4)}
    assert gen(list(numa), [], 6, numa) == []


def test_preferred_is_measured_against_capacity_not_free_devices() -> None:
    numa: dict[str, Sequence[int] | None] = {"a0": (0,), "b0": (0,), "a1": (1,), "b1": (1,)}
    # Node 0 is busy: two free devices remain on node 1 only; one node could hold 2.
    assert gen(["a1", "b1"], [], 2, numa) == ["1P", "0,1N"]
    # Only one free device per node: a two-device request needs both nodes, still N.
    assert gen(["a0", "a1"], [], 2, numa) == ["0,1N"]


def test_reusable_devices_must_lie_in_the_mask() -> None:
    numa: dict[str, Sequence[int] | None] = {"a0": (0,), "a1": (1,), "b1": (1,), "x": None}
    # a0 is reusable (from an init container): every hint must include node 0.
    assert gen(["a1", "b1"], ["a0"], 1, numa) == ["0P", "0,1N"]
    assert gen(["a1", "b1"], ["a0"], 2, numa) == ["0,1N"]
    # A reusable device without NUMA neither counts nor constrains.
    assert gen(["a1"], ["x"], 1, numa) == ["1P", "0,1N"]


def test_device_on_several_nodes_counts_in_any_of_them() -> None:
    numa: dict[str, Sequence[int] | None] = {"wide": (0, 1), "d2": (2,)}
    assert gen(["wide", "d2"], [], 2, numa, (0, 1, 2)) == ["0,2P", "1,2P", "0,1,2N"]


def test_cpus_use_the_same_generator() -> None:
    cpus: dict[int, Sequence[int] | None] = {c: (c // 4,) for c in range(8)}
    hints = generate_hints(range(2, 8), [], 4, cpus, [0, 1])
    assert [show(x) for x in hints] == ["1P", "0,1N"]


def reference_hints(
    available: Sequence[str],
    reusable: Sequence[str],
    request: int,
    numa: dict[str, Sequence[int] | None],
    nodes: Sequence[int],
) -> list[tuple[int, bool]]:
    """The module doc's rule, subset by subset with no shortcuts: (mask, preferred) in order."""
    subsets = [
        set(combo) for k in range(1, len(nodes) + 1) for combo in itertools.combinations(nodes, k)
    ]

    def inside(item: str, subset: set[int]) -> bool:
        return bool(set(numa[item] or ()) & subset)

    smallest = min(
        (len(s) for s in subsets if sum(inside(i, s) for i in numa) >= request),
        default=len(nodes),
    )
    out = []
    for s in subsets:
        held = [i for i in reusable if numa[i]]
        if not all(inside(i, s) for i in held):
            continue
        if len(held) + sum(inside(i, s) for i in available) >= request:
            out.append((sum(1 << n for n in s), len(s) == smallest))
    return out


@pytest.mark.parametrize("seed", range(120))
def test_generator_equals_the_rule_subset_by_subset(seed: int) -> None:
    """Seeds from 60 on put every item on one node (CPUs, most GPUs), which the generator
    counts per node."""
    rng = random.Random(seed)
    nodes = sorted(rng.sample(range(8), rng.randint(1, 8)))
    numa: dict[str, Sequence[int] | None] = {}
    several = 0.2 if seed < 60 else 0.1
    for i in range(rng.randint(0, 24)):
        pick = rng.random()
        numa[f"d{i}"] = (
            None if pick < 0.1 else rng.sample(nodes, 2 if pick < several and len(nodes) > 1 else 1)
        )
    items = list(numa)
    rng.shuffle(items)
    reusable = items[: rng.randint(0, 2)]
    available = [i for i in items[len(reusable) :] if rng.random() < 0.6]
    request = rng.randint(1, 10)
    got = [
        (h.numa_affinity.value if h.numa_affinity is not None else -1, h.preferred)
        for h in generate_hints(available, reusable, request, numa, nodes)
    ]
    assert got == reference_hints(available, reusable, request, numa, nodes)
