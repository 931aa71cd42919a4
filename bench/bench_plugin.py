"""The device plugin on a simulated DGX-2 (16 GPUs, NVSwitch), against the fake kubelet, and on
generated nodes beyond 16 GPUs (tests/support/bignodes.py).

Prints:
- start -> registered: from spawning ``nvplugin serve`` to the kubelet holding a live
  registration (target <= 1 s); registration waits for the allocation policy's start-up work,
  so this includes it (also on the 128-GPU nodes);
- RPC round trip p50/p99 of GetDevicePluginOptions and GetPreferredAllocation over the unix socket
  (target: GPA p99 within 5 ms of the options RPC's), on the DGX-2, on a 24-GPU node of four PCIe
  switches and on 24-GPU nodes of six (l4-24, l4-24-uneven: the branch
  search; also the 32-GPU servers of eight switches), both RPCs interleaved in one run;
- start -> registered and RSS on the PCIe-switch servers beyond 16 GPUs (l4-20, l4-24, l4-32,
  l4-32-uneven: eight uneven switches under two sockets, l4-32-one-socket: under one);
- on the 20-GPU node without structure: GetPreferredAllocation round trips (target: within the
  0.1 s budget) while another client sends gRPC health checks back to back (target: each
  answered in under 50 ms, the event loop never waits for the search);
- health event -> ListAndWatch message p99: from the moment a scripted Xid is due in the simulated
  NVML to the new list arriving at a client (target <= 50 ms);
- RSS of the serve process with 10 open ListAndWatch streams (target <= 80 MB).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path

import grpc

from bench.unhealthy import unhealthy_latencies

NODE = "dgx-2"
GPU = "nvidia.com/gpu"
STARTS = 5
RPCS = 2000
WARM_UP = 100
STREAMS = 10
RESTARTS = 20
LARGE_STARTS = 3
SEARCHES = 40


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def spawn(
    directory: str, *args: str, node: str = NODE, bytecode: str | None = None
) -> subprocess.Popen[bytes]:
    """``nvplugin serve``; with ``bytecode`` (a directory), Python reads and writes compiled
    modules there (``PYTHONPYCACHEPREFIX``), as an installed package runs from bytecode."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
    if bytecode is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = bytecode
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "nvplugin", "serve", "--simulate", node),
            *("--device-plugin-dir", directory, "--log-format", "json", "--log-level", "warning"),
            *args,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(process: subprocess.Popen[bytes], wait_s: float = 10) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(wait_s)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _start_to_registered() -> tuple[list[float], list[float]]:
    """Spawn -> registered, and (on the last process) kubelet restart -> registered again."""
    from nvplugin.fakekubelet.kubelet import FakeKubelet

    starts, restarts = [], []
    for run in range(STARTS):
        directory = tempfile.mkdtemp()
        async with FakeKubelet(directory) as kubelet:
            started = time.perf_counter()
            process = spawn(directory)
            try:
                await kubelet.wait_registered(GPU, timeout=30)
                starts.append(time.perf_counter() - started)
                if run == STARTS - 1:
                    for _ in range(RESTARTS):
                        await kubelet.stop()
                        started = time.perf_counter()
                        await kubelet.start()  # deletes the sockets, serves kubelet.sock again
                        await kubelet.wait_registered(GPU, timeout=30)
                        restarts.append(time.perf_counter() - started)
            finally:
                stop(process)
    return starts, restarts


async def _registered(
    node: str, runs: int, bytecode: str | None = None
) -> tuple[list[float], list[float]]:
    """Spawn -> registered on ``node`` (a built-in name or node file path), ``runs`` times, and
    the process's RSS once registered (MiB). With ``bytecode`` (see :func:`_spawn`), one run
    first that is not counted (it compiles what the others read)."""
    from nvplugin.fakekubelet.kubelet import FakeKubelet

    starts, rss = [], []
    for run in range(runs + (bytecode is not None)):
        directory = tempfile.mkdtemp()
        async with FakeKubelet(directory) as kubelet:
            started = time.perf_counter()
            process = spawn(directory, node=node, bytecode=bytecode)
            try:
                await kubelet.wait_registered(GPU, timeout=30)
                if bytecode is None or run > 0:
                    starts.append(time.perf_counter() - started)
                    rss.append(_rss_mb(process.pid))
            finally:
                stop(process)
    return starts, rss


