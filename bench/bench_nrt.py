"""How fast the NodeResourceTopology object follows the node, and what keeping it current costs
(targets, docs/topology.md: an Allocate shown within about 1 s, a freed pod within about 2 s).

``nvplugin serve --simulate dgx-1 --publish-topology`` beside the fake kubelet (its device manager
allocating, its pod resources API on a real socket) and the test API server:

- latency from an allocation (the kubelet's device manager records it and rewrites its
  checkpoint) to the object stored on the API server saying it, and from a freed pod to the
  object saying that: p50 and p99 over ``CYCLES`` of each;
- the publisher's CPU cost: serve's CPU time (user + system, from /proc) per second of wall time
  while pods are admitted and freed at 10 a second, less the same measured while idle.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.fakekubelet.pods import Container, Pod
from tests.support.kubeapi import KubeApiServer
from tests.support.nrt import KubeletPods, free_devices
from tests.support.serve import Serve, new_dir

NODE = "bench-node"
GPU = "nvidia.com/gpu"
CYCLES = 40
RATE_HZ = 10.0
LOAD_S = 15.0
WAIT_S = 60.0


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _main() -> None:
    async with KubeApiServer() as api:
        api.add_node(NODE)
        directory = new_dir()
        async with FakeKubelet(directory) as kubelet:
            pods = KubeletPods(kubelet.devices)
            server = pods.server
            await server.start()
            serve = Serve(
                directory,
                *("--simulate", "dgx-1", "--publish-topology"),
                *("--pod-resources-socket", server.socket_path),
                env={"KUBECONFIG": api.kubeconfig(), "NODE_NAME": NODE},
            )
            try:
                await kubelet.wait_registered(GPU, WAIT_S)
                await api.wait_for(lambda: free_devices(api.nrts.get(NODE)) == 8, WAIT_S)

                allocated, freed = [], []
                for i in range(CYCLES):
                    pod = Pod.of(f"p{i}", [Container.of("app", limits={GPU: 1 + i % 4})])
                    started = time.perf_counter()
                    await pods.admit(pod)
                    want = 8 - (1 + i % 4)
                    await api.wait_for(lambda w=want: free_devices(api.nrts.get(NODE)) == w, WAIT_S)
                    allocated.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    pods.delete(pod)
                    await api.wait_for(lambda: free_devices(api.nrts.get(NODE)) == 8, WAIT_S)
                    freed.append(time.perf_counter() - started)
                for what, values in (("allocation", allocated), ("freed pod", freed)):
                    print(
                        f"   {what} -> NRT updated: p50 {statistics.median(values) * 1000:.0f} ms, "
                        f"p99 {_pct(values, 0.99) * 1000:.0f} ms ({len(values)} each)"
                    )

                pid = serve.process.pid
                await asyncio.sleep(1.0)
                cpu, wall = _cpu_s(pid), time.perf_counter()
                await asyncio.sleep(LOAD_S)
                idle = (_cpu_s(pid) - cpu) / (time.perf_counter() - wall)
                writes_before = len([r for r in api.requests if r.method == "PUT"])
                cpu, wall = _cpu_s(pid), time.perf_counter()
                tick, i = 1.0 / RATE_HZ, 0
                deadline = wall + LOAD_S
                while time.perf_counter() < deadline:
                    next_at = time.perf_counter() + tick
                    if pods.pods:
                        pods.delete(pods.pods[0])
                    else:
                        await pods.admit(Pod.of(f"l{i}", [Container.of("app", limits={GPU: 2})]))
                    i += 1
                    await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                elapsed = time.perf_counter() - wall
                busy = (_cpu_s(pid) - cpu) / elapsed
                writes = len([r for r in api.requests if r.method == "PUT"]) - writes_before
                print(
                    f"   serve's CPU at {RATE_HZ:.0f} allocations/s: {busy * 100:.1f}% of a core "
                    f"(idle {idle * 100:.1f}%; the publisher {max(0.0, busy - idle) * 100:.1f}%), "
                    f"{writes} object writes in {elapsed:.0f} s"
                )
            finally:
                serve.stop()
                await server.stop()


def run() -> None:
    from nvplugin.log import configure

    configure("json", "warning")  # the in-process fake kubelet's lines stay out of the figures
    asyncio.run(_main())
