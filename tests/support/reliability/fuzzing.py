"""Hostile and random requests over real gRPC: GetPreferredAllocation and Allocate with unknown,
duplicate, empty and huge ID lists, odd unicode, NULs, very long IDs, negative and huge sizes and
many container requests.

The oracle is exact. A request is valid when it names no more containers than one request may,
every ID is one of the node's, no list repeats an ID, every must-include ID is offered and no
size is negative; then the answer must be what the allocator itself says (GetPreferredAllocation)
or one response per container naming exactly its GPUs (Allocate). Anything else must be
INVALID_ARGUMENT with a short message -- or, for a request over gRPC's 4 MiB message limit,
RESOURCE_EXHAUSTED before the plugin sees it. Afterwards the plugin must still be up, with the
same file descriptors and a bounded RSS.

Why RSS gets a 25% bound here and not the load test's 10%: the hostile requests are several MB
each, handled on gRPC's threads, and glibc gives each thread its own malloc arena; RSS then saws
up and down by ~20% from round to round without growing (with MALLOC_ARENA_MAX=1 it stays within
78-97 MiB over 30 rounds). The bound is against the highest of two warm-up rounds, and still
catches a leak of the big requests (tens of MB).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvplugin.allocator import Policy, make_policy
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.nodesession import load_topology
from nvplugin.rm import MAX_CONTAINER_REQUESTS
from tests.support.harness import Outcome, Plugin, fd_count, settled_fds
from tests.support.serve import new_dir

NODE = "dgx-a100"
MAX_MESSAGE = 4 * 1024 * 1024
"""gRPC's default receive limit: bigger requests are refused by the transport."""
RSS_BOUND = 0.25
MAX_DETAILS = 1024
"""An INVALID_ARGUMENT message must stay short, whatever the request held."""

ODD = [
    "",
    "\x00",
    "GPU-\x00",
    "\u202egpu\u202c",  # right-to-left override
    "e\u0301",  # combining accent
    "\U0001f525" * 5,  # emoji (4-byte UTF-8)
    "\ufeff",  # BOM
    "\uffff",  # a noncharacter
    " ",
    "GPU-" + "f" * 36,
]


@dataclass(frozen=True)
class Container:
    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


class Oracle:
    """What the plugin must answer, from the same allocator the plugin uses."""

    def __init__(self) -> None:
        topology = load_topology(NODE)
        self.ids = [gpu.uuid for gpu in topology.gpus]
        self.index = {uuid: i for i, uuid in enumerate(self.ids)}
        self.policy: Policy = make_policy("best-effort", topology)

    def valid_list(self, ids: Sequence[str]) -> bool:
        return all(i in self.index for i in ids) and len(set(ids)) == len(ids)

    def preferred(self, containers: Sequence[Container]) -> list[list[str]] | None:
        """The answer per container, or None when the request must be refused (a bad list, or
        more containers than one request may name)."""
        if len(containers) > MAX_CONTAINER_REQUESTS:
            return None
        out = []
        for c in containers:
            if not (self.valid_list(c.available) and self.valid_list(c.must_include)):
                return None
            if not set(c.must_include) <= set(c.available) or c.size < 0:
                return None
            chosen = self.policy.allocate(
                [self.index[i] for i in c.available],
                [self.index[i] for i in c.must_include],
                c.size,
            )
            out.append([self.ids[i] for i in sorted(chosen)])
        return out

    def allocate(self, containers: Sequence[Sequence[str]]) -> list[list[str]] | None:
        if len(containers) > MAX_CONTAINER_REQUESTS:
            return None
        if not all(self.valid_list(ids) for ids in containers):
            return None
        return [sorted(ids, key=self.index.__getitem__) for ids in containers]