def _load() -> str:
    """The 1-minute load average (the machine is shared: every figure says how busy it was)."""
    return f"{os.getloadavg()[0]:.2f}"


@contextlib.contextmanager
def _serving(node: str) -> Iterator[str]:
    """``nvplugin serve`` on ``node`` without a kubelet: its socket path once it answers."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    directory = tempfile.mkdtemp()
    process = spawn(directory, node=node)
    try:
        path = os.path.join(directory, "nvplugin-gpu.sock")
        while not os.path.exists(path):
            time.sleep(0.02)
        with grpc.insecure_channel(f"unix:{path}") as channel:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        time.sleep(1.0)  # the policy's start-up work runs in the background before registration
        yield path
    finally:
        stop(process)


def _search_while_checking(socket_path: str, node: str) -> tuple[list[float], list[float]]:
    """GetPreferredAllocation back to back on one channel (all GPUs free, random sizes), gRPC
    health checks back to back on another meanwhile: both round trips in ms."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
    from nvplugin.nodesession import load_topology

    uuids = [gpu.uuid for gpu in load_topology(node).gpus]
    searches: list[float] = []

    def search() -> None:
        rng = random.Random(5)
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            for _ in range(SEARCHES):
                request = api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=uuids,
                            allocation_size=rng.randint(3, len(uuids) - 3),
                        )
                    ]
                )
                started = time.perf_counter()
                stub.GetPreferredAllocation(request, timeout=30)
                searches.append((time.perf_counter() - started) * 1000)

    checks: list[float] = []
    worker = threading.Thread(target=search)
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        worker.start()
        while worker.is_alive():
            started = time.perf_counter()
            health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            checks.append((time.perf_counter() - started) * 1000)
    worker.join()
    return searches, checks


def _print_round_trips(label: str, options_ms: list[float], gpa_ms: list[float]) -> None:
    p99_gap = _percentile(gpa_ms, 99) - _percentile(options_ms, 99)
    print(
        f"   {label}GetDevicePluginOptions  p50 {_percentile(options_ms, 50):.3f} ms"
        f"  p99 {_percentile(options_ms, 99):.3f} ms   ({RPCS} calls; load {_load()})"
    )
    print(
        f"   {label}GetPreferredAllocation  p50 {_percentile(gpa_ms, 50):.3f} ms"
        f"  p99 {_percentile(gpa_ms, 99):.3f} ms  max {max(gpa_ms):.3f} ms"
        f"   (p99 gap {p99_gap:+.3f} ms; target <= 5 ms; load {_load()})"
    )


