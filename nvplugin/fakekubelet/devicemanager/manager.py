"""The fake kubelet's device manager, the kubelet's ``ManagerImpl`` (``manager.go``;
docs/kubelet-behaviour.md#listandwatch, docs/kubelet-behaviour.md#device-allocation).

All device state lives in :class:`DeviceManager`, keyed by resource: endpoints (newest last =
primary), healthy/unhealthy device sets, every device's NUMA nodes, the devices containers hold
(:mod:`.pod_devices`, kept when a snapshot drops them). On it: the kubelet's calls to the primary
plugin, ``devicesToAllocate`` step by step, a container's allocation with init-container reuse,
PreStartContainer at container start, and the checkpoint (:mod:`.checkpoint`), written after
every device update and allocation and read back by :meth:`DeviceManager.start`. Topology hints
are :mod:`.topology_hints`'s; the topology manager calls in through :mod:`.hint_provider`.

Where the kubelet iterates Go sets (random order) we go in the plugin's device order (its last
ListAndWatch message), so results are repeatable. Everything runs on one asyncio loop (the one
that serves Registration), so the state needs no locks. The manager keeps no history: whoever
follows it (tests, ``nvplugin kubelet``, ``nvplugin admit``) adds a :class:`Listener`, such as
:class:`nvplugin.fakekubelet.observer.Observer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

import nvplugin.fakekubelet.devicemanager.checkpoint as ckpt
import nvplugin.fakekubelet.devicemanager.topology_hints as hints
from nvplugin.api.v1beta1 import api_pb2
from nvplugin.fakekubelet.devicemanager.endpoint import (
    DeviceInfo,
    DevicePluginError,
    Endpoint,
    PluginOptions,
)
from nvplugin.fakekubelet.devicemanager.hint_provider import DeviceHintProvider
from nvplugin.fakekubelet.devicemanager.pod_devices import (
    ContainerAllocation,
    PodDevices,
    by_numa_node,
)
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.fakekubelet.topologymanager.options import go_quote
from nvplugin.fakekubelet.topologymanager.policy import ProviderHints, TopologyHint
from nvplugin.fakekubelet.topologymanager.scope import AllocationError, Store

ENDPOINT_STOP_GRACE_S = 300.0
"""A resource whose last plugin stopped is dropped (capacity 0) after 5 minutes."""

_log = structlog.get_logger("nvplugin.fakekubelet.devicemanager")


class Listener(Protocol):
    """Told what happens to the device manager, on its loop."""

    def devices_received(
        self, resource: str, socket_path: str, devices: tuple[DeviceInfo, ...]
    ) -> None:
        """A ListAndWatch message arrived (before the state is rebuilt from it)."""

    def changed(self) -> None:
        """The state changed: registration, devices, disconnect, allocation, start or stop."""


@dataclass(frozen=True)
class ResourceCapacity:
    """Node status for one resource: capacity = all known devices, allocatable = healthy ones."""

    capacity: int
    allocatable: int


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
        quiet: bool = False,
    ) -> None:
        """``numa_nodes``: the machine's NUMA nodes (default: those the devices name).
        ``store``: where the merged topology hint of a container is read (the topology
        manager; None = no hint). ``checkpoint_dir``: where ``kubelet_internal_checkpoint`` is
        written and read (None = no checkpoint). ``active_pods``: UIDs of the pods still
        running; devices of other pods are reclaimed before hints and allocation, as the
        kubelet's ``UpdateAllocatedDevices`` does (None = every pod stays). ``quiet``: log
        nothing at info level (device managers built in-process by the thousand, as the
        scheduler extender's judges are, would fill its log).
        """
        self._stop_grace_s = stop_grace_s
        self._clock = clock
        self._numa_nodes = tuple(numa_nodes) if numa_nodes is not None else None
        self.store = store
        self._checkpoint = ckpt.CheckpointFile(checkpoint_dir)
        self.active_pods = active_pods
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: list[Listener] = []
        self._pod_devices = PodDevices()
        # pod UID -> resource -> devices its init containers left for later containers
        self._reuse: dict[str, dict[str, set[str]]] = {}
        # Kubelet state, per resource.
        self._endpoints: dict[str, list[Endpoint]] = {}  # newest last = primary
        self._stopped_since: dict[str, float] = {}  # resources whose last endpoint ended
        self._healthy: dict[str, set[str]] = {}
        self._unhealthy: dict[str, set[str]] = {}
        self._devices: dict[str, dict[str, DeviceInfo]] = {}
        self._allocated: dict[str, set[str]] = {}  # devices held by containers
        self._quiet = quiet

    def _say(self, event: str, **details: object) -> None:
        """Log at info level, unless the manager was built ``quiet``."""
        if not self._quiet:
            _log.info(event, **details)

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the state lives on (None before :meth:`start`)."""
        return self._loop

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

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
        self._changed()

    async def stop(self) -> None:
        """Close every plugin connection (the kubelet exits; no disconnect handling runs)."""
        endpoints = [ep for eps in self._endpoints.values() for ep in eps]
        self._endpoints.clear()
        await asyncio.gather(*(ep.close() for ep in endpoints), return_exceptions=True)
        self._changed()

    def _changed(self) -> None:
        for listener in self._listeners:
            listener.changed()

    # --- registration (called by registration.py once dial + options succeeded) ------------

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
        self._say(
            "device plugin registered",
            resource=resource,
            socket=endpoint.socket_path,
            pre_start_required=endpoint.options.pre_start_required,
            get_preferred_allocation_available=endpoint.options.get_preferred_allocation_available,
        )
        self._changed()

    def _devices_received(self, endpoint: Endpoint, devices: tuple[DeviceInfo, ...]) -> None:
        """A snapshot rebuilds the resource's device sets (the kubelet's update callback)."""
        resource = endpoint.resource
        for listener in self._listeners:
            listener.devices_received(resource, endpoint.socket_path, devices)
        self._devices[resource] = {d.id: d for d in devices}
        self._healthy[resource] = {d.id for d in devices if d.healthy}
        self._unhealthy[resource] = {d.id for d in devices if not d.healthy}
        self._devices_updated()

    def _devices_updated(self) -> None:
        """After every device update; the kubelet writes its checkpoint here."""
        self.write_checkpoint()
        self._changed()

    def _plugin_disconnected(self, endpoint: Endpoint, reason: str) -> None:
        resource = endpoint.resource
        endpoints = self._endpoints.get(resource, [])
        if endpoint in endpoints:
            endpoints.remove(endpoint)
        if not endpoints:
            self._endpoints.pop(resource, None)
        self._say(
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
        return hints.has_topology_alignment(self.device_numa(resource))

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

    def ordered(self, resource: str, ids: Iterable[str]) -> list[str]:
        """``ids`` in the plugin's device order (unknown IDs last, sorted)."""
        position = {d: i for i, d in enumerate(self._devices.get(resource, {}))}
        return sorted(ids, key=lambda d: (position.get(d, len(position)), d))

    def numa_nodes(self) -> tuple[int, ...]:
        """The machine's NUMA nodes (given at construction, else those the devices name)."""
        if self._numa_nodes is not None:
            return self._numa_nodes
        nodes = {
            n for devices in self._devices.values() for d in devices.values() for n in d.numa_nodes
        }
        return tuple(sorted(nodes))

    def is_device_plugin_resource(self, resource: str) -> bool:
        """A resource the kubelet knows from a plugin, now or from earlier allocations."""
        return resource in self._healthy or resource in self._allocated

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
        """The primary plugin's preferred devices, as :meth:`Endpoint.get_preferred_allocation`."""
        endpoint = self._primary_or_error(resource)
        return await endpoint.get_preferred_allocation(available, must_include, size)

    async def allocate(
        self, resource: str, device_ids: Sequence[str]
    ) -> api_pb2.ContainerAllocateResponse:
        """Allocate on the primary plugin; the first container response (what the kubelet keeps)."""
        return await self._primary_or_error(resource).allocate(device_ids)

    async def pre_start_container(self, resource: str, device_ids: Sequence[str]) -> bool:
        """Call PreStartContainer (30 s deadline) if the plugin asked for it; True if called."""
        return await self._primary_or_error(resource).pre_start_container(device_ids)

    # --- allocation state (the kubelet's podDevices / allocatedDevices) ----------------------

    def container_devices(
        self, pod_uid: str, container: str, resource: str
    ) -> frozenset[str] | None:
        """Devices a container holds for ``resource``; None when it holds none (no entry)."""
        entry = self._pod_devices.get(pod_uid, container, resource)
        return None if entry is None else entry.device_ids

    def container_allocation(
        self, pod_uid: str, container: str, resource: str
    ) -> ContainerAllocation | None:
        return self._pod_devices.get(pod_uid, container, resource)

    def pod_devices(self, pod_uid: str, resource: str) -> frozenset[str]:
        """Devices of ``resource`` held by any container of the pod."""
        return self._pod_devices.pod_devices(pod_uid, resource)

    def allocations(self) -> list[ContainerAllocation]:
        """Every container allocation, by pod UID, container and resource."""
        return self._pod_devices.allocations()

    def pods(self) -> frozenset[str]:
        """UIDs of the pods holding devices."""
        return self._pod_devices.pods()

    def reusable_devices(self, pod_uid: str, resource: str) -> frozenset[str]:
        """Devices the pod's init containers left for its later containers."""
        return frozenset(self._reuse.get(pod_uid, {}).get(resource, ()))

    def _recompute_allocated(self) -> None:
        """``allocatedDevices = podDevices.devices()``: what containers hold, per resource."""
        self._allocated = self._pod_devices.devices()

    def remove_pods(self, pod_uids: Iterable[str]) -> None:
        """Forget the pods' devices (they ended, or were rejected) and write the checkpoint."""
        uids = list(pod_uids)
        removed = self._pod_devices.remove(uids)
        for uid in uids:
            self._reuse.pop(uid, None)
        if removed:
            self._recompute_allocated()
            self.write_checkpoint()
            self._changed()

    def restore_allocation(
        self, pod_uid: str, container: str, resource: str, device_ids: Iterable[str]
    ) -> None:
        """Record devices a container already holds, as the kubelet's start restores them from
        its checkpoint (no Allocate call): for whoever rebuilds a node's state from outside."""
        ids = frozenset(device_ids)
        groups = by_numa_node(self.ordered(resource, ids), self.device_numa(resource))
        self._pod_devices.insert(
            ContainerAllocation(
                pod_uid,
                container,
                resource,
                ids,
                {n: tuple(d) for n, d in groups.items()},
                api_pb2.ContainerAllocateResponse(),
            )
        )
        self._recompute_allocated()

    def update_allocated_devices(self) -> None:
        """Reclaim the devices of pods that are no longer active (``UpdateAllocatedDevices``)."""
        if self.active_pods is None:
            return
        active = set(self.active_pods())
        stale = sorted(self._pod_devices.pods() - active)
        if stale:
            self._say("reclaiming devices of inactive pods", pods=stale)
            self.remove_pods(stale)

    # --- checkpoint ------------------------------------------------------------------------

    @property
    def checkpoint_writes(self) -> int:
        return self._checkpoint.writes

    def write_checkpoint(self) -> None:
        """Write ``kubelet_internal_checkpoint``: what containers hold, the healthy devices."""
        registered = {r: tuple(sorted(ids)) for r, ids in self._healthy.items()}
        self._checkpoint.write(ckpt.CheckpointData(self._pod_devices.to_entries(), registered))

    def _read_checkpoint(self) -> None:
        """Load allocations from the checkpoint (the kubelet's ``readCheckpoint`` on start);
        registered resources come back with no devices (capacity 0 until their plugin registers
        again)."""
        data = self._checkpoint.read()
        if data is None:
            return
        self._pod_devices = PodDevices.from_entries(data.entries)
        self._recompute_allocated()
        for resource in data.registered_devices:
            self._healthy.setdefault(resource, set())
            self._unhealthy.setdefault(resource, set())
            self._devices.setdefault(resource, {})

    # --- topology hints (docs/kubelet-behaviour.md#topology-hints) ----------------------------

    def _hints(
        self, resource: str, requested: int, held: frozenset[str], reusable: frozenset[str]
    ) -> list[TopologyHint] | None:
        numa, available = self.device_numa(resource), self.available_devices(resource)
        return hints.resource_hints(numa, self.numa_nodes(), requested, held, available, reusable)

    def container_hints(self, pod: Pod, container: Container) -> ProviderHints:
        """The kubelet's ``GetTopologyHints`` for one container."""
        self.update_allocated_devices()
        requests = hints.device_requests([container], self.is_device_plugin_resource)
        return {
            r: self._hints(
                r,
                n,
                self.container_devices(pod.uid, container.name, r) or frozenset(),
                self.reusable_devices(pod.uid, r),
            )
            for r, n in sorted(requests.items())
        }

    def pod_hints(self, pod: Pod) -> ProviderHints:
        """The kubelet's ``GetPodTopologyHints``: the effective pod request, no reuse."""
        self.update_allocated_devices()
        requests = hints.device_requests(pod.all_containers, self.is_device_plugin_resource)
        return {
            r: self._hints(r, pod.effective_count(r), self.pod_devices(pod.uid, r), frozenset())
            for r in sorted(requests)
        }

    # --- allocation (docs/kubelet-behaviour.md#device-allocation) -----------------------------

    def filter_by_affinity(
        self, pod_uid: str, container: str, resource: str, available: Collection[str]
    ) -> tuple[list[str], list[str], list[str]]:
        """Split ``available`` by the stored hint: aligned, unaligned, no NUMA information."""
        hint = self.store.get_affinity(pod_uid, container) if self.store is not None else None
        mask = hint.numa_affinity if hint is not None else None
        if not self.has_topology_alignment(resource):
            mask = None
        return hints.filter_by_affinity(
            self.ordered(resource, available), self.device_numa(resource), mask
        )

    async def _preferred(
        self, resource: str, available: Iterable[str], must_include: Iterable[str], size: int
    ) -> set[str]:
        answer = await self.get_preferred_allocation(
            resource,
            self.ordered(resource, available),
            self.ordered(resource, must_include),
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
            for d in self.ordered(resource, devices):
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
            groups = by_numa_node(devices, self.device_numa(resource))
            self._pod_devices.insert(
                ContainerAllocation(
                    pod.uid,
                    container.name,
                    resource,
                    frozenset(devices),
                    {n: tuple(self.ordered(resource, ids)) for n, ids in groups.items()},
                    response,
                )
            )
            self._say(
                "devices allocated",
                pod=pod.name,
                container=container.name,
                resource=resource,
                devices=self.ordered(resource, devices),
            )
        if changed:
            self.write_checkpoint()
            self._changed()

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
        regular_init = container.init and not container.restartable
        for resource, entry in self._pod_devices.container(pod.uid, container.name).items():
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
        return await self.pre_start_container(resource, self.ordered(resource, devices))

    async def prepare_container(self, pod: Pod, container: Container) -> dict[str, str]:
        """What the kubelet does when it creates the container (``GetDeviceRunContainerOptions``):
        PreStartContainer where the plugin asked for it (30 s deadline), then the environment
        from the stored Allocate responses (the first value of a name wins)."""
        for resource in sorted(container.limits):
            if (
                not self.is_device_plugin_resource(resource)
                or container.limits[resource].int_value == 0
            ):
                continue
            await self.pre_start(pod.uid, container.name, resource)
        return self._pod_devices.container_envs(pod.uid, container.name)

    @property
    def hint_provider(self) -> DeviceHintProvider:
        """This device manager as a topology-manager hint provider."""
        return DeviceHintProvider(self)
