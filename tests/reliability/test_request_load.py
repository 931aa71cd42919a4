"""Load against a real ``nvplugin serve``: whatever requests are in flight, SIGTERM ends the
plugin well within Kubernetes' 30 s grace period; a request that asks for as much as it may is
answered within its own budget; running out of file descriptors costs a log line per interval.

The node is ``mesh-20`` (no two GPUs interchangeable: best-effort searches within its budget
for every container), with a budget of 0.5 s a container: before requests were bounded, eight
requests of 600 containers were five minutes of work that shutdown waited for; now a request
names at most a few containers, and what is queued is dropped at SIGTERM.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import time

import grpc
import pytest

from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.log import REPEAT_INTERVAL_S
from nvplugin.plugin.executor import CAPACITY
from nvplugin.plugin.httpendpoint import MAX_CONNECTIONS
from nvplugin.rm import MAX_CONTAINER_REQUESTS
from tests.support import bignodes
from tests.support.harness import Plugin, http_get
from tests.support.serve import Serve, new_dir, remove_dir
from tests.support.waiting import WAIT_S

GRACE_S = 30.0
"""Kubernetes' default termination grace period: after it, the kubelet kills the plugin."""
FULL = MAX_CONTAINER_REQUESTS


def _preferred(ids: list[str], containers: int) -> api_pb2.PreferredAllocationRequest:
    one = api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=5)
    return api_pb2.PreferredAllocationRequest(container_requests=[one] * containers)


def _allocate(ids: list[str], containers: int) -> api_pb2.AllocateRequest:
    one = api_pb2.ContainerAllocateRequest(devices_ids=ids)
    return api_pb2.AllocateRequest(container_requests=[one] * containers)


def test_sigterm_under_a_flood_of_requests_exits_within_seconds() -> None:
    async def body() -> None:
        directory, nodes = new_dir(), new_dir()
        node = bignodes.write(nodes, "mesh-20")
        serve = Serve(directory, "--simulate", node, "--allocation-budget", "0.5s")
        try:
            ready = await serve.wait_log("allocation policy ready")
            assert ready["policy"] == "best-effort"
            socket = (await serve.wait_log("serving"))["socket"]
            ids = (await serve.wait_log("serving"))["devices"]
            async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                # More than the plugin takes at once: every place taken, the rest turned away.
                flood = [
                    asyncio.ensure_future(stub.GetPreferredAllocation(_preferred(ids, FULL)))
                    for _ in range(CAPACITY)
                ] + [asyncio.ensure_future(stub.Allocate(_allocate(ids, FULL))) for _ in range(4)]
                # Sent after the flood on the same connection: its answer means the plugin has
                # every request of the flood.
                await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=GRACE_S)
                started = time.monotonic()
                serve.process.terminate()
                code = await asyncio.to_thread(serve.wait, GRACE_S)
                took = time.monotonic() - started
                await asyncio.gather(*flood, return_exceptions=True)
            assert code == 0, serve.text()[-3000:]
            # "A few seconds": the bound that matters is the grace period, with room to spare
            # on a loaded machine (an idle one takes well under a second).
            assert took < GRACE_S / 2, f"SIGTERM took {took:.1f} s"
            assert "Traceback" not in serve.text()
        finally:
            serve.kill()
            remove_dir(directory)
            remove_dir(nodes)

    asyncio.run(asyncio.wait_for(body(), 120))


def test_a_full_preferred_request_is_answered_within_its_budget() -> None:
    """As many containers as a request may name, each a search of up to half a second: the
    request is answered within its budget (every container, unless the machine is too busy:
    then the containers reached, and the plugin says so); one more container is refused.
    (A request whose policy does not answer in time: tests/plugin/test_request_bounds.py.)"""

    async def body() -> None:
        directory, nodes = new_dir(), new_dir()
        node = bignodes.write(nodes, "mesh-20")
        serve = Serve(directory, "--simulate", node, "--allocation-budget", "0.5s")
        try:
            await serve.wait_log("allocation policy ready")
            served = await serve.wait_log("serving")
            ids = served["devices"]
            async with grpc.aio.insecure_channel(f"unix:{served['socket']}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                reply = await stub.GetPreferredAllocation(_preferred(ids, FULL), timeout=GRACE_S)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.GetPreferredAllocation(_preferred(ids, FULL + 1), timeout=GRACE_S)
            answers = [list(c.deviceIDs) for c in reply.container_responses]
            assert len(answers) == FULL
            given = [a for a in answers if a]
            assert all(len(a) == 5 for a in given)
            assert answers[len(given) :] == [[]] * (FULL - len(given))
            if len(given) < FULL:  # a loaded machine: the budget came first, and it is said
                line = await serve.wait_log("GetPreferredAllocation out of time")
                assert line["containers"] == FULL and line["answered"] == len(given)
                assert line["budget_s"] == 1.5
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert serve.stop() == 0
        finally:
            serve.kill()
            remove_dir(directory)
            remove_dir(nodes)

    asyncio.run(asyncio.wait_for(body(), 120))


def test_out_of_file_descriptors_logs_a_line_per_interval_not_per_failed_accept() -> None:
    """The plugin's fds run out (its limit lowered to what it holds, then connections to its
    HTTP endpoints): accept fails hundreds of times a second, and the log gets one line and,
    an interval later, one saying how many more there were -- not a traceback each. Once the
    connections go, it answers again."""

    async def body() -> None:
        directory = new_dir()
        plugin = Plugin(directory, "--simulate", "workstation-4gpu")
        held: list[socket.socket] = []
        try:
            ports = [await plugin.metrics_port(), await plugin.probe_port()]
            await plugin.wait_log("serving")
            fds = plugin.fds()
            resource.prlimit(plugin.pid, resource.RLIMIT_NOFILE, (fds + 4, fds + 4))
            for _ in range(MAX_CONNECTIONS + 16):  # what does not fit waits in the backlog
                for port in ports:
                    held.append(socket.create_connection(("127.0.0.1", port), timeout=WAIT_S))
            first = await plugin.wait_log("event loop error")
            assert first["message"] == "socket.accept() out of system resource"
            assert "Too many open files" in first["error"]
            # The next line of the kind comes an interval later and counts what it left out.
            again = await plugin.wait_log(
                "event loop error", REPEAT_INTERVAL_S + WAIT_S, lambda e: "repeated" in e
            )
            assert again["repeated"] >= 10, again
            lines = plugin.events("event loop error")
            assert len(lines) <= 3, f"{len(lines)} lines"
            assert "Traceback" not in plugin.text()
            for sock in held:
                sock.close()
            held.clear()
            status, _ = await http_get(ports[1], "/livez", timeout=WAIT_S)
            assert status == 200
            assert plugin.stop() == 0
        finally:
            for sock in held:
                sock.close()
            plugin.kill()
            remove_dir(directory)

    asyncio.run(asyncio.wait_for(body(), 120))
