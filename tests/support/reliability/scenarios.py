"""The reliability scenarios, each at a chosen :class:`Scale`: small in ``make test``, full in
``make soak``. One code path for both, so the soak table measures exactly what the tests check.

Every scenario runs a real ``nvplugin serve`` subprocess on a simulated node against the fake
kubelet, over real unix sockets, and checks that nothing is lost: every stream sees every health
change, no valid request gets an error, and the kubelet's view equals the plugin's.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nvplugin.allocator import make_policy
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.fakekubelet.devicemanager import DeviceManager, DevicePluginError
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.fakekubelet.observer import Observer
from nvplugin.nodesession import load_topology
from nvplugin.plugin.httpendpoint import MAX_CONNECTIONS, REQUEST_TIMEOUT_S
from nvplugin.plugin.server import publish_interval
from tests.support.harness import (
    GPU,
    SOCKET,
    CountingWatchers,
    HealthWatch,
    Outcome,
    Plugin,
    Watchers,
    distinct,
    dropped,
    fd_count,
    health_status,
    log_time,
    metric,
    running,
    settled_fds,
    sysfs_trees,
    thread_count,
)
from tests.support.serve import new_dir, node_file
from tests.support.waiting import WAIT_S


@dataclass(frozen=True)
class Scale:
    """How hard each scenario pushes."""

    kubelet_restarts: int
    plugin_kills: int
    kubelet_down_s: float
    streams: int
    rpcs: int
    threads: int
    reloads: int
    fuzz_examples: int
    storm_replicas: int  # time-slicing replicas per GPU of dgx-2 (16 GPUs) in the health storm
    storm_s: float  # how long the storm lasts
    storm_streams: int  # ListAndWatch streams open during it (besides the kubelet's)
    idle_connections: int  # idle TCP connections held to each HTTP endpoint
    flood_requests: int  # threads sending full requests back to back (floods.py)
    flood_probes: int  # the kubelet's own requests made during a flood
    mig_restarts: int  # kubelet restarts on the node serving six resources


TEST = Scale(
    kubelet_restarts=10,
    plugin_kills=3,
    kubelet_down_s=3.0,
    streams=20,
    rpcs=2_000,
    threads=8,
    reloads=4,
    fuzz_examples=120,
    storm_replicas=500,
    storm_s=4.0,
    storm_streams=2,
    idle_connections=300,
    flood_requests=3,
    flood_probes=10,
    mig_restarts=3,
)
SOAK = Scale(
    kubelet_restarts=100,
    plugin_kills=20,
    kubelet_down_s=30.0,
    streams=100,
    rpcs=10_000,
    threads=8,
    reloads=20,
    fuzz_examples=1_500,
    storm_replicas=500,
    storm_s=30.0,
    storm_streams=10,
    idle_connections=3_000,
    flood_requests=8,
    flood_probes=200,
    mig_restarts=50,
)


def uuids(node: str) -> list[str]:
    return [gpu.uuid for gpu in load_topology(node).gpus]


# --- faults -----------------------------------------------------------------------------------


async def kubelet_restarts(scale: Scale) -> Outcome:
    """The kubelet restarts N times; each time the plugin serves again and re-registers, the
    kubelet sees every device healthy, and fds, tasks and RSS stay flat."""
    out = Outcome("kubelet restart", "restart to re-registered")
    every = set(uuids("dgx-a100"))
    async with running("--simulate", "dgx-a100") as (kubelet, plugin):
        dm = kubelet.devices
        obs = kubelet.observer
        await obs.wait_for(lambda m: m.healthy_devices(GPU) == every, WAIT_S, "8 healthy GPUs")
        out.rss_start_kib = plugin.rss()
        fds_start = await settled_fds(plugin.pid)
        for n in range(scale.kubelet_restarts):
            started = time.perf_counter()
            await kubelet.restart()
            try:
                await obs.wait_for(
                    lambda m: m.is_registered(GPU) and m.healthy_devices(GPU) == every,
                    WAIT_S,
                    "registered again with 8 healthy GPUs",
                )
            except TimeoutError as exc:
                out.fail(f"restart {n}: {exc}")
                continue
            out.latencies.append(time.perf_counter() - started)
            out.iterations += 1
        out.rss_end_kib = plugin.rss()
        await plugin.wait_log(
            "registered with kubelet",
            where=lambda e: e["registrations"] == scale.kubelet_restarts + 1,
        )
        records = obs.registrations
        out.check(
            len(records) == scale.kubelet_restarts + 1,
            f"{len(records)} registrations for {scale.kubelet_restarts} restarts",
        )
        out.check(all(r.error is None for r in records), "a registration was refused")
        tasks = [e["tasks"] for e in plugin.events("registered with kubelet")]
        # A count taken at registration includes RPC tasks of the old and new kubelet still
        # coming and going (+-2); a leak of one task per restart would add N-6 between the
        # first and last three. So compare the fewest seen late with the most seen early.
        out.check(min(tasks[-3:]) <= max(tasks[:3]) + 2, f"asyncio tasks grew: {tasks}")
        fds_end = await settled_fds(plugin.pid)
        out.check(fds_end <= fds_start + 2, f"fds grew from {fds_start} to {fds_end}")
        samples = await plugin.metrics()
        restarts = metric(samples, "nvplugin_kubelet_restarts_total", resource=GPU)
        registrations = metric(samples, "nvplugin_registrations_total", resource=GPU)
        out.check(
            (restarts, registrations) == (scale.kubelet_restarts, scale.kubelet_restarts + 1),
            f"metrics say {restarts} restarts, {registrations} registrations",
        )
        status, reason = await health_status(plugin.socket)
        out.check(status == "SERVING", f"health service {status}: {reason}")
        answer = await dm.get_preferred_allocation(GPU, sorted(every), [], 4)
        out.check(answer is not None and len(answer) == 4, f"preferred allocation: {answer}")
    return out


async def plugin_kills(scale: Scale) -> Outcome:
    """``nvplugin serve`` is SIGKILLed N times and started again: the stale socket it leaves is
    replaced, the kubelet gets it back, and no simulated sysfs tree of a killed process stays
    behind in /dev/shm."""
    out = Outcome("plugin SIGKILL + restart", "process start to registered")
    directory = new_dir()
    every = set(uuids("workstation-4gpu"))
    killed: list[int] = []
    async with FakeKubelet(directory) as kubelet:
        obs = kubelet.observer
        for n in range(scale.plugin_kills + 1):
            started = time.perf_counter()
            plugin = Plugin(directory, "--simulate", "workstation-4gpu")
            try:
                await obs.wait_for(
                    _registered_times(obs, n + 1, every),
                    WAIT_S,
                    f"registration {n + 1} with 4 healthy GPUs",
                )
            except TimeoutError as exc:
                out.fail(f"start {n}: {exc}\n{plugin.text()[-2000:]}")
                plugin.kill()
                continue
            out.latencies.append(time.perf_counter() - started)
            rss = plugin.rss()
            out.rss_start_kib = out.rss_start_kib or rss
            out.rss_end_kib = rss
            if n == scale.plugin_kills:  # the last one stops cleanly
                out.check(plugin.stop() == 0, "the last plugin did not exit 0")
                out.check(not sysfs_trees(plugin.pid), "a clean stop left its sysfs tree")
                break
            plugin.process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(plugin.wait)
            killed.append(plugin.pid)
            out.iterations += 1
            out.check(
                os.path.exists(os.path.join(directory, SOCKET)), "SIGKILL left no stale socket"
            )
            try:
                await obs.wait_for(lambda m: not m.is_registered(GPU), WAIT_S, "the stream to end")
            except TimeoutError as exc:
                out.fail(f"kill {n}: {exc}")
    left = sorted(name for pid in killed for name in sysfs_trees(pid))
    out.check(not left, f"sysfs trees of killed plugins left in /dev/shm: {left}")
    return out


def _registered_times(
    obs: Observer, count: int, devices: set[str]
) -> Callable[[DeviceManager], bool]:
    """Registered ``count`` times so far, now registered, ``devices`` all healthy."""

    def check(m: DeviceManager) -> bool:
        return (
            len(obs.registrations) == count
            and m.is_registered(GPU)
            and m.healthy_devices(GPU) == devices
        )

    return check


async def kubelet_down(scale: Scale) -> Outcome:
    """The kubelet is down for a while; a GPU is lost meanwhile. When it is back, the plugin
    registers again on its own and the kubelet's first view already has the GPU Unhealthy."""
    out = Outcome(f"kubelet down {scale.kubelet_down_s:g} s", "kubelet back to registered")
    all_ids = uuids("workstation-4gpu")
    lost_at = 2.5 + scale.kubelet_down_s / 2
    node = node_file(new_dir(), "workstation-4gpu", [{"after_s": lost_at, "gpu": 3, "lost": True}])
    launched = time.monotonic()
    async with running("--simulate", node) as (kubelet, plugin):
        obs = kubelet.observer
        out.rss_start_kib = plugin.rss()
        await asyncio.sleep(max(0.0, launched + 2.0 - time.monotonic()))
        await kubelet.stop()
        down_since = time.monotonic()
        while time.monotonic() - down_since < scale.kubelet_down_s:
            await asyncio.sleep(0.5)
            if not out.check(plugin.process.poll() is None, "the plugin exited"):
                return out
        back = time.perf_counter()
        await kubelet.start()
        try:
            await obs.wait_for(
                lambda m: (
                    m.is_registered(GPU)
                    and m.unhealthy_devices(GPU) == {all_ids[3]}
                    and m.healthy_devices(GPU) == set(all_ids[:3])
                ),
                WAIT_S,
                "registered again with GPU 3 Unhealthy",
            )
            out.latencies.append(time.perf_counter() - back)
            out.iterations += 1
        except TimeoutError as exc:
            out.fail(str(exc))
        status, reason = await health_status(plugin.socket)
        out.check(status == "SERVING", f"health service {status}: {reason}")
        out.rss_end_kib = plugin.rss()
        out.check("Traceback" not in plugin.text(), "a traceback in the plugin's log")
    return out


