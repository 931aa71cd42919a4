"""A DevicePluginService on a fresh unix socket with a client stub: shared by the plugin tests."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nvplugin.allocator import make_policy
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.node.model import Gpu, Topology
from nvplugin.plugin.server import DevicePluginService, PluginSocket
from nvplugin.rm import Replicas, ResourceManager, Responder
from nvplugin.rm.devices import base_devices
from nvplugin.rm.plan import served_resource
from nvplugin.rm.sharing import NOT_SHARED
from tests.support.waiting import WAIT_S


@dataclass
class Served:
    service: DevicePluginService
    socket: PluginSocket
    stub: api_pb2_grpc.DevicePluginStub
    topology: Topology

    def uuid(self, index: int) -> str:
        return self.topology.gpus[index].uuid


def gpus_manager(
    resource: str,
    gpus: Sequence[Gpu],
    *,
    replicas: Replicas = NOT_SHARED,
    responder: Responder | None = None,
) -> ResourceManager:
    """The resource manager of ``resource`` serving ``gpus`` whole (or their ``replicas``)."""
    return ResourceManager(served_resource(resource, base_devices(gpus), replicas), responder)


@asynccontextmanager
async def serving(
    topology: Topology,
    policy: str = "best-effort",
    resource: str = "nvidia.com/gpu",
    *,
    replicas: Replicas = NOT_SHARED,
    responder: Responder | None = None,
    **service_options: Any,
) -> AsyncIterator[Served]:
    """The service for ``resource`` over ``topology``'s GPUs (``replicas``, ``responder``: the
    resource's; ``service_options``: pre_start_required, ...), served until the block ends."""
    directory = tempfile.mkdtemp()
    manager = gpus_manager(resource, topology.gpus, replicas=replicas, responder=responder)
    service = DevicePluginService(manager, make_policy(policy, topology), **service_options)
    sock = PluginSocket(os.path.join(directory, "nvplugin-gpu.sock"), service)
    await sock.start()
    channel = grpc.aio.insecure_channel(f"unix:{sock.path}")
    try:
        yield Served(service, sock, api_pb2_grpc.DevicePluginStub(channel), topology)
    finally:
        await channel.close()
        service.close()
        await sock.stop()


def run(body: Callable[[], Awaitable[None]], timeout: float = 60) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


def allocate_request(*containers: Sequence[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers
        ]
    )


def write_config(text: str) -> str:
    path = os.path.join(tempfile.mkdtemp(), "config.yaml")
    Path(path).write_text(text)
    return path


async def health_check(path: str) -> tuple[int, str]:
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        call = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=WAIT_S
        )
        answer = await call
        reason = dict(await call.trailing_metadata() or ()).get("nvplugin-reason", "")
    return answer.status, str(reason)
