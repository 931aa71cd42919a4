"""Bounded work per request: GetPreferredAllocation answers within its budget however many
containers it names and however slow the policy is, stops when its client goes, never delays
another request; a many-container Allocate is built off the loop and refused when the kubelet
could not receive its reply.

Ordered by events, not timed: the fake policies and responders say when they run and wait for
the test's go-ahead; "slow" policies take a few milliseconds per call, as a search does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import grpc
import pytest

from nvplugin.api.v1beta1 import api_pb2
from nvplugin.nodesession import load_topology
from nvplugin.plugin.work import Job, RequestWorkers
from nvplugin.rm import Responder, make_responder
from nvplugin.rm.devices import Device
from tests.support.service import run, serving
from tests.support.waiting import WAIT_S, until

NODE = "dgx-h100"


def containers(ids: Sequence[str], count: int, size: int) -> api_pb2.PreferredAllocationRequest:
    one = api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=size)
    return api_pb2.PreferredAllocationRequest(container_requests=[one] * count)


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


def test_preferred_with_hundreds_of_containers_answers_within_its_budget() -> None:
    """300 containers, a policy that answers three and then never returns: the request is
    answered at its deadline all the same -- the three answers, then no preference."""

    async def body() -> None:
        policy = _Stuck(answered=3)
        async with serving(load_topology(NODE), preferred_budget_s=0.5) as s:
            s.service._policy = policy  # a test's policy on the served resource
            ids = [s.uuid(i) for i in range(8)]
            try:
                reply = await s.stub.GetPreferredAllocation(containers(ids, 300, 2), timeout=WAIT_S)
                assert policy.stuck.is_set() and not policy.release.is_set()
                answers = [list(c.deviceIDs) for c in reply.container_responses]
                assert len(answers) == 300
                given = [a for a in answers if a]
                assert given == [ids[:2]] * len(given) and len(given) <= 3
                assert answers[len(given) :] == [[]] * (300 - len(given))
            finally:
                policy.release.set()

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


class _Watched(RequestWorkers):
    """Request workers that say when a caller has stopped waiting (done, or cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.left = asyncio.Event()

    async def run(self, job: Job, deadline: float | None = None) -> bool:
        try:
            return await super().run(job, deadline)
        finally:
            self.left.set()


def test_preferred_stops_when_its_client_goes() -> None:
    async def body() -> None:
        policy = _Counting()
        workers = _Watched()
        try:
            async with serving(
                load_topology(NODE), workers=workers, preferred_budget_s=WAIT_S
            ) as s:
                s.service._policy = policy
                ids = [s.uuid(i) for i in range(8)]
                call = s.stub.GetPreferredAllocation(containers(ids, 200, 2))
                assert await asyncio.to_thread(policy.started.wait, WAIT_S)
                call.cancel()  # the client goes while the first container is in the policy
                with pytest.raises(asyncio.CancelledError):
                    await call
                await asyncio.wait_for(workers.left.wait(), WAIT_S)  # the server saw it go
                policy.permits.release()  # the call in progress ends ...
                await until(lambda: workers.in_flight == 0, "the request to be dropped")
                assert policy.calls == 1  # ... and no container after it is asked for
        finally:
            for _ in range(200):
                policy.permits.release()
            workers.close()

    run(body)


class _SlowForPairs:
    """Size 2 takes a few milliseconds a call (a search's worth); size 1 answers at once."""

    name = "slow-for-pairs"

    def __init__(self) -> None:
        self.pairs_answered = 0

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        if size == 2:
            time.sleep(0.005)
            self.pairs_answered += 1
        return sorted(available)[:size]


def test_a_flood_of_preferred_requests_never_delays_another() -> None:
    """Eight requests of 600 containers each (seconds of policy work) are in flight; a
    one-container request is answered before any of them is done: the workers take turns."""

    async def body() -> None:
        policy = _SlowForPairs()
        async with serving(load_topology(NODE), preferred_budget_s=WAIT_S) as s:
            s.service._policy = policy
            ids = [s.uuid(i) for i in range(8)]
            flood = [
                asyncio.ensure_future(s.stub.GetPreferredAllocation(containers(ids, 600, 2)))
                for _ in range(8)
            ]
            try:
                await until(lambda: policy.pairs_answered >= 8, "the flood to be under way")
                reply = await s.stub.GetPreferredAllocation(containers(ids, 1, 1), timeout=WAIT_S)
                assert [list(c.deviceIDs) for c in reply.container_responses] == [ids[:1]]
                assert not any(call.done() for call in flood)
                assert policy.pairs_answered < 8 * 600
            finally:
                for call in flood:
                    call.cancel()
                await asyncio.gather(*flood, return_exceptions=True)

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


def test_an_allocate_reply_the_kubelet_could_not_receive_is_refused() -> None:
    """5000 containers of 16 GPUs with every strategy: a reply of about 20 MB, which the
    kubelet's gRPC client (4 MiB at most) would refuse. It is refused here, saying why, before
    it is built whole."""

    async def body() -> None:
        responder = make_responder(
            ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri"), pass_device_specs=True
        )
        async with serving(load_topology("dgx-2"), responder=responder) as s:
            ids = [s.uuid(i) for i in range(16)]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await s.stub.Allocate(allocate(ids, 5000), timeout=WAIT_S)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = caught.value.details() or ""
            assert "larger than 4194304 bytes" in details, details
            assert "the kubelet's gRPC client" in details
            # What fits is answered, every container in order.
            reply = await s.stub.Allocate(allocate(ids, 100), timeout=WAIT_S)
            assert len(reply.container_responses) == 100

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


def test_other_rpcs_answer_while_a_many_container_allocate_is_built() -> None:
    async def body() -> None:
        responder = _Holding()
        async with serving(load_topology(NODE), responder=responder) as s:
            ids = [s.uuid(i) for i in range(8)]
            call = asyncio.ensure_future(s.stub.Allocate(allocate(ids, 2000), timeout=WAIT_S))
            assert await asyncio.to_thread(responder.started.wait, WAIT_S)
            options = await s.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=WAIT_S)
            assert options.get_preferred_allocation_available
            stream = s.stub.ListAndWatch(api_pb2.Empty(), timeout=WAIT_S)
            assert [d.ID for d in (await stream.read()).devices] == ids
            stream.cancel()
            assert not call.done()
            responder.go.set()
            reply = await call
            assert len(reply.container_responses) == 2000

    run(body)
