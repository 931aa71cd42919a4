"""Topology manager merge time: 8 NUMA nodes x 3 resources (target <= 100 ms, pruned merge).

Each resource offers every NUMA mask (255 hints), preferred for the narrowest ones, as the
device and CPU managers do on an 8-node machine with plenty free. The kubelet's naive merge walks
255^3 = 16.6 million combinations; it is timed in full on 2 resources and on 6 nodes x 3
resources, and its 8 x 3 time is extrapolated from its per-combination rate (a full run takes
minutes in Python). Both merges must agree wherever both are run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from nvplugin.fakekubelet.topologymanager import BitMask, NumaInfo, PolicyOptions, TopologyHint
from nvplugin.fakekubelet.topologymanager.policy import HintMerger, filter_providers_hints

TARGET_MS = 100.0


def _numa(n: int) -> NumaInfo:
    half = max(1, n // 2)
    return NumaInfo.from_distances(
        [
            [10 if a == b else (12 if a // half == b // half else 30) for b in range(n)]
            for a in range(n)
        ]
    )


def _resource(n: int, narrowest: int) -> list[TopologyHint]:
    masks = [BitMask(v) for v in range(1, 1 << n)]
    return [TopologyHint(m, m.count() == narrowest) for m in masks if m.count() >= narrowest]


def _time(fn: Callable[[], TopologyHint], repeat: int) -> tuple[float, TopologyHint]:
    best = float("inf")
    result = fn()
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000.0, result


def _case(nodes: int, narrowest: list[int], options: PolicyOptions) -> HintMerger:
    answers = [{f"r{i}": _resource(nodes, k)} for i, k in enumerate(narrowest)]
    return HintMerger(_numa(nodes), filter_providers_hints(answers), "best-effort", options)


def run() -> None:
    print(
        "   merge, best-effort, pruned vs the kubelet's naive iteration "
        f"(target <= {TARGET_MS:.0f} ms)"
    )
    for label, narrowest in (
        ("3 resources, 1-node narrowest", [1, 1, 1]),
        ("gpu needs 2 nodes", [2, 1, 1]),
    ):
        for options in (PolicyOptions(), PolicyOptions(prefer_closest_numa=True)):
            merger = _case(8, narrowest, options)
            combos = 1
            for hints in merger.hints:
                combos *= len(hints)
            fast_ms, fast = _time(merger.merge, 5)
            closest = " closest" if options.prefer_closest_numa else ""
            verdict = "ok" if fast_ms <= TARGET_MS else "OVER TARGET"
            print(
                f"   8 nodes, {label}{closest}: pruned {fast_ms:7.1f} ms ({verdict}), "
                f"{combos:,} combinations, result {fast}"
            )

    # Naive, run in full where it is affordable; results must agree.
    two = _case(8, [1, 1], PolicyOptions())
    naive_ms, naive = _time(two.merge_naive, 1)
    fast_ms, fast = _time(two.merge, 3)
    assert naive == fast, (naive, fast)
    per_combo_us = naive_ms * 1000.0 / (255 * 255)
    print(f"   8 nodes x 2 resources: naive {naive_ms:8.1f} ms, pruned {fast_ms:6.1f} ms (equal)")
    six = _case(6, [1, 1, 1], PolicyOptions())
    naive_ms, naive = _time(six.merge_naive, 1)
    fast_ms, fast = _time(six.merge, 3)
    assert naive == fast, (naive, fast)
    print(f"   6 nodes x 3 resources: naive {naive_ms:8.1f} ms, pruned {fast_ms:6.1f} ms (equal)")
    print(
        f"   8 nodes x 3 resources: naive ~{per_combo_us * 255**3 / 1e6:.0f} s extrapolated "
        f"({per_combo_us:.2f} us per combination x {255**3:,})"
    )
