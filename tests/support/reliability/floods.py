"""Reliability scenarios for bounded work per request and for many resources, each against a real
``nvplugin serve`` and the fake kubelet (``make soak`` at full scale, ``make test`` scaled down):

- a flood of full GetPreferredAllocation requests (as many containers as one may name) on a node
  only a search answers: the kubelet's one-container requests are answered meanwhile, every
  flood request within its budget, and SIGTERM in the middle of it exits in seconds;
- a flood of Allocate requests: those naming thousands of containers are refused
  (INVALID_ARGUMENT) before any work, full ones answered, and cheap RPCs meanwhile stay fast;
  RSS grows by no more than the requests in flight at once can hold (:func:`in_flight_kib`);
- kubelet restarts on a MIG node serving six resources: every one is served and registered again
  each time, and the worst restart is reported.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import grpc

from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.fakekubelet.devicemanager import DeviceManager
from nvplugin.nodefile.reader import load_node
from nvplugin.plugin.server import preferred_budget
from nvplugin.rm import MAX_CONTAINER_REQUESTS
from tests.support import bignodes
from tests.support.harness import GPU, Outcome, health_status, rss_kib, running
from tests.support.reliability.scenarios import Scale
from tests.support.serve import new_dir
from tests.support.waiting import WAIT_S, until

GRACE_S = 30.0
"""Kubernetes' default termination grace period."""
SEARCH_BUDGET_S = 0.2
"""``--allocation-budget`` of the preferred-allocation flood: each container a search this long."""


def _flood(
    send: Callable[[api_pb2_grpc.DevicePluginStub], None],
    socket_path: str,
    stop: threading.Event,
    failures: list[str],
) -> None:
    """Call ``send`` on a channel of its own until ``stop``; its errors before ``stop`` are
    failures (after it, the plugin is going away on purpose)."""
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        while not stop.is_set():
            try:
                send(stub)
            except (grpc.RpcError, AssertionError) as exc:
                if not stop.is_set():
                    failures.append(f"{type(exc).__name__}: {exc}"[:500])


