"""The v1beta1 DevicePlugin service for one resource, and the unix socket it is served on.

:class:`DevicePluginService` answers the kubelet from values fixed at start (the GPUs, the
precomputed allocation policy, the options) plus the current health map, which the health monitor
updates through :meth:`DevicePluginService.set_health`. Nothing here touches NVML: a
GetPreferredAllocation asks the policy on a worker thread, whatever health is doing.

Health changes are coalesced: the first change after a quiet spell is sent at once, later ones
at most once per interval, with the latest map. A storm of changes (many GPUs failing and
recovering, on a node advertising thousands of time-sliced replicas) thus costs one device list
per interval, shared by every ListAndWatch stream, instead of one per change: the event loop
stays free for the kubelet's RPCs and the health checks, and the kubelet, which parses each
list and writes its checkpoint after it, gets a few lists a second, not a hundred. The interval
grows with the list, as the cost of a list does on both sides (:func:`publish_interval`): 8000
devices, 0.4 s; 16 GPUs, 0.8 ms, so a small node sends every change as it comes.

:class:`PluginSocket` owns one ``grpc.aio`` server on ``<dir>/nvplugin-<short>.sock``. The kubelet
deletes every socket in its directory when it restarts, so the daemon stops the old server and
starts a new one on the same path (:mod:`nvplugin.plugin.registration` decides when); the service
object, and with it the health state, lives on across those restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import math
import os
import socket
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from nvplugin.allocator import AllocationError, Policy
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.errors import NvpluginError, shortened
from nvplugin.log import get_logger
from nvplugin.node.model import Gpu
from nvplugin.plugin.listing import device_message
from nvplugin.plugin.migstrategy import ServedMig
from nvplugin.plugin.responses import Responder
from nvplugin.plugin.sharing import NOT_SHARED, Device, Replicas, sorted_replicas

PUBLISH_S_PER_DEVICE = 50e-6
"""Seconds between two device lists, per advertised device. A list costs the loop ~0.5 us per
device to build and ~0.15 us per device per stream to serialize (8000 devices: ~4 ms, and ~1 ms
per stream), and the kubelet a parse and a checkpoint write; this keeps a storm's lists to about
1% of the loop whatever the node's size: 8000 devices get at most 2.5 lists a second."""
MAX_PUBLISH_INTERVAL_S = 1.0
"""However long the list, a change waits at most this long to be sent."""


def publish_interval(devices: int) -> float:
    """The least time between two lists sent to the streams, for ``devices`` devices."""
    return min(MAX_PUBLISH_INTERVAL_S, devices * PUBLISH_S_PER_DEVICE)