def _strategies(oracle: Oracle) -> tuple[st.SearchStrategy[str], st.SearchStrategy[int]]:
    ids = st.one_of(
        st.sampled_from(oracle.ids),
        st.sampled_from(ODD),
        st.text(max_size=40),
        st.text(alphabet=st.characters(codec="utf-8"), min_size=200, max_size=3000),
    )
    sizes = st.one_of(
        st.integers(min_value=-3, max_value=10),
        st.integers(min_value=-(2**31), max_value=2**31 - 1),
    )
    return ids, sizes


def hostile_preferred(oracle: Oracle) -> list[list[Container]]:
    """Fixed worst cases, besides what hypothesis draws."""
    ids = oracle.ids
    huge = tuple(f"x{n}" for n in range(100_000))
    return [
        [],
        [Container((), (), 0)],
        [Container(tuple(ids), (), 2**31 - 1)],
        [Container(tuple(ids), (), -(2**31))],
        [Container(huge, (), 4)],  # 10^5 unknown IDs
        [Container(tuple(ids) * 12_500, (), 4)],  # 10^5 IDs, all duplicates
        [Container((*ids, "G" * 1_000_000), (), 4)],  # a 1 MB ID
        [Container(tuple(ids), (ids[0],) * 3, 2)],
        [Container(tuple(ids[:4]), (ids[7],), 2)],
        [Container(tuple(ids), (), 3)] * 5_000,  # many container requests
        [Container(tuple(ids), (), 3)] * MAX_CONTAINER_REQUESTS,  # as many as one may name
        [Container(tuple(ids), (), 3), Container(("\x00",), (), 1)],
    ]


def hostile_allocate(oracle: Oracle) -> list[list[tuple[str, ...]]]:
    ids = tuple(oracle.ids)
    return [
        [],
        [()],
        [ids] * 5_000,
        [ids] * MAX_CONTAINER_REQUESTS,
        [tuple(f"x{n}" for n in range(100_000))],
        [ids * 12_500],
        [(*ids, "G" * 1_000_000)],
        [ids, ids[:1] * 2],
        [("\U0001f525\x00",)],
    ]


def _preferred_request(containers: Sequence[Container]) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=c.available,
                must_include_deviceIDs=c.must_include,
                allocation_size=c.size,
            )
            for c in containers
        ]
    )


def _allocate_request(containers: Sequence[Sequence[str]]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
    )


def _describe(containers: Sequence[object]) -> str:
    text = repr(containers)
    return text if len(text) < 300 else f"{text[:300]}... ({len(containers)} containers)"


class Checker:
    """Sends requests on one channel and records every wrong answer in ``out``."""

    def __init__(self, socket_path: str, oracle: Oracle, out: Outcome) -> None:
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        self.channel = grpc.insecure_channel(f"unix:{socket_path}", options=options)
        self.stub = api_pb2_grpc.DevicePluginStub(self.channel)
        self.oracle = oracle
        self.out = out

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: str, request: object) -> tuple[object | None, grpc.StatusCode, str]:
        started = time.perf_counter()
        try:
            reply = getattr(self.stub, method)(request, timeout=60)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            reply = None
            code, details = exc.code(), exc.details() or ""
        self.out.latencies.append(time.perf_counter() - started)
        self.out.iterations += 1
        return reply, code, details

    def _refused(
        self, what: str, size: int, code: grpc.StatusCode, details: str, containers: object
    ) -> None:
        if size > MAX_MESSAGE and code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return
        self.out.check(
            code == grpc.StatusCode.INVALID_ARGUMENT,
            f"{what}: {code.name} ({details[:200]}) for {_describe(containers)}",  # type: ignore[arg-type]
        )
        self.out.check(len(details) <= MAX_DETAILS, f"{what}: a {len(details)}-char message")

    def preferred(self, containers: Sequence[Container]) -> None:
        request = _preferred_request(containers)
        reply, code, details = self._call("GetPreferredAllocation", request)
        want = self.oracle.preferred(containers)
        if want is None or request.ByteSize() > MAX_MESSAGE:
            self._refused("preferred", request.ByteSize(), code, details, containers)
            return
        if not self.out.check(code == grpc.StatusCode.OK, f"preferred: {code.name} {details}"):
            return
        assert isinstance(reply, api_pb2.PreferredAllocationResponse)
        got = [list(r.deviceIDs) for r in reply.container_responses]
        self.out.check(
            got == want, f"preferred {got[:3]} != {want[:3]} for {_describe(containers)}"
        )

    def allocate(self, containers: Sequence[Sequence[str]]) -> None:
        request = _allocate_request(containers)
        reply, code, details = self._call("Allocate", request)
        want = self.oracle.allocate(containers)
        if want is None or request.ByteSize() > MAX_MESSAGE:
            self._refused("allocate", request.ByteSize(), code, details, containers)
            return
        if not self.out.check(code == grpc.StatusCode.OK, f"allocate: {code.name} {details}"):
            return
        assert isinstance(reply, api_pb2.AllocateResponse)
        if not self.out.check(
            len(reply.container_responses) == len(want),
            f"allocate: {len(reply.container_responses)} responses for {len(want)} containers",
        ):
            return
        for response, ids in zip(reply.container_responses, want, strict=True):
            env = dict(response.envs).get("NVIDIA_VISIBLE_DEVICES")
            if ids and env is not None:
                self.out.check(env == ",".join(ids), f"allocate: {env!r} for {ids}")


