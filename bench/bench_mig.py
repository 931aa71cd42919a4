"""MIG: discovery of 8 GPUs x 7 MIG devices, and GetPreferredAllocation among them.

Discovery: the DGX A100 with every GPU cut into seven 1g.5gb (56 MIG devices), in process through
the simulated NVML, beside the same node with MIG off; NVML calls counted. Allocation: the MIG
policy over those 56 devices (``migStrategy: single`` serves them as one resource) and over the
16-device ``nvidia.com/mig-1g.5gb`` resource of ``dgx-a100-mig`` (``mixed``): every size with
all devices free, then 300 random queries (random free subset, size, 0-2 must-include; fixed
seed), each timed once. No stated target; the GPU policies' is p99 <= 0.2 ms on 8 GPUs.

End to end: ``nvplugin serve --mig-strategy single`` on that node as a real process against the
fake kubelet: spawn -> 56 MIG devices listed to the kubelet, then GetPreferredAllocation round
trips over the unix socket (random queries, IDs as the kubelet sends them).

Run: ``python -m bench mig``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from typing import Any

SEED = 20240613
RANDOM_QUERIES = 300
RPCS = 1000
NODE = "dgx-a100"
PROFILE = "1g.5gb"
A100 = "NVIDIA A100-SXM4-40GB"


def _mig_spec(node: str = NODE) -> Any:
    """``node`` with every GPU an A100 40GB cut into seven 1g.5gb."""
    from nvplugin.node.mig import lay_out, mig_model
    from nvplugin.nodefile.reader import load_node

    spec = load_node(node)
    model = mig_model(A100)
    assert model is not None
    gpus = tuple(
        dataclasses.replace(
            gpu, name=A100, memory_mib=model.memory_mib, mig=lay_out(model, [PROFILE] * 7)
        )
        for gpu in spec.gpus
    )
    return dataclasses.replace(spec, name=f"{node}-{PROFILE}x7", gpus=gpus)


def _discovery(spec: Any, repeats: int) -> tuple[list[float], int, Any]:
    from nvplugin.node.nvml import Nvml
    from nvplugin.sim.fakenvml import SimulatedNvml

    times = []
    with SimulatedNvml(spec) as sim:
        for _ in range(repeats):
            before = sum(sim.calls.values())
            started = time.perf_counter()
            with Nvml(sim.sysfs_root, sim.driver_root) as nvml:
                topology = nvml.discover(spec.name)
            times.append((time.perf_counter() - started) * 1000)
            calls = sum(sim.calls.values()) - before
    return times, calls, topology


Query = tuple[list[int], list[int], int]


def _ragged(parents: int, rng: random.Random) -> list[Query]:
    """Each parent with a random number of its 7 devices free: parents differ in free count, so
    few are interchangeable and the search is at its widest."""
    work: list[Query] = []
    for _ in range(RANDOM_QUERIES):
        available = [p * 7 + i for p in range(parents) for i in range(rng.randint(1, 7))]
        work.append((available, [], rng.randint(1, len(available))))
    return work


def _allocation(topology: Any, devices: Any, label: str, work: list[Query]) -> None:
    from nvplugin.allocator.mig import MigPolicy

    started = time.perf_counter()
    policy = MigPolicy(topology, devices)
    build_ms = (time.perf_counter() - started) * 1000
    times = []
    for available, must, size in work:
        started = time.perf_counter()
        answer = policy.allocate(available, must, size)
        times.append((time.perf_counter() - started) * 1000)
        assert len(answer) == size
    times.sort()
    p99 = times[int(len(times) * 0.99) - 1]
    print(
        f"   GetPreferredAllocation, {label}: {len(times)} queries, p50 "
        f"{statistics.median(times):.3f} ms, p99 {p99:.3f} ms, max {times[-1]:.3f} ms "
        f"(policy made in {build_ms:.2f} ms)"
    )


def run() -> None:
    from bench.bench_allocator import queries
    from nvplugin.nodefile.reader import load_node
    from nvplugin.rm.migstrategy import apply_strategy

    spec = _mig_spec()
    mig_times, mig_calls, topology = _discovery(spec, 50)
    plain_times, plain_calls, _ = _discovery(load_node(NODE), 50)
    print(
        f"   discovery of {NODE}, 8 GPUs x 7 MIG devices ({len(topology.mig_devices)}), in "
        f"process: p50 {statistics.median(mig_times):.1f} ms, max {max(mig_times):.1f} ms over "
        f"{len(mig_times)} runs, {mig_calls} NVML calls (MIG off: p50 "
        f"{statistics.median(plain_times):.1f} ms, {plain_calls} calls)"
    )
    ((_, served),) = apply_strategy(topology.gpus, "single").mig
    devices = [d.mig for d in served]
    rng = random.Random(SEED)
    _allocation(topology, devices, "56 devices on 8 GPUs (single)", queries(56, SEED))
    _allocation(topology, devices, "56 devices, ragged free counts", _ragged(8, rng))
    mixed = load_node("dgx-a100-mig").topology()
    ones = [d.mig for d in apply_strategy(mixed.gpus, "mixed").resource("nvidia.com/mig-1g.5gb")]
    label = "nvidia.com/mig-1g.5gb on dgx-a100-mig (16)"
    _allocation(mixed, ones, label, queries(len(ones), SEED))
    large = _mig_spec("dgx-2").topology()
    label = "112 devices on 16 GPUs (dgx-2 fabric), ragged free counts"
    _allocation(large, list(large.mig_devices), label, _ragged(16, rng))
    _end_to_end()


def _node_file(directory: str) -> str:
    """The 8 x 7 node as a node file: ``dgx-a100`` with ``mig: [1g.5gb x7]`` on every GPU."""
    text = resources.files("nvplugin.nodefile").joinpath("nodes", f"{NODE}.yaml").read_text()
    profiles = ", ".join([PROFILE] * 7)
    text, count = re.subn(r"nvswitch_links: 12\}", f"nvswitch_links: 12, mig: [{profiles}]}}", text)
    assert count == 8
    path = os.path.join(directory, f"{NODE}-{PROFILE}x7.yaml")
    with open(path, "w") as out:
        out.write(text.replace(f"name: {NODE}\n", f"name: {NODE}-{PROFILE}x7\n"))
    return path


async def _serve(directory: str) -> tuple[float, list[float]]:
    """Spawn ``serve --mig-strategy single`` -> 56 devices at the kubelet; then RPC round trips."""
    from nvplugin.fakekubelet.kubelet import FakeKubelet

    node = _node_file(directory)
    plugins = os.path.join(directory, "plugins")
    os.mkdir(plugins)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
    async with FakeKubelet(plugins) as kubelet:
        started = time.perf_counter()
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "nvplugin", "serve", "--simulate", node),
                *("--mig-strategy", "single", "--device-plugin-dir", plugins),
                *("--log-format", "json", "--log-level", "warning"),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            await kubelet.observer.wait_for(
                lambda m: len(m.devices("nvidia.com/gpu")) == 56, 60, "56 MIG devices"
            )
            start_s = time.perf_counter() - started
            ids = sorted(kubelet.devices.devices("nvidia.com/gpu"))
            socket_path = os.path.join(plugins, "nvplugin-gpu.sock")
            rpc_ms = await asyncio.to_thread(_round_trips, socket_path, ids)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(10)
    return start_s, rpc_ms


def _round_trips(socket_path: str, ids: list[str]) -> list[float]:
    import grpc

    from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc

    rng = random.Random(SEED)
    requests = []
    for _ in range(RPCS):
        available = sorted(rng.sample(ids, rng.randint(1, len(ids))))
        size = rng.randint(1, len(available))
        must = rng.sample(available, min(size, rng.randint(0, 2)))
        requests.append(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available,
                        must_include_deviceIDs=must,
                        allocation_size=size,
                    )
                ]
            )
        )
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for request in requests[:100]:  # warm up
            stub.GetPreferredAllocation(request)
        times = []
        for request in requests:
            started = time.perf_counter()
            reply = stub.GetPreferredAllocation(request)
            times.append((time.perf_counter() - started) * 1000)
            wanted = request.container_requests[0].allocation_size
            assert len(reply.container_responses[0].deviceIDs) == wanted
    return times


def _end_to_end() -> None:
    from nvplugin.log import configure

    configure("json", "warning")  # the in-process fake kubelet's lines stay out of the figures
    directory = tempfile.mkdtemp()
    try:
        start_s, rpc_ms = asyncio.run(_serve(directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    rpc_ms.sort()
    p99 = rpc_ms[int(len(rpc_ms) * 0.99) - 1]
    print(
        f"   nvplugin serve --mig-strategy single, 8 GPUs x 7 MIG devices: spawn -> 56 devices "
        f"at the kubelet {start_s:.2f} s; GetPreferredAllocation over the socket, {len(rpc_ms)} "
        f"RPCs: p50 {statistics.median(rpc_ms):.3f} ms, p99 {p99:.3f} ms"
    )
