"""Preferred allocation among MIG devices: one parent first, then one NUMA node, then partly used
parents and the tightest fit, deterministic; checked case by case and against brute force."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest

from nvplugin.allocator import make_policy
from nvplugin.allocator import mig as mig_policy
from nvplugin.allocator.base import AllocationError
from nvplugin.allocator.mig import MigPolicy
from nvplugin.errors import InputError
from nvplugin.node.model import Gpu, MigDevice, Topology
from nvplugin.nodefile.reader import load_node
from nvplugin.rm.migstrategy import apply_strategy

MIXED = load_node("dgx-a100-mig").topology()


def _policy(resource: str, topology: Topology = MIXED) -> tuple[MigPolicy, list[str]]:
    devices = [d.mig for d in apply_strategy(topology.gpus, "mixed").resource(resource)]
    return MigPolicy(topology, devices), [d.label for d in devices]


def _labels(policy: MigPolicy, positions: Sequence[int]) -> list[str]:
    return [policy.devices[p].label for p in positions]


def test_two_devices_come_from_one_parent() -> None:
    policy, labels = _policy("nvidia.com/mig-1g.5gb")  # GPU0 x7, GPU1 x7, GPU2 x2
    everything = range(len(labels))
    # all free: GPU2 fits 2 exactly (tightest), keeping GPUs 0 and 1 whole
    assert _labels(policy, policy.allocate(everything, [], 2)) == ["2:2", "2:3"]
    # 3 fit on GPU0 or GPU1 only: the lower index
    assert _labels(policy, policy.allocate(everything, [], 3)) == ["0:0", "0:1", "0:2"]


def test_partly_used_parents_go_before_untouched_ones() -> None:
    policy, _ = _policy("nvidia.com/mig-1g.5gb")
    # GPU0 has 3 of 7 free (4 in use), GPU1 all 7, GPU2 both: 1 device comes from GPU0
    free = [4, 5, 6, *range(7, 16)]
    assert _labels(policy, policy.allocate(free, [], 1)) == ["0:4"]
    assert _labels(policy, policy.allocate(free, [], 3)) == ["0:4", "0:5", "0:6"]
    # 4 fit on no partly used parent: GPU1 (untouched, 7) is the only single parent
    assert _labels(policy, policy.allocate(free, [], 4)) == ["1:0", "1:1", "1:2", "1:3"]


def test_several_parents_stay_on_one_numa_node() -> None:
    policy, labels = _policy("nvidia.com/mig-1g.5gb")
    # 8 devices need two parents: GPU0 + GPU1 (both NUMA 3) over GPU0 + GPU2 (NUMA 3 and 1)
    answer = _labels(policy, policy.allocate(range(len(labels)), [], 8))
    assert answer == [f"0:{i}" for i in range(7)] + ["1:0"]
    # GPU0 gone: GPU1 + GPU2 are the only pair left
    assert _labels(policy, policy.allocate(range(7, 16), [], 8)) == [
        *[f"1:{i}" for i in range(6)],
        "2:2",
        "2:3",
    ]


def test_must_include_fixes_its_parent() -> None:
    policy, labels = _policy("nvidia.com/mig-1g.5gb")
    everything = range(len(labels))
    must = [labels.index("1:3")]
    assert _labels(policy, policy.allocate(everything, must, 2)) == ["1:0", "1:3"]
    # GPU2 holds 2 of 3: one more from GPU0 or GPU1 (alike: NUMA 3, partly used): the lower
    must = [labels.index("2:2")]
    assert _labels(policy, policy.allocate([14, 15, 7, 0], must, 3)) == ["0:0", "2:2", "2:3"]


def test_impossible_and_malformed_requests() -> None:
    policy, _ = _policy("nvidia.com/mig-3g.20gb")
    assert policy.allocate([0, 1], [], 3) == []
    assert policy.allocate([0, 1], [], 0) == []
    assert policy.allocate([0, 1, 2], [0, 1], 1) == []
    with pytest.raises(AllocationError, match="out of range"):
        policy.allocate([3], [], 1)
    with pytest.raises(AllocationError, match="listed twice"):
        policy.allocate([0, 0], [], 1)
    with pytest.raises(AllocationError, match="is not available"):
        policy.allocate([0], [1], 1)


# --- allocationPolicy names for MIG devices --------------------------------------------------


def test_the_policy_factory_makes_each_policy_name_for_mig_devices() -> None:
    """best-effort is the MIG policy; simple is the lowest positions (parent, then MIG index)
    first, must-include first -- the GPU rule on positions."""
    devices = [d.mig for d in apply_strategy(MIXED.gpus, "mixed").resource("nvidia.com/mig-1g.5gb")]
    labels = [d.label for d in devices]
    best = make_policy("best-effort", MIXED, mig_devices=devices)
    simple = make_policy("simple", MIXED, mig_devices=devices)
    assert (best.name, simple.name) == ("mig", "simple")
    everything = range(len(devices))
    assert [labels[p] for p in best.allocate(everything, [], 2)] == ["2:2", "2:3"]
    assert [labels[p] for p in simple.allocate(everything, [], 2)] == ["0:0", "0:1"]
    must = [labels.index("1:3")]
    assert [labels[p] for p in simple.allocate(everything, must, 3)] == ["0:0", "0:1", "1:3"]
    assert [labels[p] for p in simple.allocate([15, 2, 9], [], 2)] == ["0:2", "1:2"]
    assert simple.allocate([0, 1], [], 3) == []  # impossible: empty, as for GPUs
    with pytest.raises(AllocationError, match="out of range"):
        simple.allocate([16], [], 1)
    with pytest.raises(InputError, match="unknown allocation policy 'packed'"):
        make_policy("packed", MIXED, mig_devices=devices)


# --- against brute force -----------------------------------------------------------------------


def _key(
    policy: MigPolicy, topology: Topology, available: Sequence[int], chosen: Sequence[int]
) -> tuple[object, ...]:
    """The module's objective for a chosen set, computed from scratch."""
    devices = policy.devices
    totals: dict[int, int] = {}
    for d in devices:
        totals[d.parent] = totals.get(d.parent, 0) + 1
    free: dict[int, int] = {}
    for p in available:
        free[devices[p].parent] = free.get(devices[p].parent, 0) + 1
    parents = sorted({devices[p].parent for p in chosen})
    numa = {topology.gpus[p].numa_node for p in parents}
    return (
        len(parents),
        len(numa),
        sum(1 for p in parents if free[p] == totals[p]),
        sum(free[p] for p in parents),
        parents,
    )