class BadRequest(Exception):
    """A request the kubelet should not have sent; becomes INVALID_ARGUMENT with this message."""


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """DevicePlugin for one resource over a fixed set of GPUs, or of MIG devices (``migs``;
    ``gpus`` are then their parents, whose health they take, and ``policy`` allocates positions
    in ``migs``).

    ``policy`` may still be computing when the service starts (the daemon serves the socket, and
    so health checks, while it builds, and registers once it is ready): GetPreferredAllocation
    awaits it; nothing else needs it.
    """

    def __init__(
        self,
        resource_name: str,
        gpus: Sequence[Gpu],
        policy: Policy | asyncio.Future[Policy],
        *,
        responder: Responder | None = None,
        pre_start_required: bool = False,
        health: Mapping[int, bool] | None = None,
        replicas: Replicas = NOT_SHARED,
        migs: Sequence[ServedMig] = (),
        publish_interval_s: float | None = None,
    ) -> None:
        """``publish_interval_s``: the least time between two lists (None: by the number of
        devices, :func:`publish_interval`)."""
        self.resource_name = resource_name
        self._gpus = tuple(sorted(gpus, key=lambda gpu: gpu.index))
        # What is advertised: each GPU (MIG device) once (ID = UUID), or ``replicas.count``
        # times (time-slicing).
        self._replicas = replicas
        self._devices_list = replicas.devices(self._gpus, migs)
        self._by_id = {device.id: device for device in self._devices_list}
        self._runs = _device_runs(self._devices_list)
        self._policy = policy
        self._responder = responder if responder is not None else Responder()
        self._options = api_pb2.DevicePluginOptions(
            pre_start_required=pre_start_required, get_preferred_allocation_available=True
        )
        self._health = {gpu.index: True for gpu in self._gpus}
        if health is not None:
            self._health.update({i: h for i, h in health.items() if i in self._health})
        # What the streams were last sent (``_health`` may be newer while a publish is due).
        self._published = dict(self._health)
        self._version = 0
        self._snapshot = self._build_snapshot()
        self._interval = (
            publish_interval(len(self._devices_list))
            if publish_interval_s is None
            else publish_interval_s
        )
        self._published_at = -math.inf  # loop time of the last publish
        self._due: asyncio.TimerHandle | None = None  # the coalesced publish, when one is due
        self._coalesced = 0  # changes taken since the last publish
        self._changed = asyncio.Event()
        self._closing = False
        self._streams = 0
        self._log = get_logger("nvplugin.plugin", resource=resource_name)
        self._health_watchers: list[Callable[[dict[int, bool]], None]] = []

    # --- state ---

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        return self._gpus

    @property
    def devices(self) -> tuple[Device, ...]:
        """What ListAndWatch advertises: the GPUs, or their replicas (index, then replica order)."""
        return self._devices_list

    @property
    def replicas(self) -> Replicas:
        return self._replicas

    @property
    def health(self) -> dict[int, bool]:
        """The latest health map taken (the streams get it within the interval)."""
        return dict(self._health)

    @property
    def options(self) -> api_pb2.DevicePluginOptions:
        return self._options

    @property
    def open_streams(self) -> int:
        """ListAndWatch streams being served right now."""
        return self._streams

    def set_health(self, health: Mapping[int, bool]) -> None:
        """Take a new health map (index -> healthy); the streams get it now, or -- when the last
        list went out less than the interval ago -- with the next list, coalesced with whatever
        changes come meanwhile.

        Must run on the event loop thread (the health monitor's thread hands over with
        ``loop.call_soon_threadsafe``). Indices this resource does not advertise are ignored.
        """
        new = dict(self._health)
        new.update({i: bool(h) for i, h in health.items() if i in new})
        if new == self._health:
            return
        self._health = new
        self._coalesced += 1
        if self._due is not None or self._closing:
            return  # the publish already due takes the latest map
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a caller outside one): nothing to wait on
            self._publish()
            return
        due = self._published_at + self._interval
        if loop.time() >= due:
            self._publish()
        else:
            self._due = loop.call_at(due, self._publish)

    def watch_health(self, callback: Callable[[dict[int, bool]], None]) -> None:
        """Call ``callback`` (on the loop) with the health map now and after every change: the
        gRPC health service and the metrics follow the same map the streams get."""
        self._health_watchers.append(callback)
        callback(dict(self._published))

    def _tell_watchers(self) -> None:
        for callback in self._health_watchers:
            try:
                callback(dict(self._published))
            except Exception as exc:  # a broken observer must not stop health updates
                self._log.error("health watcher failed", error=repr(exc))

    def close(self) -> None:
        """End every ListAndWatch stream (cleanly, status OK) and refuse new ones."""
        self._closing = True
        if self._due is not None:
            self._due.cancel()
            self._due = None
        self._wake()

    def uuids(self) -> list[str]:
        """UUIDs of what this resource serves (its GPUs, or its MIG devices), in index order."""
        return [device.uuid for device in self._devices_list if not device.replica]

    def unhealthy_uuids(self) -> list[str]:
        """UUIDs of this resource's Unhealthy GPUs (MIG devices: all of an Unhealthy parent's),
        in index order (as last sent)."""
        return [
            device.uuid
            for device in self._devices_list
            if not device.replica and not self._published[device.gpu.index]
        ]

    def _publish(self) -> None:
        """Send the latest map to every stream (one list for all of them) and the watchers."""
        self._due = None
        previous, self._published = self._published, dict(self._health)
        coalesced, self._coalesced = self._coalesced, 0
        with contextlib.suppress(RuntimeError):
            self._published_at = asyncio.get_running_loop().time()
        changed = [i for i in sorted(self._published) if self._published[i] != previous[i]]
        if not changed:
            return  # changes that undid each other meanwhile: nothing to tell
        self._log.info(
            "device health changed",
            changed=[{"gpu": i, "healthy": self._published[i]} for i in changed],
            unhealthy=self.unhealthy_uuids(),
            streams=self._streams,
            coalesced=coalesced,
        )
        self._version += 1
        self._snapshot = self._build_snapshot()
        self._wake()
        self._tell_watchers()

    def _wake(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    def _build_snapshot(self) -> api_pb2.ListAndWatchResponse:
        """The list for the published map, from each GPU's devices serialized once per state
        (a serialized message is the concatenation of its devices): parsing 8000 devices takes
        a few milliseconds, building them field by field several times that."""
        data = b"".join(run.encoded[self._published[run.gpu]] for run in self._runs)
        return api_pb2.ListAndWatchResponse.FromString(data)

    # --- RPCs ---

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Any
    ) -> api_pb2.DevicePluginOptions:
        self._log.debug("rpc", method="GetDevicePluginOptions")
        return self._options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Any
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        self._streams += 1
        self._log.debug("rpc", method="ListAndWatch", phase="opened", streams=self._streams)
        sent = -1
        try:
            while not self._closing:
                if sent != self._version:
                    sent = self._version
                    yield self._snapshot
                    continue
                await self._changed.wait()
        finally:
            self._streams -= 1
            self._log.debug("rpc", method="ListAndWatch", phase="ended")

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        started = time.perf_counter()
        try:
            policy = await self._current_policy()
            # On a worker thread: a search may take the policy's whole time budget, and health
            # checks, ListAndWatch and other RPCs must keep answering meanwhile.
            response = await asyncio.to_thread(self._preferred, policy, request)
        except BadRequest as exc:
            self._log.debug("rpc", method="GetPreferredAllocation", error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises
        self._log.debug(
            "rpc",
            method="GetPreferredAllocation",
            ms=round((time.perf_counter() - started) * 1000, 3),
            answers=[list(r.deviceIDs) for r in response.container_responses],
        )
        return response

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: Any
    ) -> api_pb2.AllocateResponse:
        try:
            # Check every container request before building anything: nothing is applied when
            # one ID is bad.
            total = len(request.container_requests)
            chosen = [
                self._devices(c.devices_ids, _where("devices_ids", n, total))
                for n, c in enumerate(request.container_requests)
            ]
            for n, devices in enumerate(chosen):
                too_many = self._replicas.too_many(len(devices))
                if too_many is not None:
                    raise BadRequest(f"{_where('devices_ids', n, total)}: {too_many}")
        except BadRequest as exc:
            self._log.debug("rpc", method="Allocate", error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        # Replicas back to their GPUs (MIG devices): the responder lists each once, in index
        # order (the container sees devices, not replicas).
        response = api_pb2.AllocateResponse(
            container_responses=[self._responder.container_response(devices) for devices in chosen]
        )
        self._log.debug(
            "rpc", method="Allocate", devices=[[d.id for d in devices] for devices in chosen]
        )
        return response

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Any
    ) -> api_pb2.PreStartContainerResponse:
        self._log.debug("rpc", method="PreStartContainer", devices=list(request.devices_ids))
        return api_pb2.PreStartContainerResponse()

    # --- request checks ---

    async def _current_policy(self) -> Policy:
        if isinstance(self._policy, asyncio.Future):
            return await asyncio.shield(self._policy)
        return self._policy

    def _devices(self, ids: Iterable[str], where: str) -> list[Device]:
        """The devices named by ``ids``, in index (then replica) order; BadRequest for unknown
        or repeated IDs."""
        seen: dict[str, Device] = {}
        for device_id in ids:
            device = self._by_id.get(device_id)
            if device is None:
                raise BadRequest(f"{where}: unknown device {_shown_id(device_id)}")
            if device_id in seen:
                raise BadRequest(f"{where}: device {_shown_id(device_id)} listed twice")
            seen[device_id] = device
        return sorted_replicas(list(seen.values()))

    def _preferred(
        self, policy: Policy, request: api_pb2.PreferredAllocationRequest
    ) -> api_pb2.PreferredAllocationResponse:
        """The answer for every container request (runs off the event loop: it only reads
        values fixed at start)."""
        response = api_pb2.PreferredAllocationResponse()
        total = len(request.container_requests)
        for number, container in enumerate(request.container_requests):
            response.container_responses.add(
                deviceIDs=self._prefer(policy, container, number, total)
            )
        return response

    def _prefer(
        self,
        policy: Policy,
        container: api_pb2.ContainerPreferredAllocationRequest,
        number: int,
        total: int,
    ) -> list[str]:
        available = self._devices(
            container.available_deviceIDs, _where("available_deviceIDs", number, total)
        )
        must_include = self._devices(
            container.must_include_deviceIDs, _where("must_include_deviceIDs", number, total)
        )
        offered = {device.id for device in available}
        for device in must_include:
            if device.id not in offered:
                where = _where("must_include_deviceIDs", number, total)
                raise BadRequest(f"{where}: device {device.id} is not in available_deviceIDs")
        size = container.allocation_size
        if size < 0:
            raise BadRequest(f"{_where('allocation_size', number, total)}: {size} is negative")
        try:
            if self._replicas.shared:  # replicas: counts per GPU, then the policy among GPUs
                picked = self._replicas.prefer(policy.allocate, available, must_include, size)
                return [device.id for device in picked]
            units = policy.allocate(
                [d.unit for d in available], [d.unit for d in must_include], size
            )
        except AllocationError as exc:  # the checks above should make this unreachable
            raise BadRequest(f"{_where('request', number, total)}: {exc}") from None
        by_unit = {device.unit: device for device in available}
        return [by_unit[u].id for u in sorted(units)]


