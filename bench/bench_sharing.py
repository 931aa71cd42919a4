"""Time-slicing replicas, in-process (no gRPC).

- Preferred allocation: how long :meth:`nvplugin.rm.sharing.Replicas.prefer` takes on dgx-2 (16
  GPUs, 8 replicas each = 128 devices) with the best-effort policy choosing among tied GPUs, for
  distributed and packed, with every replica free and with half of them in use (a spread of
  loads, so fewer ties). The policy's tables are built once, before timing, as the daemon does.
- The ListAndWatch list of a large node (dgx-2, 500 replicas each = 8000 devices): what building
  it after a health change costs the event loop, and serializing it for one stream, per device
  (what ``PUBLISH_S_PER_DEVICE`` in :mod:`nvplugin.plugin.server` is chosen against).
"""

from __future__ import annotations

import random
import time

from nvplugin.allocator import make_policy
from nvplugin.config.layout import ALLOCATIONS
from nvplugin.node.model import Topology
from nvplugin.nodesession import load_topology
from nvplugin.rm.devices import base_devices
from nvplugin.rm.listing import Listing
from nvplugin.rm.sharing import Replicas

NODE = "dgx-2"
REPLICAS = 8
SIZES = (1, 2, 4, 8)
CALLS = 200
LIST_REPLICAS = 500
LISTS = 50


def run() -> None:
    topology = load_topology(NODE)
    policy = make_policy("best-effort", topology)
    rng = random.Random(6)
    for allocation in ALLOCATIONS:
        replicas = Replicas(REPLICAS, allocation=allocation)
        devices = replicas.devices(base_devices(topology.gpus))
        half = sorted(rng.sample(range(len(devices)), len(devices) // 2))
        cases = {"all free": list(devices), "half in use": [devices[i] for i in half]}
        for label, available in cases.items():
            cells = []
            for size in SIZES:
                started = time.perf_counter()
                for _ in range(CALLS):
                    replicas.prefer(policy.allocate, available, [], size)
                per_call_ms = (time.perf_counter() - started) / CALLS * 1000
                cells.append(f"size {size}: {per_call_ms:.3f} ms")
            print(f"   {allocation:<11} {label:<11} " + ", ".join(cells))
    _listing(topology)


def _listing(topology: Topology) -> None:
    devices = Replicas(LIST_REPLICAS).devices(base_devices(topology.gpus))
    listing = Listing(devices)
    healths = [{gpu.index: (gpu.index != n % 16) for gpu in topology.gpus} for n in range(LISTS)]
    started = time.perf_counter()
    messages = [listing.message(health) for health in healths]
    build_s = (time.perf_counter() - started) / LISTS
    started = time.perf_counter()
    for message in messages:
        message.SerializeToString()
    serialize_s = (time.perf_counter() - started) / LISTS
    n = len(devices)
    print(
        f"   ListAndWatch list of {n} devices: build {build_s * 1000:.2f} ms "
        f"({build_s / n * 1e6:.2f} us/device), serialize {serialize_s * 1000:.2f} ms "
        f"({serialize_s / n * 1e6:.2f} us/device per stream)"
    )