async def gpu_lost_during_watch(scale: Scale) -> Outcome:
    """A GPU falls off the bus while many ListAndWatch streams are open: every stream sees it
    Unhealthy within 1 s of the monitor noticing, and pods admitted afterwards get healthy
    GPUs from GetPreferredAllocation and Allocate -- never an error."""
    out = Outcome(f"GPU lost, {scale.streams} streams", "loss noticed to each stream")
    node = node_file(new_dir(), "dgx-a100", [{"after_s": 4.0, "gpu": 5, "lost": True}])
    ids = uuids("dgx-a100")
    lost = (ids[5],)
    async with running("--simulate", node) as (kubelet, plugin):
        dm = kubelet.devices
        obs = kubelet.observer
        out.rss_start_kib = plugin.rss()
        watchers = Watchers(plugin.socket, scale.streams)
        try:
            if not await watchers.wait_all(lambda s: lost in s.distinct(), WAIT_S):
                out.fail("not every stream saw GPU 5 Unhealthy")
            line = await plugin.wait_log("gpu unhealthy")
            noticed = log_time(line)
            for number, seen in enumerate(watchers.seen):
                at = seen.first_time(lost)
                if at is None:
                    continue
                out.latencies.append(max(0.0, at - noticed))
                out.check(
                    at - noticed < 1.0, f"stream {number} saw the loss {at - noticed:.3f}s late"
                )
                out.check(seen.distinct() == [(), lost], f"stream {number}: {seen.distinct()}")
            await obs.wait_for(
                lambda m: m.unhealthy_devices(GPU) == set(lost), WAIT_S, "kubelet view"
            )
            out.check(
                distinct([s.unhealthy for s in obs.snapshots(GPU)]) == [(), lost],
                "the kubelet's states differ from the plugin's",
            )
        finally:
            await watchers.close()
        # Admission after the loss, as the kubelet does it: offer what is available (the lost
        # GPU is not), take the plugin's preference, allocate it.
        available = sorted(dm.available_devices(GPU))
        out.check(ids[5] not in available, "the kubelet still offers the lost GPU")
        for size in range(1, len(available) + 1):
            out.iterations += 1
            try:
                chosen = await dm.get_preferred_allocation(GPU, available, [], size)
                ok = chosen is not None and len(chosen) == size and set(chosen) <= set(available)
                if out.check(ok, f"size {size}: preferred {chosen} from {available}"):
                    assert chosen is not None
                    response = await dm.allocate(GPU, chosen)
                    env = dict(response.envs).get("NVIDIA_VISIBLE_DEVICES", "")
                    out.check(ids[5] not in env, f"size {size}: allocated the lost GPU: {env}")
            except DevicePluginError as exc:
                out.fail(f"size {size}: {exc}")
        # A kubelet that raced the update may still offer the lost GPU: still an answer.
        try:
            answer = await dm.get_preferred_allocation(GPU, ids, [], 2)
            out.check(answer is not None and len(answer) == 2, f"racing offer: {answer}")
        except DevicePluginError as exc:
            out.fail(f"racing offer: {exc}")
        out.rss_end_kib = plugin.rss()
    return out


