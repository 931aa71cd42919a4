"""One registered plugin instance as the kubelet holds it (the kubelet's ``endpoint.go`` with its
v1beta1 client): a gRPC channel to ``<dir>/<endpoint>``, the options the plugin answered at
registration, and the task that consumes its ``ListAndWatch`` stream -- no deadline, never
re-dialled (docs/kubelet-behaviour.md#registration, docs/kubelet-behaviour.md#listandwatch).

Its calls are the kubelet's: only what the plugin's options offer, one container request each,
and failures as :class:`DevicePluginError` with the kubelet's texts (gRPC errors written as
grpc-go writes them). Which endpoint is called -- the primary -- is the device manager's choice
(:mod:`.manager`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from nvplugin.api import HEALTHY
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.errors import NvpluginError

DIAL_TIMEOUT_S = 10.0
"""The kubelet dials a registering plugin with a 10 s blocking timeout."""

PRE_START_TIMEOUT_S = 30.0
"""PreStartContainer is the only plugin call the kubelet gives a deadline."""

# Go's names for gRPC status codes, so errors read as the kubelet's do
# ("rpc error: code = InvalidArgument desc = ...").
_GO_CODE_NAMES = {
    grpc.StatusCode.OK: "OK",
    grpc.StatusCode.CANCELLED: "Canceled",
    grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound",
    grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
    grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal",
    grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss",
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}


def go_rpc_error(exc: grpc.aio.AioRpcError) -> str:
    """Format a gRPC error the way grpc-go's ``err.Error()`` does (what the kubelet prints)."""
    code = _GO_CODE_NAMES.get(exc.code(), str(exc.code()))
    return f"rpc error: code = {code} desc = {exc.details() or ''}"


class DevicePluginError(NvpluginError):
    """A device-plugin call failed as the kubelet would report it (message = the kubelet's text)."""


@dataclass(frozen=True)
class PluginOptions:
    """What a plugin answered to GetDevicePluginOptions."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False

    @classmethod
    def from_proto(cls, msg: api_pb2.DevicePluginOptions) -> PluginOptions:
        return cls(
            pre_start_required=msg.pre_start_required,
            get_preferred_allocation_available=msg.get_preferred_allocation_available,
        )


@dataclass(frozen=True)
class DeviceInfo:
    """One device as a ListAndWatch message described it."""

    id: str
    health: str
    numa_nodes: tuple[int, ...] = ()

    @property
    def healthy(self) -> bool:
        """The kubelet counts a device as healthy only for the exact string ``Healthy``."""
        return self.health == HEALTHY

    @classmethod
    def from_proto(cls, dev: api_pb2.Device) -> DeviceInfo:
        nodes = tuple(n.ID for n in dev.topology.nodes) if dev.HasField("topology") else ()
        return cls(id=dev.ID, health=dev.health, numa_nodes=nodes)


DevicesCallback = Callable[["Endpoint", tuple[DeviceInfo, ...]], None]
"""Called with every ListAndWatch message, its devices in the plugin's order."""
EndCallback = Callable[["Endpoint", str], None]
"""Called once when the stream ends, with why (a Go-style gRPC error, or what ended it)."""


