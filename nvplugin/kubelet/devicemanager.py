"""The fake kubelet's device manager: what the kubelet knows about device plugins and their devices.

Shaped like the kubelet's ``pkg/kubelet/cm/devicemanager`` (kubelet-behaviour.md §1, §2, §5):

- :class:`Endpoint` is one registered plugin instance (the kubelet's ``endpointImpl`` + v1beta1
  client): a gRPC channel to ``<dir>/<endpoint>``, the options it answered at registration, and the
  task that consumes its ``ListAndWatch`` stream (no deadline, never re-dialled).
- :class:`DeviceManager` is ``ManagerImpl``: all device state lives in it, keyed by resource --
  endpoints (newest last = primary), healthy/unhealthy device sets, every device's NUMA nodes, the
  devices allocated to containers (kept when a snapshot drops them) -- plus the calls the kubelet
  makes to a plugin (GetPreferredAllocation, Allocate, PreStartContainer) with the kubelet's error
  texts. Topology hints, ``devicesToAllocate`` and the checkpoint file build on this state; the
  point where the kubelet writes its checkpoint is :meth:`DeviceManager._devices_updated`.

Everything runs on one asyncio event loop (the one that serves Registration), so the state needs
no locks. For tests and ``nvplugin admit`` it also keeps what it observed -- every Register request
and every ListAndWatch snapshot -- and lets a caller await a condition (:meth:`wait_for`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import structlog

from nvplugin.errors import NvpluginError
from nvplugin.plugin.api.v1beta1 import api_pb2, api_pb2_grpc

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

DIAL_TIMEOUT_S = 10.0
"""The kubelet dials a registering plugin with a 10 s blocking timeout."""

PRE_START_TIMEOUT_S = 30.0
"""PreStartContainer is the only plugin call the kubelet gives a deadline."""

ENDPOINT_STOP_GRACE_S = 300.0
"""A resource whose last plugin stopped is dropped (capacity 0) after 5 minutes."""

_log = structlog.get_logger("nvplugin.kubelet.devicemanager")

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
    """One device as the last ListAndWatch snapshot described it."""

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


@dataclass(frozen=True)
class Snapshot:
    """One ListAndWatch message, as received (device order kept)."""

    resource: str
    socket_path: str
    devices: tuple[DeviceInfo, ...]
    received_at: float  # time.monotonic()

    @property
    def healthy(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices if d.healthy)

    @property
    def unhealthy(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices if not d.healthy)


@dataclass(frozen=True)
class RegistrationRecord:
    """One Register request the kubelet received, and how it was answered (error None = OK)."""

    version: str
    endpoint: str
    resource_name: str
    options: PluginOptions | None  # req.options as sent (the kubelet ignores them)
    socket_path: str
    error: str | None
    received_at: float  # time.monotonic()


@dataclass(frozen=True)
class ResourceCapacity:
    """Node status for one resource: capacity = all known devices, allocatable = healthy ones."""

    capacity: int
    allocatable: int


class Endpoint:
    """One registered plugin instance: channel, options, and its ListAndWatch consumer.

    The methods call the plugin directly and raise :class:`grpc.aio.AioRpcError`; the kubelet's
    semantics (primary endpoint, options, error texts) are :class:`DeviceManager`'s.
    """

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

    def start_watching(
        self,
        on_devices: Callable[[Endpoint, Sequence[api_pb2.Device]], None],
        on_end: Callable[[Endpoint, str], None],
    ) -> None:
        """Consume ListAndWatch in a task: ``on_devices`` per message, ``on_end`` once it ends.

        No deadline and no re-dial, as the kubelet; :meth:`close` cancels it without ``on_end``.
        """
        self._task = asyncio.get_running_loop().create_task(
            self._watch(on_devices, on_end),
            name=f"list-and-watch {self.resource} {self.socket_path}",
        )

    async def _watch(
        self,
        on_devices: Callable[[Endpoint, Sequence[api_pb2.Device]], None],
        on_end: Callable[[Endpoint, str], None],
    ) -> None:
        reason = "stream ended"
        try:
            response: api_pb2.ListAndWatchResponse
            async for response in self._stub.ListAndWatch(api_pb2.Empty()):
                on_devices(self, response.devices)
        except grpc.aio.AioRpcError as exc:
            reason = go_rpc_error(exc)
        except Exception as exc:  # whatever ends the stream ends this instance, as in the kubelet
            reason = repr(exc)
        on_end(self, reason)
        await self._channel.close()

    async def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> api_pb2.PreferredAllocationResponse:
        """One container request, no deadline (as the kubelet)."""
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        reply: api_pb2.PreferredAllocationResponse = await self._stub.GetPreferredAllocation(
            request
        )
        return reply

    async def allocate(self, device_ids: Sequence[str]) -> api_pb2.AllocateResponse:
        """One container request, no deadline (as the kubelet)."""
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        reply: api_pb2.AllocateResponse = await self._stub.Allocate(request)
        return reply

    async def pre_start_container(
        self, device_ids: Sequence[str], *, timeout_s: float = PRE_START_TIMEOUT_S
    ) -> api_pb2.PreStartContainerResponse:
        request = api_pb2.PreStartContainerRequest(devices_ids=list(device_ids))
        reply: api_pb2.PreStartContainerResponse = await self._stub.PreStartContainer(
            request, timeout=timeout_s
        )
        return reply

    async def close(self) -> None:
        """Drop the connection without telling the device manager (the kubelet is going away)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._channel.close()

    def __repr__(self) -> str:
        return f"Endpoint({self.resource!r}, {self.socket_path!r}, alive={self.alive})"