def _beyond_16() -> None:
    """The figures on generated nodes beyond 16 GPUs (module docstring)."""
    import shutil

    from tests.support.bignodes import write

    nodes = tempfile.mkdtemp()
    try:
        for name in ("pcie-switch-128", "nvswitch-128"):
            starts, _ = asyncio.run(_registered(write(nodes, name), LARGE_STARTS))
            print(
                f"   start -> registered ({name}, {LARGE_STARTS} runs): median "
                f"{statistics.median(starts):.2f} s, max {max(starts):.2f} s   (target <= 1 s; "
                f"load {_load()})"
            )
        for name in ("l4-20", "l4-24", "l4-32", "l4-32-uneven", "l4-32-one-socket"):
            starts, rss = asyncio.run(_registered(write(nodes, name), LARGE_STARTS))
            print(
                f"   start -> registered ({name}, {LARGE_STARTS} runs): median "
                f"{statistics.median(starts):.2f} s, max {max(starts):.2f} s; RSS median "
                f"{statistics.median(rss):.1f} MB   (targets <= 1 s; load {_load()})"
            )
        for name in (
            "pcie-switch-24",
            "l4-24",
            "l4-24-uneven",
            "l4-32",
            "l4-32-uneven",
            "l4-32-one-socket",
        ):
            node = write(nodes, name)
            with _serving(node) as path:
                options_ms, gpa_ms = _round_trips(path, node)
            _print_round_trips(f"{name}: ", options_ms, gpa_ms)
        node = write(nodes, "mesh-20")
        with _serving(node) as path:
            searches, checks = _search_while_checking(path, node)
        print(
            f"   mesh-20 (no structure, budget 0.1 s): GetPreferredAllocation p50 "
            f"{_percentile(searches, 50):.1f} ms  p99 {_percentile(searches, 99):.1f} ms  max "
            f"{max(searches):.1f} ms   ({len(searches)} calls, all 20 GPUs free; load {_load()})"
        )
        print(
            f"   mesh-20: health checks meanwhile p50 {_percentile(checks, 50):.2f} ms  p99 "
            f"{_percentile(checks, 99):.2f} ms  max {max(checks):.2f} ms   ({len(checks)} checks;"
            f" target < 50 ms; load {_load()})"
        )
    finally:
        shutil.rmtree(nodes, ignore_errors=True)


def _round_trips(socket_path: str, node: str = NODE) -> tuple[list[float], list[float]]:
    from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
    from nvplugin.nodesession import load_topology

    uuids = [gpu.uuid for gpu in load_topology(node).gpus]
    n = len(uuids)
    rng = random.Random(4)
    requests = []
    for _ in range(RPCS + WARM_UP):
        available = sorted(rng.sample(range(n), rng.randint(n // 2, n)))
        size = rng.randint(1, len(available))
        must = rng.sample(available, rng.randint(0, min(2, size)))
        requests.append(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=[uuids[i] for i in available],
                        must_include_deviceIDs=[uuids[i] for i in must],
                        allocation_size=size,
                    )
                ]
            )
        )
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        empty = api_pb2.Empty()
        # Warm up both paths on requests of their own: the search keeps what it proves from one
        # request to the next, so a measured request must not be one asked before.
        for request in requests[RPCS:]:
            stub.GetDevicePluginOptions(empty)
            stub.GetPreferredAllocation(request)
        options_ms, gpa_ms = [], []
        for request in requests[:RPCS]:  # interleaved, so both see the same machine state
            t0 = time.perf_counter()
            stub.GetDevicePluginOptions(empty)
            t1 = time.perf_counter()
            stub.GetPreferredAllocation(request)
            t2 = time.perf_counter()
            options_ms.append((t1 - t0) * 1000)
            gpa_ms.append((t2 - t1) * 1000)
    return options_ms, gpa_ms


def _rss_with_streams(directory: str, process: subprocess.Popen[bytes]) -> tuple[float, float]:
    from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc

    path = os.path.join(directory, "nvplugin-gpu.sock")
    before = _rss_mb(process.pid)
    channels = [grpc.insecure_channel(f"unix:{path}") for _ in range(STREAMS)]
    streams = [api_pb2_grpc.DevicePluginStub(c).ListAndWatch(api_pb2.Empty()) for c in channels]
    for stream in streams:
        next(stream)
    time.sleep(0.5)
    after = _rss_mb(process.pid)
    for stream in streams:
        stream.cancel()
    for channel in channels:
        channel.close()
    return before, after


def _event_latencies() -> list[float]:
    """In-process (to know when the simulated NVML makes each event due): Xid 48 on GPU k % 16
    every 0.1 s; with recovery after 0.2 s quiet, every event is a change."""
    directory = tempfile.mkdtemp()
    start_s, spacing_s, count = 2.0, 0.1, 96
    events = "\n".join(
        f"- {{after_s: {start_s + spacing_s * k:.2f}, gpu: {k % 16}, xid: 48}}"
        for k in range(count)
    )
    builtin = (resources.files("nvplugin.nodefile") / "nodes" / f"{NODE}.yaml").read_text()
    node_path = os.path.join(directory, "dgx-2-events.yaml")
    Path(node_path).write_text(builtin.replace("events: []", "events:\n" + events))
    return unhealthy_latencies(
        node_path,
        "version: v1\nnvplugin:\n  health:\n    recovery: {quietPeriod: 200ms}\n",
        [(start_s + spacing_s * k, k % 16) for k in range(count)],
        start_s + spacing_s * count + 1.0,
    )