@dataclass(frozen=True)
class _Run:
    """Consecutive advertised devices of one GPU (a GPU and its replicas), serialized as a
    ListAndWatchResponse fragment for either state: ``encoded[healthy]``."""

    gpu: int
    encoded: tuple[bytes, bytes]  # [False] Unhealthy, [True] Healthy


def _device_runs(devices: Sequence[Device]) -> tuple[_Run, ...]:
    """The advertised devices in their order, grouped in runs of one GPU each."""
    runs = []
    for index, group in itertools.groupby(devices, key=lambda device: device.gpu.index):
        members = list(group)
        runs.append(
            _Run(
                index,
                (_encoded(members, healthy=False), _encoded(members, healthy=True)),
            )
        )
    return tuple(runs)


def _encoded(devices: Sequence[Device], *, healthy: bool) -> bytes:
    listed = [device_message(device, healthy) for device in devices]
    return api_pb2.ListAndWatchResponse(devices=listed).SerializeToString()


MAX_SHOWN_ID = 128
"""Longest device ID quoted whole in an error. The message travels in the gRPC status trailer,
which clients cap (8 KiB by default): a 1 MB ID quoted whole would turn INVALID_ARGUMENT into a
transport error on the kubelet's side."""


def _shown_id(device_id: str) -> str:
    return shortened(device_id, MAX_SHOWN_ID)


