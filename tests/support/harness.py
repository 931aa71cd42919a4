"""Shared machinery of the reliability suite and ``make soak``: outcomes, process figures,
ListAndWatch and health watchers, a plugin subprocess with its metrics.

A scenario never stops at its first problem: it records each one in its :class:`Outcome` and goes
on, so the soak table can count failures; the tests then assert that there were none and show
the first few.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.fakekubelet.kubelet import FakeKubelet
from tests.support.serve import Serve, new_dir
from tests.support.waiting import WAIT_S

GPU = "nvidia.com/gpu"
SOCKET = "nvplugin-gpu.sock"
SHM = "/dev/shm"


# --- outcomes ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one scenario did: iterations, the problems seen, latencies (s) and the plugin's RSS."""

    scenario: str
    measure: str = ""  # what a latency is, for the table
    iterations: int = 0
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    rss_start_kib: int | None = None
    rss_end_kib: int | None = None
    notes: list[str] = field(default_factory=list)
    fds_start: int | None = None
    fds_end: int | None = None
    threads_start: int | None = None
    threads_end: int | None = None

    async def before(self, pid: int) -> None:
        """The plugin's RSS, open fds and threads before the attack."""
        self.rss_start_kib = rss_kib(pid)
        self.fds_start = await settled_fds(pid)
        self.threads_start = thread_count(pid)

    async def after(self, pid: int) -> None:
        """The same figures after it."""
        self.rss_end_kib = rss_kib(pid)
        self.fds_end = await settled_fds(pid)
        self.threads_end = thread_count(pid)

    def fail(self, message: str) -> None:
        self.failures.append(message)

    def check(self, condition: bool, message: str) -> bool:
        if not condition:
            self.fail(message)
        return condition

    def percentile(self, q: float) -> float | None:
        return percentile(self.latencies, q)

    def assert_ok(self) -> None:
        if self.failures:
            shown = "\n".join(f"- {f[:2000]}" for f in self.failures[:10])
            more = len(self.failures) - 10
            raise AssertionError(
                f"{self.scenario}: {len(self.failures)} failure(s) in {self.iterations} "
                f"iterations:\n{shown}" + (f"\n... and {more} more" if more > 0 else "")
            )

    def rss_growth(self) -> float | None:
        if not self.rss_start_kib or self.rss_end_kib is None:
            return None
        return self.rss_end_kib / self.rss_start_kib - 1.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def format_table(outcomes: Sequence[Outcome]) -> str:
    """The soak table (Markdown): scenario, iterations, failures, p50/p99/max (the worst case),
    and the plugin's RSS, open fds and threads before and after (``-`` where a scenario does not
    measure them)."""

    def ms(value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value * 1000:.2f}" if value < 0.1 else f"{value * 1000:.0f}"

    def mib(kib: int | None) -> str:
        return "-" if kib is None else f"{kib / 1024:.1f}"

    def pair(start: int | None, end: int | None) -> str:
        return "-" if start is None and end is None else f"{start} -> {end}"

    header = (
        "| scenario | iterations | failures | p50 ms | p99 ms | max ms | latency measured | "
        "RSS start MiB | RSS end MiB | fds | threads |"
    )
    rows = [header, "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for o in outcomes:
        rows.append(
            f"| {o.scenario} | {o.iterations} | {len(o.failures)} | {ms(o.percentile(50))} | "
            f"{ms(o.percentile(99))} | {ms(o.percentile(100))} | {o.measure} | "
            f"{mib(o.rss_start_kib)} | "
            f"{mib(o.rss_end_kib)} | {pair(o.fds_start, o.fds_end)} | "
            f"{pair(o.threads_start, o.threads_end)} |"
        )
    return "\n".join(rows)


# --- process figures --------------------------------------------------------------------------


def status_field(pid: int, name: str) -> str:
    """The first word of field ``name`` in /proc/PID/status (``VmRSS``, ``Threads``, ...)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{name}:"):
                return line.split()[1]
    raise AssertionError(f"no {name} for pid {pid}")


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB."""
    return int(status_field(pid, "VmRSS"))


def thread_count(pid: int) -> int:
    return int(status_field(pid, "Threads"))


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def settled_fds(pid: int, samples: int = 5, interval: float = 0.02) -> int:
    """The fewest open fds over a few samples (connections mid-handshake come and go)."""
    counts = []
    for _ in range(samples):
        counts.append(fd_count(pid))
        await asyncio.sleep(interval)
    return min(counts)


def caught_signals(pid: int) -> set[signal.Signals]:
    """The signals ``pid`` has a handler for (SigCgt)."""
    mask = int(status_field(pid, "SigCgt"), 16)
    return {sig for sig in signal.Signals if mask >> (sig - 1) & 1}


def sysfs_trees(pid: int | None = None) -> set[str]:
    """Names of simulated sysfs trees in /dev/shm (of ``pid`` only, when given)."""
    prefix = "nvplugin-sysfs-" if pid is None else f"nvplugin-sysfs-{pid}-"
    try:
        return {name for name in os.listdir(SHM) if name.startswith(prefix)}
    except FileNotFoundError:
        return set()


# --- the plugin -------------------------------------------------------------------------------


class Plugin(Serve):
    """``nvplugin serve`` with metrics and health probes on 127.0.0.1 (free ports the OS
    picks)."""

    def __init__(self, directory: str, *args: str) -> None:
        addresses = ("--metrics-address", "127.0.0.1:0", "--health-probe-address", "127.0.0.1:0")
        super().__init__(directory, *addresses, *args)
        self.socket = os.path.join(directory, SOCKET)
        self._port: int | None = None
        self._probe_port: int | None = None

    async def metrics_port(self) -> int:
        if self._port is None:
            line = await self.wait_log("serving metrics")
            self._port = int(line["port"])
        return self._port

    async def probe_port(self) -> int:
        if self._probe_port is None:
            line = await self.wait_log("serving health probes", 20)
            self._probe_port = int(line["port"])
        return self._probe_port

    async def probe(self, path: str) -> tuple[int, str]:
        """GET ``path`` (/livez, /readyz) as the kubelet's httpGet probe does: status, body."""
        return await http_get(await self.probe_port(), path)

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample: (name, sorted labels) -> value."""
        port = await self.metrics_port()

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as r:
                text: str = r.read().decode()
                return text

        text = await asyncio.to_thread(scrape)
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def rss(self) -> int:
        return rss_kib(self.pid)

    async def wait_count(self, name: str, count: int, timeout: float) -> bool:
        """Wait until the log has ``count`` lines ``name``; False on timeout or exit."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.events(name)) >= count:
                return True
            if self.process.poll() is not None:
                return False
            await asyncio.sleep(0.02)
        return False


async def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    """GET http://127.0.0.1:PORT/PATH: status and body (any status, 4xx/5xx included)."""

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    return await asyncio.to_thread(get)


async def dropped(reader: asyncio.StreamReader) -> bool:
    """Wait until the server ends the connection: True when it ends without an answer (closed
    or reset), False when an answer came."""
    try:
        return await reader.read() == b""
    except ConnectionResetError:
        return True


def metric(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """One sample's value (0 when absent)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@contextlib.asynccontextmanager
async def running(*args: str, timeout: float = 20.0) -> AsyncIterator[tuple[FakeKubelet, Plugin]]:
    """A fake kubelet and a registered plugin (``nvplugin serve ARGS``); stops both after."""
    directory = new_dir()
    async with FakeKubelet(directory) as kubelet:
        plugin = Plugin(directory, *args)
        try:
            await kubelet.wait_registered(GPU, timeout=timeout)
            yield kubelet, plugin
        finally:
            plugin.stop()


async def health_status(socket_path: str, timeout: float = 5.0) -> tuple[str, str]:
    """The plugin's grpc.health.v1 status name and reason."""
    async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
        call = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout
        )
        answer = await call
        reason = ""
        for key, value in await call.trailing_metadata() or ():
            if key == "nvplugin-reason":
                reason = str(value)
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    return str(name), reason


# --- watchers ---------------------------------------------------------------------------------


@dataclass
class Seen:
    """One stream's messages: (time.time() received, unhealthy device IDs)."""

    states: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    ended: str | None = None

    def distinct(self) -> list[tuple[str, ...]]:
        return distinct([state for _, state in self.states])

    def first_time(self, state: tuple[str, ...]) -> float | None:
        for at, seen in self.states:
            if seen == state:
                return at
        return None


def distinct(states: Sequence[Any]) -> list[Any]:
    """Consecutive duplicates removed: the sequence of states a client went through."""
    out: list[Any] = []
    for state in states:
        if not out or out[-1] != state:
            out.append(state)
    return out


UNHEALTHY_FIELD = b"\x12\x09Unhealthy"
"""A Device's ``health: "Unhealthy"`` as serialized (field 2, length 9)."""


@dataclass
class Counted:
    """One raw stream's messages: how many, and the Unhealthy devices in the last one."""

    messages: int = 0
    unhealthy: int | None = None


class Watchers:
    """``count`` plain ListAndWatch clients on ``socket_path``, each on its own channel; what
    each saw is a ``record`` (:class:`Seen`)."""

    record: Any = Seen

    def __init__(self, socket_path: str, count: int) -> None:
        self.channels = [grpc.aio.insecure_channel(f"unix:{socket_path}") for _ in range(count)]
        self.seen = [self.record() for _ in range(count)]
        self._tasks = [
            asyncio.create_task(self._read(channel, seen))
            for channel, seen in zip(self.channels, self.seen, strict=True)
        ]

    @staticmethod
    async def _read(channel: grpc.aio.Channel, seen: Seen) -> None:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:
            async for message in stub.ListAndWatch(api_pb2.Empty()):
                unhealthy = tuple(d.ID for d in message.devices if d.health != "Healthy")
                seen.states.append((time.time(), unhealthy))
            seen.ended = "OK"
        except grpc.aio.AioRpcError as exc:
            seen.ended = exc.code().name

    async def wait_all(self, predicate: Any, timeout: float) -> bool:
        """Wait until ``predicate(seen)`` holds for every stream; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(predicate(seen) for seen in self.seen):
                return True
            await asyncio.sleep(0.02)
        return all(predicate(seen) for seen in self.seen)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self.channels:
            await channel.close()


class CountingWatchers(Watchers):
    """Like :class:`Watchers`, but the clients do not parse what they get: each message's
    Unhealthy devices are counted in its bytes (:class:`Counted`). For lists of thousands of
    devices, which parsed in Python would make the test, not the plugin, the bottleneck."""

    record = Counted

    @staticmethod
    async def _read(channel: grpc.aio.Channel, seen: Any) -> None:
        stream = channel.unary_stream(
            "/v1beta1.DevicePlugin/ListAndWatch",
            request_serializer=api_pb2.Empty.SerializeToString,
        )
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for data in stream(api_pb2.Empty()):
                seen.messages += 1
                seen.unhealthy = bytes(data).count(UNHEALTHY_FIELD)


class HealthWatch:
    """A grpc.health.v1 Watch stream: the statuses it went through."""

    def __init__(self, socket_path: str) -> None:
        self.channel = grpc.aio.insecure_channel(f"unix:{socket_path}")
        self.statuses: list[str] = []
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        stub = health_pb2_grpc.HealthStub(self.channel)
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for answer in stub.Watch(health_pb2.HealthCheckRequest(service="")):
                name = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
                self.statuses.append(str(name))

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.channel.close()


def log_time(line: dict[str, Any]) -> float:
    """A JSON log line's timestamp as time.time() seconds."""
    from datetime import datetime

    return datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()