async def event_wait_failures(scale: Scale) -> Outcome:
    """NVML's event wait fails twice: every GPU turns Unhealthy on every stream, the health
    service says NOT_SERVING, and both recover when the waits work again."""
    out = Outcome("event-wait failures", "all Unhealthy to recovered")
    node = node_file(
        new_dir(),
        "workstation-4gpu",
        [
            {"after_s": 3.5, "wait_error": True, "for_s": 0.6},
            {"after_s": 5.5, "wait_error": True, "for_s": 0.6},
        ],
    )
    every = tuple(uuids("workstation-4gpu"))
    expected = [(), every, (), every, ()]
    async with running("--simulate", node) as (kubelet, plugin):
        obs = kubelet.observer
        out.rss_start_kib = plugin.rss()
        watchers = Watchers(plugin.socket, max(2, scale.streams // 4))
        health = HealthWatch(plugin.socket)
        try:
            if not await watchers.wait_all(lambda s: s.distinct() == expected, WAIT_S):
                out.fail("not every stream went through healthy, all unhealthy (twice)")
            for number, seen in enumerate(watchers.seen):
                out.check(seen.distinct() == expected, f"stream {number}: {seen.distinct()}")
                times = [at for at, state in seen.states]
                states = [state for _, state in seen.states]
                for k in range(1, len(states)):
                    if states[k - 1] == every and states[k] == ():
                        out.latencies.append(times[k] - times[k - 1])
            await obs.wait_for(
                lambda _: distinct([s.unhealthy for s in obs.snapshots(GPU)]) == expected,
                WAIT_S,
                "the kubelet's states",
            )
            out.iterations = 2
            want = ["SERVING", "NOT_SERVING", "SERVING", "NOT_SERVING", "SERVING"]
            out.check(distinct(health.statuses) == want, f"health Watch saw {health.statuses}")
        except TimeoutError as exc:
            out.fail(str(exc))
        finally:
            await health.close()
            await watchers.close()
        out.rss_end_kib = plugin.rss()
    return out


async def sighup_during_traffic(scale: Scale) -> Outcome:
    """SIGHUP reloads (changed health rules and health-service setting) while the kubelet keeps
    asking for allocations: no request fails, the stream never ends, no re-registration."""
    out = Outcome("SIGHUP reload under traffic", "SIGHUP to applied")
    config = Path(new_dir()) / "config.yaml"
    config.write_text("version: v1\n")
    ids = uuids("dgx-a100")
    async with running("--simulate", "dgx-a100", "--config", str(config)) as (kubelet, plugin):
        dm = kubelet.devices
        obs = kubelet.observer
        endpoint = dm.primary(GPU)
        out.rss_start_kib = plugin.rss()
        stop = asyncio.Event()
        errors: list[str] = []
        calls = 0

        async def traffic() -> None:
            nonlocal calls
            rng = random.Random(7)
            while not stop.is_set():
                offered = sorted(rng.sample(ids, rng.randint(2, 8)))
                try:
                    chosen = await dm.get_preferred_allocation(GPU, offered, [], 2)
                    if chosen is None or len(chosen) != 2:
                        errors.append(f"preferred {chosen} from {offered}")
                        continue
                    await dm.allocate(GPU, chosen)
                except DevicePluginError as exc:
                    errors.append(str(exc))
                calls += 2

        task = asyncio.create_task(traffic())
        try:
            for n in range(scale.reloads):
                ignore = "[48]" if n % 2 == 0 else "[]"
                strict = "false" if n % 2 == 0 else "true"
                config.write_text(
                    f"version: v1\nnvplugin:\n  health:\n    xids: {{ignore: {ignore}}}\n"
                    f"  healthService: {{notServingWithoutHealthyGpus: {strict}}}\n"
                )
                started = time.perf_counter()
                plugin.send(signal.SIGHUP)
                applied = "config applied in place; still registered"
                if not await plugin.wait_count(applied, n + 1, WAIT_S):
                    out.fail(f"reload {n} not applied in place:\n{plugin.text()[-1500:]}")
                    continue
                out.latencies.append(time.perf_counter() - started)
                out.iterations += 1
                await asyncio.sleep(0.2)
        finally:
            stop.set()
            await task
        out.check(calls > 0, "no traffic ran")
        out.check(not errors, f"{len(errors)} of {calls} requests failed: {errors[:3]}")
        out.check(len(obs.registrations) == 1, f"{len(obs.registrations)} registrations")
        out.check(dm.primary(GPU) is endpoint, "the kubelet's endpoint changed (stream ended)")
        out.notes.append(f"{calls} requests during {scale.reloads} reloads")
        out.rss_end_kib = plugin.rss()
    return out


# --- load -------------------------------------------------------------------------------------


def _load_worker(
    socket_path: str,
    ids: list[str],
    policy_answers: dict[tuple[tuple[str, ...], int], list[str]],
    count: int,
    seed: int,
    latencies: list[float],
    failures: list[str],
) -> None:
    """``count`` mixed RPCs on one channel; each checked against what it should answer."""
    rng = random.Random(seed)
    status = health_pb2.HealthCheckResponse
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        plugin = api_pb2_grpc.DevicePluginStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        for n in range(count):
            kind = n % 10
            offered = tuple(sorted(rng.sample(ids, rng.randint(1, len(ids)))))
            size = rng.randint(1, len(offered))
            started = time.perf_counter()
            try:
                if kind < 4:
                    reply = plugin.GetPreferredAllocation(
                        api_pb2.PreferredAllocationRequest(
                            container_requests=[
                                api_pb2.ContainerPreferredAllocationRequest(
                                    available_deviceIDs=offered, allocation_size=size
                                )
                            ]
                        ),
                        timeout=30,
                    )
                    got = list(reply.container_responses[0].deviceIDs)
                    want = policy_answers[(offered, size)]
                    if got != want:
                        failures.append(f"preferred {got} != {want} for {offered}, {size}")
                elif kind < 7:
                    chosen = offered[:size]
                    reply = plugin.Allocate(
                        api_pb2.AllocateRequest(
                            container_requests=[
                                api_pb2.ContainerAllocateRequest(devices_ids=chosen)
                            ]
                        ),
                        timeout=30,
                    )
                    if len(reply.container_responses) != 1:
                        failures.append(f"allocate answered {len(reply.container_responses)}")
                elif kind == 7:
                    plugin.GetDevicePluginOptions(api_pb2.Empty(), timeout=30)
                elif kind == 8:
                    answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
                    if answer.status not in (status.SERVING, status.NOT_SERVING):
                        failures.append(f"health status {answer.status}")
                else:
                    try:
                        plugin.GetPreferredAllocation(
                            api_pb2.PreferredAllocationRequest(
                                container_requests=[
                                    api_pb2.ContainerPreferredAllocationRequest(
                                        available_deviceIDs=[*offered, "GPU-unknown"],
                                        allocation_size=1,
                                    )
                                ]
                            ),
                            timeout=30,
                        )
                        failures.append("an unknown device was accepted")
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                            raise
            except grpc.RpcError as exc:
                failures.append(f"kind {kind}: {exc.code().name}: {exc.details()}")
            latencies.append(time.perf_counter() - started)


async def load(scale: Scale) -> Outcome:
    """Many ListAndWatch streams plus mixed RPCs from several threads while GPUs fail and
    recover: every stream sees every change, every answer is right, RSS stays flat."""
    out = Outcome(
        f"load: {scale.streams} streams + {scale.rpcs} RPCs/{scale.threads} threads", "one RPC"
    )
    events = [
        {"after_s": 4.0, "gpu": 1, "xid": 48},
        {"after_s": 4.8, "gpu": 5, "lost": True},
        {"after_s": 5.6, "gpu": 5, "recover": True},
    ]
    node = node_file(new_dir(), "dgx-a100", events)
    config = Path(new_dir()) / "config.yaml"
    config.write_text("version: v1\nnvplugin:\n  health: {recovery: {quietPeriod: 400ms}}\n")
    ids = uuids("dgx-a100")
    expected = [(), (ids[1],), (), (ids[5],), ()]
    policy = make_policy("best-effort", load_topology("dgx-a100"))
    index = {uuid: i for i, uuid in enumerate(ids)}
    answers: dict[tuple[tuple[str, ...], int], list[str]] = {}

    def answer_for(offered: tuple[str, ...], size: int) -> list[str]:
        chosen = policy.allocate([index[u] for u in offered], [], size)
        return [ids[i] for i in sorted(chosen)]

    # Every (subset, size) a worker can draw: 255 subsets of 8 GPUs, sizes up to the subset's.
    for mask in range(1, 1 << len(ids)):
        offered = tuple(sorted(ids[i] for i in range(len(ids)) if mask >> i & 1))
        for size in range(1, len(offered) + 1):
            answers[(offered, size)] = answer_for(offered, size)

    async with running("--simulate", node, "--config", str(config)) as (kubelet, plugin):
        obs = kubelet.observer
        latencies: list[float] = []
        failures: list[str] = []
        # Warm-up: a few hundred RPCs and a round of streams, so that RSS "before" is measured
        # after the first-use allocations, not before them.
        await asyncio.to_thread(_load_worker, plugin.socket, ids, answers, 300, 99, [], failures)
        warm = Watchers(plugin.socket, scale.streams)
        await warm.wait_all(lambda s: len(s.states) > 0, WAIT_S)
        await warm.close()
        await asyncio.sleep(0.2)
        out.rss_start_kib = plugin.rss()
        watchers = Watchers(plugin.socket, scale.streams)
        per_thread = scale.rpcs // scale.threads
        threads = [
            threading.Thread(
                target=_load_worker,
                args=(plugin.socket, ids, answers, per_thread, seed, latencies, failures),
            )
            for seed in range(scale.threads)
        ]
        for thread in threads:
            thread.start()
        try:
            if not await watchers.wait_all(lambda s: s.distinct() == expected, WAIT_S):
                out.fail("not every stream went through every health change")
            for number, seen in enumerate(watchers.seen):
                out.check(seen.distinct() == expected, f"stream {number}: {seen.distinct()}")
                out.check(seen.ended is None, f"stream {number} ended: {seen.ended}")
            kubelet_states = distinct([s.unhealthy for s in obs.snapshots(GPU)])
            out.check(kubelet_states == expected, f"the kubelet saw {kubelet_states}")
        finally:
            for thread in threads:
                await asyncio.to_thread(thread.join)
            await watchers.close()
        for failure in failures:
            out.fail(failure)
        out.latencies = latencies
        out.iterations = len(latencies)
        await asyncio.sleep(0.2)
        out.rss_end_kib = plugin.rss()
        growth = out.rss_growth()
        out.check(
            growth is not None and growth <= 0.10,
            f"RSS grew {0 if growth is None else growth * 100:.1f}% "
            f"({out.rss_start_kib} -> {out.rss_end_kib} KiB)",
        )
    return out


# --- health storm -------------------------------------------------------------------------------

STORM_RATE = 80
"""Health changes a second in the storm: 40 Xids a second over 16 GPUs, each GPU recovering
(quiet 0.05 s) before its next Xid."""
STORM_START_S = 3.0
PROBE_TIMEOUT_S = 3.0  # the chart's probes' RPC timeout (values probes.rpcTimeoutSeconds)


async def health_storm(scale: Scale) -> Outcome:
    """GPUs fail and recover 80 times a second on a node advertising thousands of time-sliced
    replicas: the changes are coalesced (lists at least an interval apart, each stream gets at
    most one per list), the health service answers every check within the probes' timeout
    throughout, and every stream and the kubelet end on the final state, all healthy."""
    devices = 16 * scale.storm_replicas
    interval = publish_interval(devices)  # the rule checked here
    out = Outcome(
        f"health storm: {STORM_RATE} changes/s, {devices} devices, {scale.storm_s:g} s",
        "health Check",
    )
    xids = int(scale.storm_s * STORM_RATE / 2)
    spacing = 2 / STORM_RATE
    events = [
        {"after_s": round(STORM_START_S + k * spacing, 4), "gpu": k % 16, "xid": 48}
        for k in range(xids)
    ]
    node = node_file(new_dir(), "dgx-2", events)
    config = Path(new_dir()) / "config.yaml"
    config.write_text(
        "version: v1\nnvplugin: {health: {recovery: {quietPeriod: 50ms}}}\n"
        "sharing: {timeSlicing: {resources: "
        f"[{{name: nvidia.com/gpu, replicas: {scale.storm_replicas}}}]}}}}\n"
    )
    async with running("--simulate", node, "--config", str(config)) as (kubelet, plugin):
        obs = kubelet.observer
        await obs.wait_for(lambda m: len(m.devices(GPU)) == devices, 20, f"{devices} devices")
        await out.before(plugin.pid)
        watchers = CountingWatchers(plugin.socket, scale.storm_streams)
        stop = asyncio.Event()
        failures: list[str] = []

        async def checks() -> None:
            async with grpc.aio.insecure_channel(f"unix:{plugin.socket}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                while not stop.is_set():
                    started = time.perf_counter()
                    try:
                        await stub.Check(
                            health_pb2.HealthCheckRequest(service=""), timeout=PROBE_TIMEOUT_S
                        )
                        out.latencies.append(time.perf_counter() - started)
                    except grpc.aio.AioRpcError as exc:
                        failures.append(f"health Check: {exc.code().name}: {exc.details()}")
                    await asyncio.sleep(0.05)

        checking = asyncio.create_task(checks())
        try:
            # Every Xid delivered (the metrics count them), then the last recovery reaches all.
            async with asyncio.timeout(STORM_START_S + scale.storm_s * 3 + 30):
                while True:
                    samples = await plugin.metrics()
                    seen = sum(
                        v for (name, _), v in samples.items() if name == "nvplugin_xid_events_total"
                    )
                    if seen >= xids:
                        break
                    await asyncio.sleep(0.2)
            if not await watchers.wait_all(lambda s: s.unhealthy == 0, 20):
                out.fail("not every stream ended with every device healthy")
            await obs.wait_for(
                lambda m: len(m.healthy_devices(GPU)) == devices, 20, "the kubelet: all healthy"
            )
        except TimeoutError as exc:
            out.fail(f"the storm did not end: {exc!r}")
        finally:
            stop.set()
            await checking
            await watchers.close()
        for failure in failures:
            out.fail(failure)
        out.check(len(out.latencies) > 0, "no health check answered")
        changes = len(plugin.events("gpu unhealthy")) + len(plugin.events("gpu recovered"))
        lists = plugin.events("device health changed")
        out.iterations = changes
        times = [log_time(line) for line in lists]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        out.check(
            not gaps or min(gaps) >= interval - 0.002,
            f"two lists {min(gaps, default=0):.4f} s apart",
        )
        out.check(2 * len(lists) <= changes, f"{len(lists)} lists for {changes} changes")
        for number, counted in enumerate(watchers.seen):
            out.check(
                counted.messages <= len(lists) + 1,
                f"stream {number}: {counted.messages} messages for {len(lists)} lists",
            )
        out.notes.append(
            f"{changes} health changes -> {len(lists)} lists; "
            f"{len(out.latencies)} health checks answered during the storm"
        )
        await out.after(plugin.pid)
        out.check("Traceback" not in plugin.text(), "a traceback in the plugin's log")
    return out


# --- idle HTTP connections ----------------------------------------------------------------------


async def idle_connections(scale: Scale) -> Outcome:
    """N connections to each HTTP endpoint (metrics, health probes) that never send a request,
    or only half of one -- what any pod that reaches the port can do: the plugin's threads do
    not grow, its fds stay within the endpoints' caps, /metrics and the probes answer while the
    connections are held, and the plugin drops every one of them."""
    n = scale.idle_connections
    out = Outcome(f"idle HTTP connections: {n} x 2 endpoints", "scrape or probe while held")
    async with running("--simulate", "workstation-4gpu") as (kubelet, plugin):
        ports = [await plugin.metrics_port(), await plugin.probe_port()]
        await plugin.metrics()  # the first scrape's allocations are not a leak
        await kubelet.observer.wait_for(lambda m: m.is_registered(GPU), 10, "registered")
        await out.before(plugin.pid)
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for number in range(n):
                for port in ports:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    if number % 2:
                        writer.write(b"GET /metrics HTTP/1.1\r\n")  # ... and never the rest
                    held.append((reader, writer))
            out.iterations = len(held)
            for _ in range(10):
                started = time.perf_counter()
                samples = await plugin.metrics()
                out.latencies.append(time.perf_counter() - started)
                out.check(metric(samples, "nvplugin_health_serving", resource=GPU) == 1, "scrape")
                started = time.perf_counter()
                status, body = await plugin.probe("/readyz")
                out.latencies.append(time.perf_counter() - started)
                out.check(status == 200, f"/readyz answered {status}: {body}")
                status, body = await plugin.probe("/livez")
                out.check(status == 200, f"/livez answered {status}: {body}")
            threads = thread_count(plugin.pid)
            out.check(threads == out.threads_start, f"threads {out.threads_start} -> {threads}")
            fds = fd_count(plugin.pid)
            bound = (out.fds_start or 0) + 2 * MAX_CONNECTIONS + 2
            out.check(fds <= bound, f"{fds} fds held (at most {bound})")
            out.notes.append(f"{fds} fds and {threads} threads while {len(held)} were held")
            # Every held connection is dropped: closed for a newer one, or at the timeout.
            async with asyncio.timeout(REQUEST_TIMEOUT_S + 60):
                for reader, _ in held:
                    out.check(await dropped(reader), "a held connection got an answer")
        except TimeoutError:
            out.fail("the plugin did not drop every idle connection")
        finally:
            for _, writer in held:
                writer.close()
        await out.after(plugin.pid)
        out.check(
            (out.fds_end or 0) <= (out.fds_start or 0) + 2, f"fds {out.fds_start} -> {out.fds_end}"
        )
        out.check(out.threads_end == out.threads_start, "threads changed")
        out.check("Traceback" not in plugin.text(), "a traceback in the plugin's log")
    return out
