"""A DevicePluginService on a fresh unix socket with a client stub: shared by the plugin tests."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from nvplugin.allocator import make_policy
from nvplugin.api.v1beta1 import api_pb2_grpc
from nvplugin.node.model import Topology
from nvplugin.plugin.server import DevicePluginService, PluginSocket


@dataclass
class Served:
    service: DevicePluginService
    socket: PluginSocket
    stub: api_pb2_grpc.DevicePluginStub
    topology: Topology

    def uuid(self, index: int) -> str:
        return self.topology.gpus[index].uuid


@asynccontextmanager
async def serving(
    topology: Topology,
    policy: str = "best-effort",
    resource: str = "nvidia.com/gpu",
    **service_options: Any,
) -> AsyncIterator[Served]:
    """The service for ``resource`` over ``topology``'s GPUs (``service_options``: responder,
    replicas, pre_start_required, ...), served until the block ends."""
    directory = tempfile.mkdtemp()
    service = DevicePluginService(
        resource, topology.gpus, make_policy(policy, topology), **service_options
    )
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