def _random_node(rng: random.Random) -> tuple[Topology, list[MigDevice]]:
    base = load_node("dgx-a100").topology()
    gpus = []
    devices: list[MigDevice] = []
    for gpu in base.gpus:
        count = rng.randint(0, 7)
        migs = tuple(
            MigDevice(gpu.index, n, f"MIG-{gpu.index}-{n}", "1g.5gb", 7 + n, 0, 4864, 1, (n, 1))
            for n in range(count)
        )
        numa = rng.choice([0, 1, 2, None])
        gpus.append(
            Gpu(gpu.index, gpu.uuid, gpu.name, 40960, gpu.pci_bus_id, gpu.minor, numa, True, migs)
        )
        devices += migs
    distances = ((10, 20, 20), (20, 10, 20), (20, 20, 10))
    topology = Topology("random", tuple(gpus), base.links, distances, base.cpus)
    return topology, devices


def _check_against_brute_force(seed: int, exact: bool) -> None:
    rng = random.Random(seed)
    topology, devices = _random_node(rng)
    if len(devices) < 2:
        return
    policy = MigPolicy(topology, devices)
    for _ in range(15):
        available = sorted(rng.sample(range(len(devices)), rng.randint(1, min(len(devices), 12))))
        size = rng.randint(1, len(available))
        must = sorted(rng.sample(available, rng.randint(0, min(size, 2))))
        answer = policy.allocate(available, must, size)
        assert len(answer) == size and set(must) <= set(answer) <= set(available)
        assert answer == sorted(answer)
        best = min(
            _key(policy, topology, available, combo)
            for combo in itertools.combinations(available, size)
            if set(must) <= set(combo)
        )
        key = _key(policy, topology, available, answer)
        assert key == best if exact else key[:2] == best[:2]


@pytest.mark.parametrize("seed", range(40))
def test_answers_are_optimal_against_brute_force(seed: int) -> None:
    _check_against_brute_force(seed, exact=True)


@pytest.mark.parametrize("seed", range(10))
def test_greedy_fallback_keeps_fewest_parents_and_numa_nodes(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mig_policy, "MAX_CANDIDATES", 0)
    _check_against_brute_force(seed, exact=False)
