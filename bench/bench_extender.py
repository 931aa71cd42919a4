"""The scheduler extender at 5,000 nodes (targets: filter + prioritize <= 50 ms p99 per pod,
<= 300 MB resident with 5,000 NRT objects), beside the same work done node by node.

Two populations of 5,000 NRT objects (tests/support/nrtgen.py), five NUMA shapes (1 to 8 NUMA
nodes) and mixed topology-manager policies, scopes and CPU manager policies:

- pools: 40 node pools (shape and kubelet settings per pool), each NUMA node's GPUs and CPUs
  all, half or none free (what a busy cluster shows);
- uniform: every node's shape, settings and free counts drawn at random (the worst case: almost
  every node is a state of its own).

A stream of pods of mixed shapes (1, 2 or 4 GPUs; 4 or 8 exclusive CPUs, or burstable) is
filtered and prioritized over all 5,000; after each, the pod is bound to its best node (a
reservation) and 20 random nodes get a new NRT object (the exporters' updates), so the cache
keeps meeting new states. The naive way judges every node afresh (one admission per node); it
is timed on one pod of the pools population, where both must pass the same nodes.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from nvplugin.extender.nrt import parse_nrt
from nvplugin.extender.service import tune_collector
from nvplugin.extender.view import View
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.log import configure
from tests.support.nrtgen import pool_nrt, random_nrt

NODES = 5000
POOLS = 40
UPDATES_PER_POD = 20
TARGET_P99_MS = 50.0
TARGET_RSS_MB = 300.0


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def pod_shapes() -> list[Pod]:
    shapes = []
    for gpus in (1, 2, 4):
        limits: dict[str, str | int] = {"nvidia.com/gpu": gpus}
        for cpu in ("4", "8"):
            main = Container.of("main", limits={**limits, "cpu": cpu, "memory": "16Gi"})
            shapes.append(Pod.of(f"g{gpus}c{cpu}", [main]))
        burst = Container.of("main", {"cpu": "2", "memory": "4Gi"}, limits=limits)
        shapes.append(Pod.of(f"g{gpus}b", [burst]))
    return shapes


def p99(ordered: list[float]) -> float:
    return ordered[max(0, int(len(ordered) * 0.99) - 1)]


def stream(name: str, make: Callable[[str, random.Random], dict[str, Any]], pods: int) -> View:
    rng = random.Random(36)
    before = rss_mb()
    view = View()
    started = time.perf_counter()
    for i in range(NODES):
        view.set_nrt(parse_nrt(make(f"node-{i:05d}", rng)))
    load_s = time.perf_counter() - started
    loaded = rss_mb()
    names = view.names()
    shapes = pod_shapes()
    latencies, updates, later, seen = [], [], [], set()
    for i in range(pods):
        shape = rng.choice(shapes)
        pod = Pod(f"{shape.name}-{i}", f"uid-{i}", shape.containers)
        start = time.perf_counter()
        passed, _ = view.filter(pod, names)
        scores = view.prioritize(pod, passed)
        latencies.append((time.perf_counter() - start) * 1000)
        if shape.name in seen:
            later.append(latencies[-1])
        seen.add(shape.name)
        if scores:
            view.bound(pod.uid, max(scores, key=lambda s: s[1])[0])
        for _ in range(UPDATES_PER_POD):
            obj = make(rng.choice(names), rng)
            start = time.perf_counter()
            view.set_nrt(parse_nrt(obj))
            updates.append((time.perf_counter() - start) * 1e6)
    latencies.sort()
    later.sort()
    print(f"   {name}: {NODES} NRT objects loaded in {load_s:.1f} s, resident {loaded:.0f} MB "
          f"(+{loaded - before:.0f} MB; target <= {TARGET_RSS_MB:.0f} MB)")  # fmt: skip
    print(f"   {name}: {pods} pods, filter + prioritize over {NODES} nodes: "
          f"p50 {statistics.median(latencies):.1f} ms, p99 {p99(latencies):.1f} ms, "
          f"max {latencies[-1]:.1f} ms (target p99 <= {TARGET_P99_MS:.0f} ms)")  # fmt: skip
    print(f"   {name}: of those, the {len(later)} after each shape's first pod: "
          f"p50 {statistics.median(later):.1f} ms, p99 {p99(later):.1f} ms, "
          f"max {later[-1]:.1f} ms")  # fmt: skip
    print(f"   {name}: {len(updates)} NRT updates between pods, median "
          f"{statistics.median(updates):.0f} us each; judges built {view.cache.built}, "
          f"admissions {view.cache.admitted}, put together from parts "
          f"{view.cache.composed}, answered without one {view.cache.short_cut}; "
          f"resident after {rss_mb():.0f} MB")  # fmt: skip
    return view


def run() -> None:
    configure("json", "error")
    tune_collector()  # as `nvplugin scheduler-extender` does
    view = stream("pools", lambda n, rng: pool_nrt(n, rng.randrange(POOLS), rng), 300)
    names = view.names()
    pod = Pod("naive", "uid-naive", pod_shapes()[1].containers)
    start = time.perf_counter()
    passed, _ = view.filter(pod, names)
    view.prioritize(pod, passed)
    shared_ms = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    naive, _ = view.filter(pod, names, naive=True)
    view.prioritize(pod, naive)
    naive_ms = (time.perf_counter() - start) * 1000
    print(f"   pools, one more pod: {shared_ms:.1f} ms; naive, node by node (an admission "
          f"each): {naive_ms:.0f} ms ({naive_ms / NODES:.2f} ms a node); "
          f"same nodes passed: {passed == naive}")  # fmt: skip
    del view
    stream("uniform", random_nrt, 40)