def footprint(nodes: Sequence[str], *, sources: bool = True) -> None:
    """Start -> registered and RSS once registered on ``nodes`` (built-in names, or the
    generated nodes of tests/support/bignodes.py), from bytecode and (``sources``) from source."""
    from tests.support.bignodes import NODES, write

    bytecode, generated = tempfile.mkdtemp(), tempfile.mkdtemp()
    for name in nodes:
        node = write(generated, name) if name in NODES else name
        labels = (("from source", None),) if sources else ()
        # The footprint targets for the DGX nodes; beyond 16 GPUs, start -> registered's.
        targets = "targets <= 0.8 s, <= 60 MiB" if name in (NODE, "dgx-a100") else "target <= 1 s"
        for label, cache in (*labels, ("from bytecode", bytecode)):
            starts, rss = asyncio.run(_registered(node, STARTS, cache))
            print(
                f"   footprint ({name}, {label}, {STARTS} runs): start -> registered median "
                f"{statistics.median(starts):.2f} s, max {max(starts):.2f} s; RSS once "
                f"registered median {statistics.median(rss):.1f} MiB   ({targets}; load {_load()})",
                flush=True,
            )


def run() -> None:
    from nvplugin.log import configure

    configure("json", "warning")  # the in-process fake kubelet's lines stay out of the figures
    starts, restarts = asyncio.run(_start_to_registered())
    print(
        f"   start -> registered ({NODE}, {STARTS} runs): median {statistics.median(starts):.2f} s,"
        f" max {max(starts):.2f} s   (target <= 1 s; load {_load()})"
    )
    print(
        f"   kubelet restart -> registered again ({RESTARTS} restarts): median "
        f"{statistics.median(restarts) * 1000:.1f} ms, max {max(restarts) * 1000:.1f} ms"
        f"   (target <= 1 s; load {_load()})"
    )
    # This checkout runs from source: installed editable, and with PYTHONDONTWRITEBYTECODE set
    # (as on the development machines) every start compiles nvplugin's modules again. The image
    # installs the package with pip, which compiles it: "from bytecode" runs the same code with
    # a bytecode cache in the run directory (the checkout is not written to).
    footprint((NODE, "dgx-a100"))

    directory = tempfile.mkdtemp()
    process = spawn(directory)
    try:
        path = os.path.join(directory, "nvplugin-gpu.sock")
        while not os.path.exists(path):
            time.sleep(0.02)
        time.sleep(1.0)  # the allocation tables are built in the background at start
        options_ms, gpa_ms = _round_trips(path)
        _print_round_trips("", options_ms, gpa_ms)
        before, after = _rss_with_streams(directory, process)
        print(
            f"   RSS: {before:.1f} MB idle, {after:.1f} MB with {STREAMS} ListAndWatch streams"
            f"   (target <= 80 MB; load {_load()})"
        )
    finally:
        stop(process)

    _beyond_16()

    latencies = _event_latencies()
    print(
        f"   health event -> ListAndWatch message ({len(latencies)} events): "
        f"p50 {_percentile(latencies, 50):.2f} ms, p99 {_percentile(latencies, 99):.2f} ms"
        f"   (target p99 <= 50 ms; load {_load()})"
    )


if __name__ == "__main__":
    # Only the footprint lines: python -m bench.bench_plugin [NODE ...] (from bytecode only),
    # e.g. dgx-2 dgx-a100 l4-32 l4-32-uneven l4-32-one-socket.
    from nvplugin.log import configure
    from tests.support.rundir import run_directory

    configure("json", "warning")
    with run_directory("nvpb-"):
        footprint(sys.argv[1:] or (NODE, "dgx-a100"), sources=False)
