"""Bounded work per request: GetPreferredAllocation answers within its budget however slow the
policy is, stops when its client goes, never delays another request by more than a unit of each
other request; a request naming more containers than the bound is refused; a full executor turns
requests away instead of queueing them; an Allocate is built off the loop and refused when the
kubelet could not receive its reply.

Ordered by events, not timed: the fake policies and responders say when they run and wait for
the test's go-ahead.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

import grpc
import pytest
from structlog.testing import capture_logs

from nvplugin.api.v1beta1 import api_pb2
from nvplugin.nodesession import load_topology
from nvplugin.plugin.executor import RequestExecutor
from nvplugin.rm import MAX_CONTAINER_REQUESTS, Responder, make_responder
from nvplugin.rm.devices import Device
from tests.support.service import run, serving
from tests.support.waiting import WAIT_S, until

NODE = "dgx-h100"
FULL = MAX_CONTAINER_REQUESTS
T = TypeVar("T")


def containers(ids: Sequence[str], count: int, size: int) -> api_pb2.PreferredAllocationRequest:
    one = api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=size)
    return api_pb2.PreferredAllocationRequest(container_requests=[one] * count)


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


class _Stuck:
    """Answers ``answered`` calls (the lowest GPUs), then blocks every later call until
    ``release`` is set: a policy as slow as can be."""

    name = "stuck"

    def __init__(self, answered: int) -> None:
        self.answered = answered
        self.calls = 0
        self.stuck = threading.Event()
        self.release = threading.Event()

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        self.calls += 1
        if self.calls > self.answered:
            self.stuck.set()
            self.release.wait(WAIT_S)
        return sorted(available)[:size]


def test_a_full_preferred_request_answers_within_its_budget() -> None:
    """As many containers as a request may name, a policy that answers three and then never
    returns: the request is answered at its deadline all the same -- the answers reached, then
    no preference -- and the plugin logs it once."""

    async def body() -> None:
        policy = _Stuck(answered=3)
        with capture_logs() as logs:
            async with serving(load_topology(NODE), preferred_budget_s=0.5) as s:
                s.service._policy = policy  # a test's policy on the served resource
                ids = [s.uuid(i) for i in range(8)]
                try:
                    reply = await s.stub.GetPreferredAllocation(
                        containers(ids, FULL, 2), timeout=WAIT_S
                    )
                    assert policy.stuck.is_set() and not policy.release.is_set()
                finally:
                    policy.release.set()
        answers = [list(c.deviceIDs) for c in reply.container_responses]
        assert len(answers) == FULL
        given = [a for a in answers if a]
        assert given == [ids[:2]] * len(given) and len(given) <= 3
        assert answers[len(given) :] == [[]] * (FULL - len(given))
        (line,) = [e for e in logs if e["event"] == "GetPreferredAllocation out of time"]
        assert line["containers"] == FULL and line["answered"] == len(given)
        assert line["budget_s"] == 0.5

    run(body)


def test_more_containers_than_a_request_may_name_are_refused() -> None:
    """The kubelet names one container per call; beyond the bound, either RPC is refused with
    INVALID_ARGUMENT saying so, and nothing is worked out. At the bound, each is answered."""

    async def body() -> None:
        async with serving(load_topology(NODE)) as s:
            ids = [s.uuid(i) for i in range(8)]
            error = await rpc_error(
                s.stub.GetPreferredAllocation(containers(ids, FULL + 1, 2), timeout=WAIT_S)
            )
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.details() == (
                f"{FULL + 1} container requests in one GetPreferredAllocation; at most {FULL} "
                "are answered (the kubelet sends one per call)"
            )
            error = await rpc_error(s.stub.Allocate(allocate(ids, FULL + 1), timeout=WAIT_S))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"at most {FULL} are answered" in (error.details() or "")
            preferred = await s.stub.GetPreferredAllocation(
                containers(ids, FULL, 2), timeout=WAIT_S
            )
            assert len(preferred.container_responses) == FULL
            allocated = await s.stub.Allocate(allocate(ids[:2], FULL), timeout=WAIT_S)
            assert len(allocated.container_responses) == FULL

    run(body)


class _Counting:
    """Takes a permit from ``permits`` for each call (the test hands them out)."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.permits = threading.Semaphore(0)

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        self.calls += 1
        self.started.set()
        assert self.permits.acquire(timeout=WAIT_S), "the test never let the call go"
        return sorted(available)[:size]


class _Watched(RequestExecutor):
    """A request executor that says when a caller has stopped waiting (done, or cancelled)."""

    def __init__(self, workers: int = 1) -> None:
        super().__init__(workers=workers)
        self.left = asyncio.Event()

    async def run(self, unit: Any, *args: Any) -> Any:
        try:
            return await super().run(unit, *args)
        finally:
            self.left.set()


