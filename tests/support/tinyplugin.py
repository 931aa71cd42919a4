"""A tiny DevicePlugin servicer and helpers for driving the fake kubelet over real unix sockets,
shared by the fake kubelet's tests and nvplugin admit's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

import grpc

from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.fakekubelet.pods import Pod
from nvplugin.fakekubelet.topologymanager import (
    BitMask,
    TopologyHint,
)

RESOURCE = "nvidia.com/gpu"


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


def device(dev_id: str, health: str = "Healthy", numa: list[int] | None = None) -> api_pb2.Device:
    """A Device; ``numa=None`` leaves topology unset, ``[]`` sets it with no nodes."""
    if numa is None:
        return api_pb2.Device(ID=dev_id, health=health)
    nodes = [api_pb2.NUMANode(ID=n) for n in numa]
    return api_pb2.Device(ID=dev_id, health=health, topology=api_pb2.TopologyInfo(nodes=nodes))


class TinyPlugin(api_pb2_grpc.DevicePluginServicer):
    """A minimal device plugin: a settable device list, recorded calls, scripted options."""

    def __init__(
        self,
        devices: list[api_pb2.Device],
        *,
        gpa: bool = False,
        pre_start: bool = False,
        options_error: str | None = None,
    ) -> None:
        self.devices = list(devices)
        self.options = api_pb2.DevicePluginOptions(
            pre_start_required=pre_start, get_preferred_allocation_available=gpa
        )
        self.options_error = options_error
        self.streams: list[asyncio.Queue[list[api_pb2.Device]]] = []
        self.list_and_watch_calls = 0
        self.calls: list[tuple[str, Any]] = []
        self.server: grpc.aio.Server | None = None

    async def serve(self, path: str) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self.server = server

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=None)
            self.server = None

    def set_devices(self, devices: list[api_pb2.Device]) -> None:
        self.devices = list(devices)
        for stream in self.streams:
            stream.put_nowait(self.devices)

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Any
    ) -> api_pb2.DevicePluginOptions:
        if self.options_error is not None:
            await context.abort(grpc.StatusCode.INTERNAL, self.options_error)
        return self.options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Any
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        self.list_and_watch_calls += 1
        stream: asyncio.Queue[list[api_pb2.Device]] = asyncio.Queue()
        self.streams.append(stream)
        try:
            yield api_pb2.ListAndWatchResponse(devices=self.devices)
            while True:
                yield api_pb2.ListAndWatchResponse(devices=await stream.get())
        finally:
            self.streams.remove(stream)

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        self.calls.append(("GetPreferredAllocation", request))
        req = request.container_requests[0]
        if req.allocation_size < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "negative allocation size")
        chosen = sorted(req.available_deviceIDs)[: req.allocation_size]
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen)]
        )

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: Any
    ) -> api_pb2.AllocateResponse:
        self.calls.append(("Allocate", request))
        known = {d.ID for d in self.devices}
        responses = []
        for req in request.container_requests:
            for dev_id in req.devices_ids:
                if dev_id not in known:
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT, f"unknown device {dev_id}"
                    )
            envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(req.devices_ids)}
            responses.append(api_pb2.ContainerAllocateResponse(envs=envs))
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Any
    ) -> api_pb2.PreStartContainerResponse:
        self.calls.append(("PreStartContainer", request))
        return api_pb2.PreStartContainerResponse()


async def register(
    kubelet: FakeKubelet,
    endpoint: str,
    resource: str = RESOURCE,
    version: str = "v1beta1",
    options: api_pb2.DevicePluginOptions | None = None,
) -> None:
    """Call Register on the kubelet socket as a plugin would (raises AioRpcError on refusal)."""
    async with grpc.aio.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        await stub.Register(
            api_pb2.RegisterRequest(
                version=version, endpoint=endpoint, resource_name=resource, options=options
            )
        )


class ScriptedPlugin(TinyPlugin):
    """TinyPlugin with a scripted preferred answer and scripted failures."""

    def __init__(
        self,
        devices: list[api_pb2.Device],
        *,
        preferred: list[str] | None = None,
        gpa: bool = True,
        gpa_error: str | None = None,
        allocate_error: str | None = None,
        pre_start: bool = False,
    ) -> None:
        super().__init__(devices, gpa=gpa, pre_start=pre_start)
        self.preferred = preferred
        self.gpa_error = gpa_error
        self.allocate_error = allocate_error

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        if self.preferred is None and self.gpa_error is None:
            return await super().GetPreferredAllocation(request, context)
        self.calls.append(("GetPreferredAllocation", request))
        if self.gpa_error is not None:
            await context.abort(grpc.StatusCode.INTERNAL, self.gpa_error)
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=self.preferred)
            ]
        )

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: Any
    ) -> api_pb2.AllocateResponse:
        if self.allocate_error is not None:
            self.calls.append(("Allocate", request))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self.allocate_error)
        return await super().Allocate(request, context)

    def gpa_calls(self) -> list[tuple[list[str], list[str], int]]:
        out = []
        for name, request in self.calls:
            if name == "GetPreferredAllocation":
                [r] = request.container_requests
                out.append(
                    (list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size)
                )
        return out


class Hints:
    """A topology-manager Store the test fills in."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], TopologyHint] = {}

    def get_affinity(self, pod_uid: str, container_name: str) -> TopologyHint:
        return self.stored.get((pod_uid, container_name), NO_HINT)

    def set(self, pod: Pod, container: str, nodes: Sequence[int] | None) -> None:
        mask = None if nodes is None else BitMask.of(*nodes)
        self.stored[(pod.uid, container)] = TopologyHint(mask, True)


def devs(spec: str) -> list[api_pb2.Device]:
    """``"A:0 B:1 C:- D:0,1 E:0!"``: ID:NUMA nodes (``-`` none), ``!`` = Unhealthy."""
    out = []
    for item in spec.split():
        dev_id, _, nodes = item.partition(":")
        health = "Unhealthy" if nodes.endswith("!") else "Healthy"
        nodes = nodes.rstrip("!")
        numa = None if nodes == "-" else [int(n) for n in nodes.split(",")]
        out.append(device(dev_id, health, numa))
    return out


NO_HINT = TopologyHint(None, False)