def fuzz(examples: int) -> Outcome:
    """The fixed hostile cases twice (the first round warms up), then ``examples`` drawn by
    hypothesis for each RPC; then the plugin must be alive with flat RSS and fds."""
    out = Outcome("fuzz: hostile + random requests", "one RPC")
    oracle = Oracle()
    plugin = Plugin(new_dir(), "--simulate", NODE)
    checker = Checker(plugin.socket, oracle, out)
    try:
        asyncio.run(plugin.wait_log("allocation policy ready"))

        def hostile_round() -> int:
            for containers in hostile_preferred(oracle):
                checker.preferred(containers)
            for allocs in hostile_allocate(oracle):
                checker.allocate(allocs)
            return plugin.rss()

        out.rss_start_kib = max(hostile_round(), hostile_round())
        fds_start = asyncio.run(settled_fds(plugin.pid))

        ids, sizes = _strategies(oracle)
        id_lists = st.lists(ids, max_size=24)
        container = st.builds(Container, id_lists.map(tuple), id_lists.map(tuple), sizes)
        # Mostly-valid requests too, so the valid path is exercised, not just refusals.
        valid_ids = st.lists(st.sampled_from(oracle.ids), unique=True, max_size=8)
        valid_container = st.builds(
            lambda a, n, s: Container(tuple(a), tuple(a[:n]), s),
            valid_ids,
            st.integers(0, 8),
            st.integers(0, 9),
        )
        tuned = settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
        )

        @tuned
        @given(st.lists(st.one_of(container, valid_container), max_size=6))
        def preferred(containers: list[Container]) -> None:
            checker.preferred(containers)

        @tuned
        @given(st.lists(st.one_of(id_lists, valid_ids).map(tuple), max_size=6))
        def allocate(containers: list[tuple[str, ...]]) -> None:
            checker.allocate(containers)

        preferred()
        allocate()
        out.check(plugin.process.poll() is None, "the plugin exited")
        out.rss_end_kib = hostile_round()
        fds_end = min(fd_count(plugin.pid) for _ in range(5))
        out.check(fds_end <= fds_start + 2, f"fds grew from {fds_start} to {fds_end}")
        growth = out.rss_growth()
        out.check(
            growth is not None and growth <= RSS_BOUND,
            f"RSS grew {0 if growth is None else growth * 100:.1f}% "
            f"({out.rss_start_kib} -> {out.rss_end_kib} KiB)",
        )
    finally:
        checker.close()
        code = plugin.stop()
        out.check(code == 0, f"the plugin exited {code} on SIGTERM")
        out.check("Traceback" not in plugin.text(), "a traceback in the plugin's log")
    return out