class DeviceManager:
    """The kubelet's device manager state and its calls to device plugins (see module doc)."""

    def __init__(
        self,
        *,
        stop_grace_s: float = ENDPOINT_STOP_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stop_grace_s = stop_grace_s
        self._clock = clock
        # Kubelet state, per resource.
        self._endpoints: dict[str, list[Endpoint]] = {}  # newest last = primary
        self._stopped_since: dict[str, float] = {}  # resources whose last endpoint ended
        self._healthy: dict[str, set[str]] = {}
        self._unhealthy: dict[str, set[str]] = {}
        self._devices: dict[str, dict[str, DeviceInfo]] = {}
        self._allocated: dict[str, set[str]] = {}  # devices held by containers (issue 5)
        # Observations (kept across restarts: they are the test's view, not kubelet state).
        self._registrations: list[RegistrationRecord] = []
        self._snapshots: dict[str, list[Snapshot]] = {}
        self._changed = asyncio.Event()

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start as a freshly started kubelet does from its checkpoint.

        Every resource known before keeps its allocations but has no devices and a stopped
        endpoint until its plugin registers again (capacity 0 meanwhile).
        """
        now = self._clock()
        for resource in set(self._healthy) | set(self._allocated):
            self._endpoints.pop(resource, None)
            self._healthy[resource] = set()
            self._unhealthy[resource] = set()
            self._devices[resource] = {}
            self._stopped_since[resource] = now
        self._notify()

    async def stop(self) -> None:
        """Close every plugin connection (the kubelet exits; no disconnect handling runs)."""
        endpoints = [ep for eps in self._endpoints.values() for ep in eps]
        self._endpoints.clear()
        await asyncio.gather(*(ep.close() for ep in endpoints), return_exceptions=True)
        self._notify()

    # --- registration (called by registration.py once dial + options succeeded) ------------

    def record_registration(self, record: RegistrationRecord) -> None:
        self._registrations.append(record)
        self._notify()

    def plugin_connected(self, endpoint: Endpoint) -> None:
        """Add a registered plugin instance and start consuming its ListAndWatch stream.

        Raises :class:`DevicePluginError` when the same (resource, socket) is still connected.
        """
        resource = endpoint.resource
        endpoints = self._endpoints.setdefault(resource, [])
        for other in endpoints:
            if other.socket_path == endpoint.socket_path and other.alive:
                raise DevicePluginError(f"device plugin already connected: {endpoint.socket_path}")
        endpoints[:] = [ep for ep in endpoints if ep.socket_path != endpoint.socket_path]
        endpoints.append(endpoint)
        self._stopped_since.pop(resource, None)
        self._healthy.setdefault(resource, set())
        self._unhealthy.setdefault(resource, set())
        self._devices.setdefault(resource, {})
        endpoint.start_watching(self._devices_received, self._plugin_disconnected)
        _log.info(
            "device plugin registered",
            resource=resource,
            socket=endpoint.socket_path,
            pre_start_required=endpoint.options.pre_start_required,
            get_preferred_allocation_available=endpoint.options.get_preferred_allocation_available,
        )
        self._notify()

    def _devices_received(self, endpoint: Endpoint, devices: Sequence[api_pb2.Device]) -> None:
        """A snapshot rebuilds the resource's device sets (the kubelet's update callback)."""
        resource = endpoint.resource
        infos = tuple(DeviceInfo.from_proto(d) for d in devices)
        self._snapshots.setdefault(resource, []).append(
            Snapshot(resource, endpoint.socket_path, infos, time.monotonic())
        )
        self._devices[resource] = {d.id: d for d in infos}
        self._healthy[resource] = {d.id for d in infos if d.healthy}
        self._unhealthy[resource] = {d.id for d in infos if not d.healthy}
        self._devices_updated(resource)

    def _devices_updated(self, resource: str) -> None:
        """After every device update; the kubelet writes its checkpoint here."""
        self._notify()

    def _plugin_disconnected(self, endpoint: Endpoint, reason: str) -> None:
        resource = endpoint.resource
        endpoints = self._endpoints.get(resource, [])
        if endpoint in endpoints:
            endpoints.remove(endpoint)
        if not endpoints:
            self._endpoints.pop(resource, None)
        _log.info(
            "device plugin disconnected",
            resource=resource,
            socket=endpoint.socket_path,
            reason=reason,
        )
        if not endpoints:
            self._stopped_since[resource] = self._clock()
            # The last instance is gone: nothing can be allocated until a plugin registers
            # again; capacity stays.
            healthy = self._healthy.get(resource, set())
            self._unhealthy.setdefault(resource, set()).update(healthy)
            self._healthy[resource] = set()
        self._devices_updated(resource)

    # --- queries -----------------------------------------------------------------------------

    def resources(self) -> list[str]:
        """Every resource the kubelet knows (registered now or before), sorted."""
        return sorted(set(self._healthy) | {r for r, eps in self._endpoints.items() if eps})

    def endpoints(self, resource: str) -> tuple[Endpoint, ...]:
        """Live endpoints for ``resource``, oldest first (the last is the primary)."""
        return tuple(self._endpoints.get(resource, ()))

    def primary(self, resource: str) -> Endpoint | None:
        endpoints = self._endpoints.get(resource)
        return endpoints[-1] if endpoints else None

    def is_registered(self, resource: str) -> bool:
        return bool(self._endpoints.get(resource))

    def options(self, resource: str) -> PluginOptions | None:
        """The primary endpoint's options (None when no plugin is registered)."""
        primary = self.primary(resource)
        return primary.options if primary else None

    def healthy_devices(self, resource: str) -> frozenset[str]:
        return frozenset(self._healthy.get(resource, ()))

    def unhealthy_devices(self, resource: str) -> frozenset[str]:
        return frozenset(self._unhealthy.get(resource, ()))

    def devices(self, resource: str) -> dict[str, DeviceInfo]:
        """Devices of the last snapshot by ID (in the order the plugin sent them)."""
        return dict(self._devices.get(resource, {}))

    def device_numa(self, resource: str) -> dict[str, tuple[int, ...]]:
        """Device ID -> NUMA nodes (empty tuple: no topology)."""
        return {d.id: d.numa_nodes for d in self._devices.get(resource, {}).values()}

    def has_topology_alignment(self, resource: str) -> bool:
        """True if at least one known device of ``resource`` has a NUMA node."""
        return any(d.numa_nodes for d in self._devices.get(resource, {}).values())

    def allocated_devices(self, resource: str) -> frozenset[str]:
        return frozenset(self._allocated.get(resource, ()))

    def available_devices(self, resource: str) -> frozenset[str]:
        """Healthy devices no container holds."""
        return self.healthy_devices(resource) - self.allocated_devices(resource)

    def capacity(self) -> dict[str, ResourceCapacity]:
        """Node capacity/allocatable per resource, dropping resources stopped past the grace.

        Like the kubelet's ``GetCapacity`` this is where a resource whose plugin has been gone
        for 5 minutes disappears (capacity 0, no longer listed).
        """
        now = self._clock()
        for resource, since in list(self._stopped_since.items()):
            if now - since > self._stop_grace_s:
                del self._stopped_since[resource]
                for table in (self._healthy, self._unhealthy, self._devices):
                    table.pop(resource, None)
        return {
            r: ResourceCapacity(
                capacity=len(self._healthy[r]) + len(self._unhealthy.get(r, ())),
                allocatable=len(self._healthy[r]),
            )
            for r in sorted(self._healthy)
        }

    @property
    def registrations(self) -> tuple[RegistrationRecord, ...]:
        """Every Register request received since this manager was created, in order."""
        return tuple(self._registrations)

    def snapshots(self, resource: str) -> tuple[Snapshot, ...]:
        """Every ListAndWatch message received for ``resource``, in order (across restarts)."""
        return tuple(self._snapshots.get(resource, ()))

    def describe(self) -> str:
        """One line of state, for timeout messages."""
        parts = []
        for r in self.resources():
            parts.append(
                f"{r}: endpoints={[e.socket_path for e in self.endpoints(r)]} "
                f"healthy={sorted(self.healthy_devices(r))} "
                f"unhealthy={sorted(self.unhealthy_devices(r))} "
                f"snapshots={len(self.snapshots(r))}"
            )
        errors = [r.error for r in self._registrations if r.error]
        if errors:
            parts.append(f"register errors={errors}")
        return "; ".join(parts) or "no resources, no registrations"

    # --- waiting -----------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(
        self,
        predicate: Callable[[DeviceManager], bool],
        timeout: float,
        what: str = "condition",
    ) -> None:
        """Wait until ``predicate(self)`` holds (re-checked on every state change).

        Raises :class:`TimeoutError` naming ``what`` and the current state.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(self):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(
                    f"timed out after {timeout:g}s waiting for {what}; state: {self.describe()}"
                )
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    async def wait_registered(self, resource: str, timeout: float) -> Endpoint:
        """Wait until a plugin for ``resource`` is registered with a live stream; the primary."""
        await self.wait_for(
            lambda m: m.is_registered(resource), timeout, f"a registration of {resource}"
        )
        primary = self.primary(resource)
        assert primary is not None
        return primary

    # --- the kubelet's calls to the plugin ---------------------------------------------------

    def _primary_or_error(self, resource: str) -> Endpoint:
        primary = self.primary(resource)
        if primary is None:
            raise DevicePluginError(
                f"endpoint not found in cache for a registered resource: {resource}"
            )
        return primary

    async def get_preferred_allocation(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str] | None:
        """Ask the primary plugin for its preferred devices, as the kubelet does.

        None when the plugin does not offer it (the kubelet then uses its fallback). The answer
        is ``container_responses[0].deviceIDs`` as sent (the kubelet later drops unknown IDs).
        An RPC error is a :class:`DevicePluginError` (it fails the pod's admission).
        """
        endpoint = self._primary_or_error(resource)
        if not endpoint.options.get_preferred_allocation_available:
            return None
        try:
            reply = await endpoint.get_preferred_allocation(available, must_include, size)
        except grpc.aio.AioRpcError as exc:
            raise DevicePluginError(
                f"device plugin GetPreferredAllocation rpc failed with err: {go_rpc_error(exc)}"
            ) from None
        if not reply.container_responses:
            return []
        return list(reply.container_responses[0].deviceIDs)

    async def allocate(
        self, resource: str, device_ids: Sequence[str]
    ) -> api_pb2.ContainerAllocateResponse:
        """Allocate on the primary plugin; the first container response (what the kubelet keeps)."""
        endpoint = self._primary_or_error(resource)
        try:
            reply = await endpoint.allocate(device_ids)
        except grpc.aio.AioRpcError as exc:
            raise DevicePluginError(go_rpc_error(exc)) from None
        if not reply.container_responses:
            raise DevicePluginError(f"no containers return in allocation response {reply}")
        return reply.container_responses[0]

    async def pre_start_container(self, resource: str, device_ids: Sequence[str]) -> bool:
        """Call PreStartContainer (30 s deadline) if the plugin asked for it; True if called."""
        endpoint = self._primary_or_error(resource)
        if not endpoint.options.pre_start_required:
            return False
        try:
            await endpoint.pre_start_container(device_ids)
        except grpc.aio.AioRpcError as exc:
            raise DevicePluginError(
                f"device plugin PreStartContainer rpc failed with err: {go_rpc_error(exc)}"
            ) from None
        return True