def _threads(count: int, target: Callable[[], None]) -> list[threading.Thread]:
    threads = [threading.Thread(target=target, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


async def preferred_flood(scale: Scale) -> Outcome:
    n, size = scale.flood_requests, MAX_CONTAINER_REQUESTS
    out = Outcome(
        f"GetPreferredAllocation flood: {n} x {size} containers (mesh-20, search "
        f"{SEARCH_BUDGET_S:g} s a container)",
        "the kubelet's GPA meanwhile",
    )
    node = bignodes.write(new_dir(), "mesh-20")
    ids = [gpu.uuid for gpu in load_node(node).gpus]
    budget = preferred_budget(SEARCH_BUDGET_S)
    one = api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=5)
    request = api_pb2.PreferredAllocationRequest(container_requests=[one] * size)
    durations: list[float] = []

    def send(stub: api_pb2_grpc.DevicePluginStub) -> None:
        started = time.perf_counter()
        reply = stub.GetPreferredAllocation(request, timeout=WAIT_S)
        durations.append(time.perf_counter() - started)
        assert len(reply.container_responses) == size, len(reply.container_responses)

    args = ("--simulate", node, "--allocation-budget", f"{SEARCH_BUDGET_S}s")
    async with running(*args) as (kubelet, plugin):
        dm = kubelet.devices
        await out.before(plugin.pid)
        stop = threading.Event()
        failures: list[str] = []
        threads = _threads(n, lambda: _flood(send, plugin.socket, stop, failures))
        try:
            # Under way: every flood thread has had an answer.
            await until(lambda: len(durations) >= n or bool(failures), "the flood under way")
            for _ in range(scale.flood_probes):
                started = time.perf_counter()
                answer = await dm.get_preferred_allocation(GPU, ids, [], 4)
                out.latencies.append(time.perf_counter() - started)
                out.iterations += 1
                out.check(answer is not None and len(answer) == 4, f"kubelet's GPA: {answer}")
            status, reason = await health_status(plugin.socket, timeout=WAIT_S)
            out.check(status == "SERVING", f"health service {status}: {reason}")
            await out.after(plugin.pid)
            stop.set()  # SIGTERM with every flood request still in flight
            started = time.perf_counter()
            code = await asyncio.to_thread(plugin.stop)
            took = time.perf_counter() - started
        finally:
            stop.set()
            for thread in threads:
                await asyncio.to_thread(thread.join, WAIT_S)
        for failure in failures[:20]:
            out.fail(f"flood: {failure}")
        out.check(code == 0, f"SIGTERM under the flood: exit {code}")
        out.check(took < GRACE_S / 2, f"SIGTERM under the flood took {took:.1f} s")
        worst = max(durations, default=0.0)
        out.check(worst < budget + 1.0, f"a flood request took {worst:.2f} s (budget {budget} s)")
        out.notes.append(
            f"{len(durations)} flood requests, the longest {worst:.2f} s (budget {budget:g} s); "
            f"SIGTERM under the flood: exit {code} in {took:.2f} s"
        )
        out.check("Traceback" not in plugin.text(), "a traceback in the plugin's log")
    return out


ALL_STRATEGIES = ("--device-list-strategy", "envvar,volume-mounts,cdi-annotations,cdi-cri")
WARM_UP_ROUNDS = 5
REFUSED = f"at most {MAX_CONTAINER_REQUESTS} are answered"


IN_FLIGHT_COPIES = 3
"""Copies of a request the plugin may hold while it is in flight: gRPC's receive buffer, the
parsed message, and what the handler builds from it (an answer, or a refusal)."""


def in_flight_kib(threads: int, *requests: api_pb2.AllocateRequest) -> int:
    """How much RSS the flood's own working set may add between two readings, in KiB: each of
    ``threads`` has at most one of each of ``requests`` in flight, held :data:`IN_FLIGHT_COPIES`
    times. Between the warm-up's reading and the last one the process's RSS swings by up to this
    with how many requests happened to be in flight, and how much of that the allocator kept (a
    heap's high-water mark is not returned), more so on a busy machine, where requests pile up:
    a bound relative to RSS failed there without a leak (DEVELOPERS.md#reliability-bounds). A leak
    grows with the number of requests (hundreds here, thousands at soak scale); this allowance
    does not."""
    return threads * IN_FLIGHT_COPIES * sum(r.ByteSize() for r in requests) // 1024


def check_rss(out: Outcome, allowance_kib: int, threads: int) -> None:
    """Fail ``out`` when the plugin's RSS grew by more than ``allowance_kib`` (what ``threads``
    requests in flight may hold, :func:`in_flight_kib`) between its two readings."""
    grown = (out.rss_end_kib or 0) - (out.rss_start_kib or 0)
    out.check(
        out.rss_start_kib is not None and out.rss_end_kib is not None and grown <= allowance_kib,
        f"RSS grew {grown} KiB ({out.rss_start_kib} -> {out.rss_end_kib} KiB), more than the "
        f"{threads} requests in flight at once can hold ({allowance_kib} KiB): a leak",
    )


async def allocate_flood(scale: Scale) -> Outcome:
    n = scale.flood_requests
    out = Outcome(
        f"Allocate flood: {n} threads of 5000 x 16 GPUs (refused) and "
        f"{MAX_CONTAINER_REQUESTS} x 16 (answered), dgx-2",
        "a cheap RPC meanwhile",
    )
    ids = [gpu.uuid for gpu in load_node("dgx-2").gpus]
    container = api_pb2.ContainerAllocateRequest(devices_ids=ids)
    too_big = api_pb2.AllocateRequest(container_requests=[container] * 5000)
    fits = api_pb2.AllocateRequest(container_requests=[container] * MAX_CONTAINER_REQUESTS)
    answered = refused = 0

    def send(stub: api_pb2_grpc.DevicePluginStub) -> None:
        nonlocal answered, refused
        try:
            stub.Allocate(too_big, timeout=WAIT_S)
            raise AssertionError("a request of 5000 containers was answered")
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            assert code == grpc.StatusCode.INVALID_ARGUMENT and REFUSED in details, details
            refused += 1
        reply = stub.Allocate(fits, timeout=WAIT_S)
        assert len(reply.container_responses) == MAX_CONTAINER_REQUESTS
        answered += 1

    async with running("--simulate", "dgx-2", *ALL_STRATEGIES, "--pass-device-specs") as (
        kubelet,
        plugin,
    ):
        dm = kubelet.devices
        failures: list[str] = []
        stop = threading.Event()
        threads = _threads(n, lambda: _flood(send, plugin.socket, stop, failures))
        try:
            # RSS "before": the highest of the warm-up rounds (every thread has a round in each),
            # so that the flood's own working set -- up to n refused requests of 3.4 MB in
            # flight at once, parsed on gRPC's threads, whose malloc arenas saw up and down as
            # they come and go -- is in it; what follows must not add to it.
            highest = 0
            for rounds in range(1, WARM_UP_ROUNDS + 1):
                async with asyncio.timeout(WAIT_S):
                    while answered < rounds * n and not failures:
                        await asyncio.sleep(0.05)
                highest = max(highest, rss_kib(plugin.pid))
            await out.before(plugin.pid)
            out.rss_start_kib = max(highest, out.rss_start_kib or 0)
            async with grpc.aio.insecure_channel(f"unix:{plugin.socket}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                for number in range(scale.flood_probes):
                    started = time.perf_counter()
                    await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=WAIT_S)
                    out.latencies.append(time.perf_counter() - started)
                    response = await dm.allocate(GPU, ids[number % 16 : number % 16 + 1])
                    out.check(len(response.envs) > 0, "the kubelet's Allocate answered nothing")
                    out.iterations += 1
        finally:
            stop.set()
            for thread in threads:
                await asyncio.to_thread(thread.join, WAIT_S)
        await out.after(plugin.pid)
        for failure in failures[:20]:
            out.fail(f"flood: {failure}")
        out.check(refused > 0 and answered > 0, f"{refused} refused, {answered} answered")
        allowance = in_flight_kib(n, too_big, fits)
        check_rss(out, allowance, n)
        out.notes.append(
            f"{refused} requests refused as too many containers, {answered} answered; RSS "
            f"{out.rss_start_kib} -> {out.rss_end_kib} KiB (in-flight allowance {allowance} KiB)"
        )
        out.check("Traceback" not in plugin.text(), "a traceback in the plugin's log")
    return out


MIG_NODE = "dgx-a100-mig"


async def mig_kubelet_restarts(scale: Scale) -> Outcome:
    out = Outcome(
        f"kubelet restarts, {MIG_NODE} under migStrategy mixed (6 resources)",
        "restart to every resource registered",
    )
    async with running("--simulate", MIG_NODE, "--mig-strategy", "mixed") as (kubelet, plugin):
        obs = kubelet.observer

        def six(m: DeviceManager) -> bool:
            served = [r for r in m.resources() if m.is_registered(r) and m.healthy_devices(r)]
            return len(served) == 6

        await obs.wait_for(six, WAIT_S, "six resources registered, each with its devices")
        dm = kubelet.devices
        expected = {r: dm.healthy_devices(r) for r in dm.resources()}
        out.check(all(expected.values()), f"a resource without devices: {expected}")
        await out.before(plugin.pid)

        def again(m: DeviceManager) -> bool:
            return all(
                m.is_registered(r) and m.healthy_devices(r) == d for r, d in expected.items()
            )

        for n in range(scale.mig_restarts):
            started = time.perf_counter()
            await kubelet.restart()
            try:
                await obs.wait_for(again, WAIT_S, "every resource registered, every device")
            except TimeoutError as exc:
                out.fail(f"restart {n}: {exc}")
                continue
            out.latencies.append(time.perf_counter() - started)
            out.iterations += 1
        await out.after(plugin.pid)
        records = obs.registrations
        out.check(
            len(records) == 6 * (scale.mig_restarts + 1),
            f"{len(records)} registrations for 6 resources and {scale.mig_restarts} restarts",
        )
        out.check(all(r.error is None for r in records), "a registration was refused")
        out.check(
            (out.fds_end or 0) <= (out.fds_start or 0) + 6, f"fds {out.fds_start}->{out.fds_end}"
        )
        worst = max(out.latencies, default=0.0)
        out.notes.append(f"worst restart: every resource registered again in {worst * 1000:.0f} ms")
        out.check("Traceback" not in plugin.text(), "a traceback in the plugin's log")
    return out
