"""GetPreferredAllocation never holds the event loop: while a request is being answered (here:
a policy that waits for the test's go-ahead), health checks, options and ListAndWatch answer.

Ordered by events, not timed: the policy says when it has started, the other RPCs complete, and
only then is it let go.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.nodesession import load_topology
from nvplugin.plugin.healthservice import PluginHealthService, add_to_server
from nvplugin.plugin.server import DevicePluginService, PluginSocket
from tests.support.service import gpus_manager, run
from tests.support.waiting import WAIT_S


class _Waiting:
    """A policy that answers only once ``go`` is set (the lowest available GPUs)."""

    name = "waiting"

    def __init__(self) -> None:
        self.started = threading.Event()
        self.go = threading.Event()

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        self.started.set()
        assert self.go.wait(WAIT_S), "the test never let the request go"
        return sorted(available)[:size]


def test_other_rpcs_answer_while_a_preferred_allocation_is_in_progress() -> None:
    async def body() -> None:
        topology = load_topology("dgx-h100")
        policy = _Waiting()
        service = DevicePluginService(gpus_manager("nvidia.com/gpu", topology.gpus), policy)
        health = PluginHealthService("nvidia.com/gpu")
        service.watch_health(health.set_health)
        path = os.path.join(tempfile.mkdtemp(), "nvplugin-gpu.sock")
        sock = PluginSocket(path, service, extra_services=[lambda s: add_to_server(health, s)])
        await sock.start()
        ids = [gpu.uuid for gpu in topology.gpus]
        try:
            async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
                plugin = api_pb2_grpc.DevicePluginStub(channel)
                checks = health_pb2_grpc.HealthStub(channel)
                request = api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=ids, allocation_size=2
                        )
                    ]
                )
                call = asyncio.ensure_future(plugin.GetPreferredAllocation(request, timeout=WAIT_S))
                assert await asyncio.to_thread(policy.started.wait, WAIT_S)
                # The request is inside the policy now; everything else still answers.
                for _ in range(5):
                    status = await checks.Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S)
                    assert status.status in (
                        health_pb2.HealthCheckResponse.SERVING,
                        health_pb2.HealthCheckResponse.NOT_SERVING,
                    )
                options = await plugin.GetDevicePluginOptions(api_pb2.Empty(), timeout=WAIT_S)
                assert options.get_preferred_allocation_available
                stream = plugin.ListAndWatch(api_pb2.Empty(), timeout=WAIT_S)
                first = await stream.read()
                assert [d.ID for d in first.devices] == ids
                stream.cancel()
                assert not call.done()
                policy.go.set()
                reply = await call
                assert list(reply.container_responses[0].deviceIDs) == ids[:2]
        finally:
            policy.go.set()
            service.close()
            await sock.stop()

    run(body)