def test_preferred_stops_when_its_client_goes() -> None:
    async def body() -> None:
        policy = _Counting()
        executor = _Watched(workers=1)
        try:
            async with serving(
                load_topology(NODE), executor=executor, preferred_budget_s=WAIT_S
            ) as s:
                s.service._policy = policy
                ids = [s.uuid(i) for i in range(8)]
                call = s.stub.GetPreferredAllocation(containers(ids, FULL, 2))
                assert await asyncio.to_thread(policy.started.wait, WAIT_S)
                call.cancel()  # the client goes while the first container is in the policy
                with pytest.raises(asyncio.CancelledError):
                    await call
                await asyncio.wait_for(executor.left.wait(), WAIT_S)  # the server saw it go
                await until(lambda: executor.in_flight == 0, "the request to be dropped")
                for _ in range(FULL):
                    policy.permits.release()  # the call in progress ends ...
                # ... and no container after it is asked for: on the one thread, a unit of the
                # request that went would run before this one.
                s.service._policy = _Stuck(answered=1)
                reply = await s.stub.GetPreferredAllocation(containers(ids, 1, 1), timeout=WAIT_S)
                assert [list(c.deviceIDs) for c in reply.container_responses] == [ids[:1]]
                assert policy.calls == 1
        finally:
            for _ in range(FULL):
                policy.permits.release()
            executor.close()

    run(body)


class _GatedPairs:
    """Size 2 (the flood) waits for a permit per call; size 1 answers at once."""

    name = "gated-pairs"

    def __init__(self) -> None:
        self.pairs_started = 0
        self.pairs_answered = 0
        self.singles_answered = 0
        self.permits = threading.Semaphore(0)

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        if size == 2:
            self.pairs_started += 1
            assert self.permits.acquire(timeout=WAIT_S), "the test never let the call go"
            self.pairs_answered += 1
        else:
            self.singles_answered += 1
        return sorted(available)[:size]


async def _let_one_go(policy: _GatedPairs, answered: int) -> None:
    """Let the flood container in the policy go (the ``answered``-th); back once the thread has
    started its next unit (another flood container, or the one-container request's)."""
    policy.permits.release()
    await until(lambda: policy.pairs_answered == answered, "the flood container to be answered")
    await until(
        lambda: policy.singles_answered > 0 or policy.pairs_started > answered,
        "the next unit to start",
    )


def test_a_flood_of_preferred_requests_never_delays_another() -> None:
    """Three requests of as many containers as a request may name are in flight on one thread;
    a one-container request sent meanwhile waits for at most one container of each of them,
    and is answered before any of them is done: the requests take turns, a unit each."""

    async def body() -> None:
        policy = _GatedPairs()
        executor = RequestExecutor(workers=1)
        flood: list[asyncio.Future[Any]] = []
        try:
            async with serving(
                load_topology(NODE), executor=executor, preferred_budget_s=WAIT_S
            ) as s:
                s.service._policy = policy
                ids = [s.uuid(i) for i in range(8)]
                flood = [
                    asyncio.ensure_future(s.stub.GetPreferredAllocation(containers(ids, FULL, 2)))
                    for _ in range(3)
                ]
                await until(lambda: executor.in_flight == 3, "the flood to be under way")
                await until(lambda: policy.pairs_started == 1, "a flood container in the policy")
                single = asyncio.ensure_future(
                    s.stub.GetPreferredAllocation(containers(ids, 1, 1), timeout=WAIT_S)
                )
                await until(lambda: executor.in_flight == 4, "the one-container request queued")
                let_go = 0
                while policy.singles_answered == 0:
                    assert let_go < 3, "the one-container request waited for more than a turn"
                    let_go += 1
                    await _let_one_go(policy, let_go)
                reply = await single
                assert [list(c.deviceIDs) for c in reply.container_responses] == [ids[:1]]
                assert not any(call.done() for call in flood)
                assert policy.pairs_answered < 3 * FULL
        finally:
            for _ in range(3 * FULL):
                policy.permits.release()
            for call in flood:
                call.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
            executor.close()

    run(body)


