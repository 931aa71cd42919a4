"""The fake kubelet's device manager: what the kubelet knows about device plugins and their devices.

Shaped like the kubelet's ``pkg/kubelet/cm/devicemanager`` (kubelet-behaviour.md §1, §2, §5):

- :class:`Endpoint` is one registered plugin instance (the kubelet's ``endpointImpl`` + v1beta1
  client): a gRPC channel to ``<dir>/<endpoint>``, the options it answered at registration, and the
  task that consumes its ``ListAndWatch`` stream (no deadline, never re-dialled).
- :class:`DeviceManager` is ``ManagerImpl``: all device state lives in it, keyed by resource --
  endpoints (newest last = primary), healthy/unhealthy device sets, every device's NUMA nodes, the
  devices allocated to containers (kept when a snapshot drops them) -- plus the calls the kubelet
  makes to a plugin (GetPreferredAllocation, Allocate, PreStartContainer) with the kubelet's error
  texts.
- On that state: the topology hints (§3, :meth:`DeviceManager.container_hints` /
  :meth:`DeviceManager.pod_hints`), ``devicesToAllocate`` step by step (§5,
  :meth:`DeviceManager.devices_to_allocate`), a container's allocation with init-container reuse
  (:meth:`DeviceManager.allocate_container`), PreStartContainer at container start
  (:meth:`DeviceManager.prepare_container`) and the checkpoint file
  (:mod:`nvplugin.kubelet.checkpoint`), written after every device update and every allocation
  and read back by :meth:`DeviceManager.start`.
- :class:`DeviceHintProvider` is the device manager as the topology manager sees it (the
  kubelet's ``HintProvider``). It is a separate object only because the name ``allocate`` is
  taken here by the raw Allocate call.

Determinism: where the kubelet iterates Go sets (random order), we go in the plugin's device
order (the order of its last ListAndWatch snapshot), so results are repeatable.

Everything runs on one asyncio event loop (the one that serves Registration), so the state needs
no locks. The topology manager's seam is synchronous (as the kubelet's), while talking to a
plugin is not: run ``Manager.admit`` in a worker thread (``await asyncio.to_thread(...)``) and
the provider hops onto the loop for each call (:meth:`DeviceManager.call_sync`).

For tests and ``nvplugin admit`` it also keeps what it observed -- every Register request
and every ListAndWatch snapshot -- and lets a caller await a condition (:meth:`wait_for`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import structlog

from nvplugin.api import HEALTHY
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.errors import NvpluginError
from nvplugin.kubelet import checkpoint as ckpt
from nvplugin.kubelet.pods import Container, Pod
from nvplugin.kubelet.topologymanager.hints import generate_hints
from nvplugin.kubelet.topologymanager.options import go_quote
from nvplugin.kubelet.topologymanager.policy import ProviderHints, TopologyHint
from nvplugin.kubelet.topologymanager.scope import AllocationError, Store

T = TypeVar("T")


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


@dataclass(frozen=True, eq=False)
class ContainerAllocation:
    """The devices one container holds for one resource (the kubelet's ``deviceAllocateInfo``).

    ``by_numa`` groups them by NUMA node as the checkpoint stores them (-1 = no NUMA info);
    ``response`` is the first container response of the plugin's Allocate answer.
    """

    pod_uid: str
    container: str
    resource: str
    device_ids: frozenset[str]
    by_numa: Mapping[int, tuple[str, ...]]
    response: api_pb2.ContainerAllocateResponse


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
        numa_nodes: Sequence[int] | None = None,
        store: Store | None = None,
        checkpoint_dir: str | None = None,
        active_pods: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        """``numa_nodes``: the machine's NUMA nodes (default: those the devices name).
        ``store``: where the merged topology hint of a container is read (the topology
        manager; None = no hint). ``checkpoint_dir``: where ``kubelet_internal_checkpoint`` is
        written and read (None = no checkpoint). ``active_pods``: UIDs of the pods still
        running; devices of other pods are reclaimed before hints and allocation, as the
        kubelet's ``UpdateAllocatedDevices`` does (None = every pod stays).
        """
        self._stop_grace_s = stop_grace_s
        self._clock = clock
        self._numa_nodes = tuple(numa_nodes) if numa_nodes is not None else None
        self.store = store
        self.checkpoint_dir = checkpoint_dir
        self.active_pods = active_pods
        self._loop: asyncio.AbstractEventLoop | None = None
        # pod UID -> container -> resource -> what it holds (the kubelet's podDevices)
        self._pod_devices: dict[str, dict[str, dict[str, ContainerAllocation]]] = {}
        # pod UID -> resource -> devices its init containers left for later containers
        self._reuse: dict[str, dict[str, set[str]]] = {}
        self.checkpoint_writes = 0
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
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()
        self._read_checkpoint()
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
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()
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
        self._devices_updated()

    def _devices_updated(self) -> None:
        """After every device update; the kubelet writes its checkpoint here."""
        self.write_checkpoint()
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
        self._devices_updated()

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

    # --- allocation state (the kubelet's podDevices / allocatedDevices) ----------------------

    def container_devices(
        self, pod_uid: str, container: str, resource: str
    ) -> frozenset[str] | None:
        """Devices a container holds for ``resource``; None when it holds none (no entry)."""
        entry = self._pod_devices.get(pod_uid, {}).get(container, {}).get(resource)
        return None if entry is None else entry.device_ids

    def container_allocation(
        self, pod_uid: str, container: str, resource: str
    ) -> ContainerAllocation | None:
        return self._pod_devices.get(pod_uid, {}).get(container, {}).get(resource)

    def pod_devices(self, pod_uid: str, resource: str) -> frozenset[str]:
        """Devices of ``resource`` held by any container of the pod."""
        out: set[str] = set()
        for resources in self._pod_devices.get(pod_uid, {}).values():
            entry = resources.get(resource)
            if entry is not None:
                out |= entry.device_ids
        return frozenset(out)

    def allocations(self) -> list[ContainerAllocation]:
        """Every container allocation, by pod UID, container and resource."""
        return [
            entry
            for uid in sorted(self._pod_devices)
            for container in sorted(self._pod_devices[uid])
            for _, entry in sorted(self._pod_devices[uid][container].items())
        ]

    def pods(self) -> frozenset[str]:
        """UIDs of the pods holding devices."""
        return frozenset(self._pod_devices)

    def reusable_devices(self, pod_uid: str, resource: str) -> frozenset[str]:
        """Devices the pod's init containers left for its later containers."""
        return frozenset(self._reuse.get(pod_uid, {}).get(resource, ()))

    def is_device_plugin_resource(self, resource: str) -> bool:
        """A resource the kubelet knows from a plugin, now or from earlier allocations."""
        return resource in self._healthy or resource in self._allocated

    def numa_nodes(self) -> tuple[int, ...]:
        """The machine's NUMA nodes (given at construction, else those the devices name)."""
        if self._numa_nodes is not None:
            return self._numa_nodes
        nodes = {
            n for devices in self._devices.values() for d in devices.values() for n in d.numa_nodes
        }
        return tuple(sorted(nodes))

    def _recompute_allocated(self) -> None:
        """``allocatedDevices = podDevices.devices()``: what containers hold, per resource."""
        allocated: dict[str, set[str]] = {}
        for containers in self._pod_devices.values():
            for resources in containers.values():
                for resource, entry in resources.items():
                    allocated.setdefault(resource, set()).update(entry.device_ids)
        self._allocated = allocated

    def remove_pods(self, pod_uids: Iterable[str]) -> None:
        """Forget the pods' devices (they ended, or were rejected) and write the checkpoint."""
        uids = list(pod_uids)
        removed = [uid for uid in uids if self._pod_devices.pop(uid, None) is not None]
        for uid in uids:
            self._reuse.pop(uid, None)
        if removed:
            self._recompute_allocated()
            self.write_checkpoint()
            self._notify()

    def update_allocated_devices(self) -> None:
        """Reclaim the devices of pods that are no longer active (``UpdateAllocatedDevices``)."""
        if self.active_pods is None:
            return
        active = set(self.active_pods())
        stale = sorted(set(self._pod_devices) - active)
        if stale:
            _log.info("reclaiming devices of inactive pods", pods=stale)
            self.remove_pods(stale)

    def _ordered(self, resource: str, ids: Iterable[str]) -> list[str]:
        """``ids`` in the plugin's device order (unknown IDs last, sorted)."""
        position = {d: i for i, d in enumerate(self._devices.get(resource, {}))}
        return sorted(ids, key=lambda d: (position.get(d, len(position)), d))

    # --- checkpoint ------------------------------------------------------------------------

    def checkpoint_data(self) -> ckpt.CheckpointData:
        entries = tuple(
            ckpt.PodDevicesEntry(
                pod_uid=e.pod_uid,
                container_name=e.container,
                resource_name=e.resource,
                device_ids=dict(e.by_numa),
                alloc_resp=e.response.SerializeToString(),
            )
            for e in self.allocations()
        )
        registered = {r: tuple(sorted(ids)) for r, ids in self._healthy.items()}
        return ckpt.CheckpointData(entries, registered)

    def write_checkpoint(self) -> None:
        """Write ``kubelet_internal_checkpoint`` (if configured); failures are logged, as the
        kubelet does, never raised into an update or an admission."""
        if self.checkpoint_dir is None:
            return
        try:
            ckpt.write_checkpoint(self.checkpoint_dir, self.checkpoint_data())
        except OSError as exc:
            _log.error("failed to write checkpoint file", error=str(exc))
            return
        self.checkpoint_writes += 1

    def _read_checkpoint(self) -> None:
        """Load allocations from the checkpoint (the kubelet's ``readCheckpoint`` on start).

        Registered resources come back with no devices (capacity 0 until their plugin
        registers again); a missing file means a fresh node; a corrupt one is logged and
        ignored, and the kubelet starts with what it has.
        """
        if self.checkpoint_dir is None:
            return
        try:
            data = ckpt.read_checkpoint(self.checkpoint_dir)
        except ckpt.CheckpointError as exc:
            _log.error("continue after failing to read checkpoint file", error=str(exc))
            return
        self._pod_devices = {}
        if data is None:
            return
        for entry in data.entries:
            response = api_pb2.ContainerAllocateResponse()
            try:
                response.ParseFromString(entry.alloc_resp)
            except Exception as exc:  # protobuf's DecodeError; the kubelet skips the entry
                _log.error("cannot unmarshal allocResp", pod=entry.pod_uid, error=str(exc))
                continue
            self._pod_devices.setdefault(entry.pod_uid, {}).setdefault(entry.container_name, {})[
                entry.resource_name
            ] = ContainerAllocation(
                entry.pod_uid,
                entry.container_name,
                entry.resource_name,
                entry.all_device_ids(),
                dict(entry.device_ids),
                response,
            )
        self._recompute_allocated()
        for resource in data.registered_devices:
            self._healthy.setdefault(resource, set())
            self._unhealthy.setdefault(resource, set())
            self._devices.setdefault(resource, {})

    # --- topology hints (kubelet-behaviour.md §3) --------------------------------------------

    def _numa_map(self, resource: str, extra: Iterable[str] = ()) -> dict[str, tuple[int, ...]]:
        numa = self.device_numa(resource)
        for d in extra:
            numa.setdefault(d, ())  # held or reusable but gone from the snapshot: no NUMA
        return numa

    def _hints_for(
        self, resource: str, available: Collection[str], reusable: Collection[str], request: int
    ) -> list[TopologyHint]:
        return generate_hints(
            available,
            reusable,
            request,
            self._numa_map(resource, [*available, *reusable]),
            self.numa_nodes(),
        )

    def _device_requests(self, containers: Iterable[Container]) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in containers:
            for resource, quantity in c.limits.items():
                if self.is_device_plugin_resource(resource):
                    out[resource] = quantity.int_value
        return out

    def container_hints(self, pod: Pod, container: Container) -> ProviderHints:
        """The kubelet's ``GetTopologyHints`` for one container."""
        self.update_allocated_devices()
        return {
            resource: self._resource_hints(
                resource,
                requested,
                self.container_devices(pod.uid, container.name, resource) or frozenset(),
                self.reusable_devices(pod.uid, resource),
            )
            for resource, requested in sorted(self._device_requests([container]).items())
        }

    def pod_hints(self, pod: Pod) -> ProviderHints:
        """The kubelet's ``GetPodTopologyHints``: the effective pod request, no reuse."""
        self.update_allocated_devices()
        return {
            resource: self._resource_hints(
                resource,
                pod.effective_count(resource),
                self.pod_devices(pod.uid, resource),
                frozenset(),
            )
            for resource in sorted(self._device_requests(pod.all_containers))
        }

    def _resource_hints(
        self,
        resource: str,
        requested: int,
        allocated: frozenset[str],
        reusable: frozenset[str],
    ) -> list[TopologyHint] | None:
        """One resource's hints, the same for both scopes: None without NUMA alignment; for
        devices already held, hints over them if the count still matches (else none); else
        hints over what is free plus reusable, none when that is too little."""
        if not self.has_topology_alignment(resource):
            return None
        if allocated:
            if len(allocated) != requested:
                return []
            return self._hints_for(resource, allocated, (), requested)
        available = self.available_devices(resource)
        if len(available | reusable) < requested:
            return []
        return self._hints_for(resource, available, reusable, requested)

    # --- allocation (kubelet-behaviour.md §5) ------------------------------------------------

    def filter_by_affinity(
        self, pod_uid: str, container: str, resource: str, available: Collection[str]
    ) -> tuple[list[str], list[str], list[str]]:
        """Split ``available`` by the stored hint: aligned, unaligned, no NUMA information.

        Without alignment for the resource, or with a nil hint, everything is "no affinity".
        A device on several NUMA nodes is aligned when any of them is in the hint.
        """
        ordered = self._ordered(resource, available)
        hint = self.store.get_affinity(pod_uid, container) if self.store is not None else None
        mask = hint.numa_affinity if hint is not None else None
        if mask is None or not self.has_topology_alignment(resource):
            return [], [], ordered
        numa = self.device_numa(resource)
        aligned, unaligned, none = [], [], []
        for d in ordered:
            nodes = numa.get(d, ())
            if not nodes:
                none.append(d)
            elif any(mask.is_set(n) for n in nodes):
                aligned.append(d)
            else:
                unaligned.append(d)
        return aligned, unaligned, none

    async def _preferred(
        self, resource: str, available: Iterable[str], must_include: Iterable[str], size: int
    ) -> set[str]:
        answer = await self.get_preferred_allocation(
            resource,
            self._ordered(resource, available),
            self._ordered(resource, must_include),
            size,
        )
        return set(answer or ())

    async def devices_to_allocate(
        self,
        pod_uid: str,
        container: str,
        resource: str,
        required: int,
        reusable: Collection[str] = (),
    ) -> list[str] | None:
        """The kubelet's ``devicesToAllocate``: which devices the container gets.

        None when there is nothing to allocate (the container already holds its devices).
        Taken devices are marked allocated at once. Raises :class:`AllocationError` with the
        kubelet's text, or :class:`DevicePluginError` when GetPreferredAllocation fails.
        """
        needed = required
        held = self.container_devices(pod_uid, container, resource)
        if held is not None:
            needed -= len(held)
            if needed != 0:
                raise AllocationError(
                    f"pod {go_quote(pod_uid)} container {go_quote(container)} changed request "
                    f"for resource {go_quote(resource)} from {len(held)} to {required}"
                )
        healthy = self._healthy.get(resource)
        if healthy is None:
            raise AllocationError(f"cannot allocate unregistered device {resource}")
        if not healthy:
            raise AllocationError(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        if held is not None and not held <= healthy:
            raise AllocationError(
                "previously allocated devices are no longer healthy; "
                f"cannot allocate unhealthy devices {resource}"
            )
        if needed == 0:
            return None

        allocated: list[str] = []

        def take_from(devices: Iterable[str]) -> bool:
            """Take devices until none is needed any more; True when done."""
            nonlocal needed
            in_use = self._allocated.setdefault(resource, set())
            for d in self._ordered(resource, devices):
                if d in allocated:
                    continue
                in_use.add(d)
                allocated.append(d)
                needed -= 1
                if needed == 0:
                    return True
            return False

        if take_from(reusable):
            return allocated
        available = healthy - self._allocated.get(resource, set())
        if len(available) < needed:
            raise AllocationError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        aligned, unaligned, no_affinity = self.filter_by_affinity(
            pod_uid, container, resource, available
        )
        if needed < len(aligned):
            # All of it can come from the aligned devices: let the plugin choose among them.
            preferred = await self._preferred(resource, {*aligned, *allocated}, allocated, required)
            if take_from(preferred & set(aligned)) or take_from(aligned):
                return allocated
        else:
            # Take every aligned device first (the alignment the topology manager promised),
            # then let the plugin choose the rest among everything available.
            if take_from(aligned):
                return allocated
            preferred = await self._preferred(
                resource, {*available, *allocated}, allocated, required
            )
            if take_from(preferred & available) or take_from(unaligned) or take_from(no_affinity):
                return allocated
        raise AllocationError(
            "unexpectedly allocated less resources than required. "
            f"Requested: {required}, Got: {required - needed}"
        )

    async def allocate_container_resources(
        self, pod: Pod, container: Container, reusable: Mapping[str, Collection[str]]
    ) -> None:
        """Every device resource of the container: choose, Allocate on the plugin, record.

        Resources go in name order (the kubelet ranges over a Go map). Raises
        :class:`AllocationError` or :class:`DevicePluginError` (both reject the pod).
        """
        collected = False
        changed = False
        for resource in sorted(container.limits):
            if not self.is_device_plugin_resource(resource):
                continue
            if not collected:
                self.update_allocated_devices()
                collected = True
            needed = container.limits[resource].int_value
            devices = await self.devices_to_allocate(
                pod.uid, container.name, resource, needed, reusable.get(resource, ())
            )
            if not devices:
                continue
            changed = True
            if self.primary(resource) is None:
                self._recompute_allocated()
                raise AllocationError(f"unknown Device Plugin {resource}")
            try:
                response = await self.allocate(resource, devices)
            except DevicePluginError:
                self._recompute_allocated()
                raise
            numa = self.device_numa(resource)
            by_numa: dict[int, list[str]] = {}
            for d in devices:
                for node in numa.get(d) or (ckpt.NO_NUMA,):
                    by_numa.setdefault(node, []).append(d)
            self._pod_devices.setdefault(pod.uid, {}).setdefault(container.name, {})[resource] = (
                ContainerAllocation(
                    pod.uid,
                    container.name,
                    resource,
                    frozenset(devices),
                    {n: tuple(self._ordered(resource, ids)) for n, ids in sorted(by_numa.items())},
                    response,
                )
            )
            _log.info(
                "devices allocated",
                pod=pod.name,
                container=container.name,
                resource=resource,
                devices=self._ordered(resource, devices),
            )
        if changed:
            self.write_checkpoint()
            self._notify()

    async def allocate_container(self, pod: Pod, container: Container) -> None:
        """The kubelet's ``Allocate(pod, container)``, with init-container device reuse.

        A regular init container's devices go into the pod's reusable pool (the next
        containers may take them, since init containers run one at a time and finish); a
        restartable init container (sidecar) and an app container keep what they take, so it
        leaves the pool. Only the pod being admitted keeps a pool.
        """
        for uid in [u for u in self._reuse if u != pod.uid]:
            del self._reuse[uid]
        reuse = self._reuse.setdefault(pod.uid, {})
        await self.allocate_container_resources(pod, container, reuse)
        held = self._pod_devices.get(pod.uid, {}).get(container.name, {})
        regular_init = container.init and not container.restartable
        for resource, entry in held.items():
            pool = reuse.setdefault(resource, set())
            if regular_init:
                pool |= entry.device_ids
            else:
                pool -= entry.device_ids

    async def pre_start(self, pod_uid: str, container: str, resource: str) -> bool:
        """PreStartContainer for one resource if the plugin asked for it; True if called."""
        if not self._primary_or_error(resource).options.pre_start_required:
            return False
        devices = self.container_devices(pod_uid, container, resource)
        if devices is None:
            raise DevicePluginError(
                f"no devices found allocated in local cache for pod {pod_uid}, "
                f"container {container}, resource {resource}"
            )
        return await self.pre_start_container(resource, self._ordered(resource, devices))

    async def prepare_container(self, pod: Pod, container: Container) -> dict[str, str]:
        """What the kubelet does when it creates the container (``GetDeviceRunContainerOptions``):
        PreStartContainer where the plugin asked for it (30 s deadline), then the environment
        from the stored Allocate responses (the first value of a name wins)."""
        envs: dict[str, str] = {}
        for resource in sorted(container.limits):
            if (
                not self.is_device_plugin_resource(resource)
                or container.limits[resource].int_value == 0
            ):
                continue
            await self.pre_start(pod.uid, container.name, resource)
        for _, entry in sorted(self._pod_devices.get(pod.uid, {}).get(container.name, {}).items()):
            for name, value in entry.response.envs.items():
                envs.setdefault(name, value)
        return envs

    # --- the synchronous seam --------------------------------------------------------------

    def call_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the device manager's loop from a synchronous caller and wait.

        From a worker thread (``asyncio.to_thread``) it is handed to the loop; with no loop
        running anywhere it runs on a fresh one. On the loop's own thread it cannot wait
        without deadlocking, which is a programming error.
        """
        loop = self._loop
        if loop is not None and loop.is_running() and not loop.is_closed():
            if _running_loop() is loop:
                coro.close()
                raise RuntimeError(
                    "the topology manager must not run on the device manager's event loop: "
                    "call it in a worker thread (await asyncio.to_thread(manager.admit, pod))"
                )
            return asyncio.run_coroutine_threadsafe(coro, loop).result()
        return asyncio.run(coro)

    def call_on_loop(self, fn: Callable[[], T]) -> T:
        """Run a synchronous read of the state on the loop's thread (where it is mutated)."""
        loop = self._loop
        if loop is None or not loop.is_running() or loop.is_closed() or _running_loop() is loop:
            return fn()

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), loop).result()

    @property
    def hint_provider(self) -> DeviceHintProvider:
        """This device manager as a topology-manager hint provider."""
        return DeviceHintProvider(self)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class DeviceHintProvider:
    """The device manager as the topology manager's ``HintProvider`` (hints, then allocate).

    A thin adapter: each call runs on the device manager's loop; plugin failures become
    :class:`AllocationError` (the pod is rejected with ``UnexpectedAdmissionError``).
    """

    def __init__(self, manager: DeviceManager) -> None:
        self.manager = manager

    def get_topology_hints(self, pod: Pod, container: Container) -> ProviderHints:
        return self.manager.call_on_loop(lambda: self.manager.container_hints(pod, container))

    def get_pod_topology_hints(self, pod: Pod) -> ProviderHints:
        return self.manager.call_on_loop(lambda: self.manager.pod_hints(pod))

    def allocate(self, pod: Pod, container: Container) -> None:
        try:
            self.manager.call_sync(self.manager.allocate_container(pod, container))
        except DevicePluginError as exc:
            raise AllocationError(str(exc)) from None