def _where(field: str, number: int, total: int) -> str:
    """Where a bad value is: the field, and which container when there are several."""
    return field if total <= 1 else f"container request {number}: {field}"


class PluginSocket:
    """One ``grpc.aio`` server for ``service`` on the unix socket ``path`` (mode 0600).

    ``start`` refuses a path that another live process serves (gRPC would silently take it over)
    and removes a stale socket file. ``intact`` tells whether the path is still our socket: the
    kubelet deletes it when it restarts.
    """

    def __init__(
        self,
        path: str,
        service: DevicePluginService,
        *,
        extra_services: Sequence[Callable[[grpc.aio.Server], None]] = (),
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    ) -> None:
        """``extra_services`` add more servicers to each server (the gRPC health service);
        ``interceptors`` wrap every RPC (metrics)."""
        self.path = path
        self._service = service
        self._extra_services = tuple(extra_services)
        self._interceptors = tuple(interceptors)
        self._server: grpc.aio.Server | None = None
        self._inode: tuple[int, int] | None = None

    async def start(self) -> None:
        claim_socket_path(self.path)
        server = grpc.aio.server(interceptors=self._interceptors or None)
        api_pb2_grpc.add_DevicePluginServicer_to_server(self._service, server)
        for add in self._extra_services:
            add(server)
        try:
            bound = server.add_insecure_port(f"unix:{self.path}")
        except RuntimeError as exc:
            raise NvpluginError(f"cannot serve on {self.path}: {exc}") from None
        if not bound:
            raise NvpluginError(f"cannot serve on {self.path}: gRPC could not bind it")
        try:
            os.chmod(self.path, 0o600)
            info = os.stat(self.path)
        except OSError as exc:  # a kubelet restart deleted it between bind and chmod: retry
            await server.stop(None)
            raise NvpluginError(f"cannot serve on {self.path}: {exc.strerror or exc}") from None
        self._inode = (info.st_dev, info.st_ino)
        await server.start()
        self._server = server

    def intact(self) -> bool:
        """True while ``path`` is the socket this server bound."""
        if self._inode is None:
            return False
        try:
            info = os.stat(self.path)
        except OSError:
            return False
        return (info.st_dev, info.st_ino) == self._inode

    async def stop(self, grace: float | None = 0.2) -> None:
        """Stop serving and remove the socket file, if it is still ours."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        if self.intact():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self._inode = None


def claim_socket_path(path: str) -> None:
    """Make ``path`` free to bind: remove a stale socket, refuse one a live process serves."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise NvpluginError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # stale: nobody listens any more
        return
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.ETIMEDOUT) and not isinstance(exc, TimeoutError):
            raise NvpluginError(f"cannot check whether {path} is in use: {exc}") from None
    finally:
        probe.close()
    raise NvpluginError(
        f"another live process is serving {path}; refusing to take the socket over "
        "(stop that process first, or choose another --device-plugin-dir or --resource-name)"
    )