def test_a_full_executor_turns_requests_away_at_once() -> None:
    """Every place taken (here: the one place, by a request stuck in its policy): a
    GetPreferredAllocation is answered at once with no preference (the kubelet chooses), an
    Allocate refused with RESOURCE_EXHAUSTED; nothing is queued. The place freed, both work."""

    async def body() -> None:
        policy = _Stuck(answered=0)
        executor = RequestExecutor(workers=1, capacity=1)
        try:
            async with serving(
                load_topology(NODE), executor=executor, preferred_budget_s=WAIT_S
            ) as s:
                s.service._policy = policy
                ids = [s.uuid(i) for i in range(8)]
                held = asyncio.ensure_future(
                    s.stub.GetPreferredAllocation(containers(ids, 1, 2), timeout=WAIT_S)
                )
                assert await asyncio.to_thread(policy.stuck.wait, WAIT_S)
                reply = await s.stub.GetPreferredAllocation(containers(ids, 2, 2), timeout=WAIT_S)
                assert [list(c.deviceIDs) for c in reply.container_responses] == [[], []]
                error = await rpc_error(s.stub.Allocate(allocate(ids[:1], 1), timeout=WAIT_S))
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "the plugin is busy" in (error.details() or "")
                assert policy.calls == 1
                policy.release.set()
                assert [list(c.deviceIDs) for c in (await held).container_responses] == [ids[:2]]
                allocated = await s.stub.Allocate(allocate(ids[:1], 1), timeout=WAIT_S)
                assert len(allocated.container_responses) == 1
        finally:
            policy.release.set()
            executor.close()

    run(body)


def test_requests_in_flight_end_when_the_service_closes() -> None:
    """Shutdown does not wait for a request whose policy call never returns: its client is
    told the plugin is stopping."""

    async def body() -> None:
        policy = _Stuck(answered=0)
        async with serving(load_topology(NODE), preferred_budget_s=WAIT_S) as s:
            s.service._policy = policy
            ids = [s.uuid(i) for i in range(8)]
            call = asyncio.ensure_future(s.stub.GetPreferredAllocation(containers(ids, 2, 2)))
            try:
                assert await asyncio.to_thread(policy.stuck.wait, WAIT_S)
                s.service.close()
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "stopping" in (caught.value.details() or "")
            finally:
                policy.release.set()

    run(body)


# --- Allocate ---------------------------------------------------------------------------------


def allocate(ids: Sequence[str], count: int) -> api_pb2.AllocateRequest:
    one = api_pb2.ContainerAllocateRequest(devices_ids=ids)
    return api_pb2.AllocateRequest(container_requests=[one] * count)


class _Fat:
    """A responder whose every container response carries 1 MiB more: a reply of a few
    containers outgrows what the kubelet receives (real responses get there only with very long
    paths, see docs/kubelet-behaviour.md#requests-per-call)."""

    def __init__(self) -> None:
        self._responder = make_responder(("envvar", "cdi-annotations"), pass_device_specs=True)

    def fill(self, devices: Sequence[Device], response: api_pb2.ContainerAllocateResponse) -> None:
        self._responder.fill(devices, response)
        response.envs["PADDING"] = "x" * (1024 * 1024)


def test_an_allocate_reply_the_kubelet_could_not_receive_is_refused() -> None:
    """Containers whose responses add up to more than the kubelet's gRPC client receives
    (4 MiB at most): the reply is refused here, saying why, instead of failing on the kubelet's
    side with a transport error that says nothing."""

    async def body() -> None:
        async with serving(load_topology("dgx-2"), responder=_Fat()) as s:
            ids = [s.uuid(i) for i in range(16)]
            error = await rpc_error(s.stub.Allocate(allocate(ids, FULL), timeout=WAIT_S))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = error.details() or ""
            assert "larger than 4194304 bytes" in details, details
            assert "the kubelet's gRPC client" in details
            # What fits is answered, every container in order.
            reply = await s.stub.Allocate(allocate(ids, 3), timeout=WAIT_S)
            assert len(reply.container_responses) == 3

    run(body)


class _Holding:
    """A responder that, at its first container, waits until the test says the other RPCs
    answered (``go``): on the loop, it would wait for ever."""

    def __init__(self) -> None:
        self._responder = Responder()
        self.started = threading.Event()
        self.go = threading.Event()

    def fill(self, devices: Sequence[Device], response: api_pb2.ContainerAllocateResponse) -> None:
        if not self.started.is_set():
            self.started.set()
            assert self.go.wait(WAIT_S), "the other RPCs never answered"
        self._responder.fill(devices, response)


def test_other_rpcs_answer_while_an_allocate_is_built() -> None:
    async def body() -> None:
        responder = _Holding()
        async with serving(load_topology(NODE), responder=responder) as s:
            ids = [s.uuid(i) for i in range(8)]
            call = asyncio.ensure_future(s.stub.Allocate(allocate(ids, FULL), timeout=WAIT_S))
            assert await asyncio.to_thread(responder.started.wait, WAIT_S)
            options = await s.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=WAIT_S)
            assert options.get_preferred_allocation_available
            stream = s.stub.ListAndWatch(api_pb2.Empty(), timeout=WAIT_S)
            assert [d.ID for d in (await stream.read()).devices] == ids
            stream.cancel()
            assert not call.done()
            responder.go.set()
            reply = await call
            assert len(reply.container_responses) == FULL

    run(body)