class Endpoint:
    """One registered plugin instance: channel, options, and its ListAndWatch consumer."""

    def __init__(
        self,
        resource: str,
        socket_path: str,
        channel: grpc.aio.Channel,
        options: PluginOptions,
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.options = options
        self.registered_at = time.monotonic()
        self._channel = channel
        self._stub = api_pb2_grpc.DevicePluginStub(channel)
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(
        cls, resource: str, socket_path: str, *, dial_timeout_s: float = DIAL_TIMEOUT_S
    ) -> Endpoint:
        """Dial (blocking, with timeout) and read the options, as the kubelet's Register does.

        Raises :class:`DevicePluginError` with the kubelet's text on either failure.
        """
        channel = grpc.aio.insecure_channel(f"unix://{socket_path}")
        try:
            try:
                await asyncio.wait_for(channel.channel_ready(), dial_timeout_s)
            except TimeoutError:
                raise DevicePluginError(
                    f"failed to dial device plugin: context deadline exceeded "
                    f"(nothing answered on {socket_path} within {dial_timeout_s:g}s)"
                ) from None
            stub = api_pb2_grpc.DevicePluginStub(channel)
            try:
                reply = await stub.GetDevicePluginOptions(api_pb2.Empty())
            except grpc.aio.AioRpcError as exc:
                raise DevicePluginError(
                    f"failed to get device plugin options: {go_rpc_error(exc)}"
                ) from None
        except BaseException:
            await channel.close()
            raise
        return cls(resource, socket_path, channel, PluginOptions.from_proto(reply))

    @property
    def alive(self) -> bool:
        """True while the ListAndWatch stream is running."""
        return self._task is not None and not self._task.done()

    def start_watching(self, on_devices: DevicesCallback, on_end: EndCallback) -> None:
        """Consume ListAndWatch in a task: ``on_devices`` per message, ``on_end`` once it ends.

        No deadline and no re-dial, as the kubelet; :meth:`close` cancels it without ``on_end``.
        """
        self._task = asyncio.get_running_loop().create_task(
            self._watch(on_devices, on_end),
            name=f"list-and-watch {self.resource} {self.socket_path}",
        )

    async def _watch(self, on_devices: DevicesCallback, on_end: EndCallback) -> None:
        reason = "stream ended"
        try:
            response: api_pb2.ListAndWatchResponse
            async for response in self._stub.ListAndWatch(api_pb2.Empty()):
                on_devices(self, tuple(DeviceInfo.from_proto(d) for d in response.devices))
        except grpc.aio.AioRpcError as exc:
            reason = go_rpc_error(exc)
        except Exception as exc:  # whatever ends the stream ends this instance, as in the kubelet
            reason = repr(exc)
        on_end(self, reason)
        await self._channel.close()

    async def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str] | None:
        """Ask for the plugin's preferred devices: one container request, no deadline.

        None when the plugin does not offer it (the kubelet then uses its fallback). The answer
        is ``container_responses[0].deviceIDs`` as sent (the kubelet later drops unknown IDs).
        An RPC error is a :class:`DevicePluginError` (it fails the pod's admission).
        """
        if not self.options.get_preferred_allocation_available:
            return None
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        try:
            reply = await self._stub.GetPreferredAllocation(request)
        except grpc.aio.AioRpcError as exc:
            raise DevicePluginError(
                f"device plugin GetPreferredAllocation rpc failed with err: {go_rpc_error(exc)}"
            ) from None
        if not reply.container_responses:
            return []
        return list(reply.container_responses[0].deviceIDs)

    async def allocate(self, device_ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        """Allocate one container's devices, no deadline; the first container response (what
        the kubelet keeps). Errors are :class:`DevicePluginError`."""
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        try:
            reply: api_pb2.AllocateResponse = await self._stub.Allocate(request)
        except grpc.aio.AioRpcError as exc:
            raise DevicePluginError(go_rpc_error(exc)) from None
        if not reply.container_responses:
            raise DevicePluginError(f"no containers return in allocation response {reply}")
        return reply.container_responses[0]

    async def pre_start_container(
        self, device_ids: Sequence[str], *, timeout_s: float = PRE_START_TIMEOUT_S
    ) -> bool:
        """PreStartContainer (30 s deadline) if the plugin asked for it; True if called.
        Errors are :class:`DevicePluginError`."""
        if not self.options.pre_start_required:
            return False
        request = api_pb2.PreStartContainerRequest(devices_ids=list(device_ids))
        try:
            await self._stub.PreStartContainer(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise DevicePluginError(
                f"device plugin PreStartContainer rpc failed with err: {go_rpc_error(exc)}"
            ) from None
        return True

    async def close(self) -> None:
        """Drop the connection without telling the device manager (the kubelet is going away)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._channel.close()

    def __repr__(self) -> str:
        return f"Endpoint({self.resource!r}, {self.socket_path!r}, alive={self.alive})"
