"""The v1beta1 DevicePlugin service for one resource, and the unix socket it is served on.

:class:`DevicePluginService` translates between gRPC and the resource manager
(:class:`nvplugin.rm.ResourceManager`: the devices, request checks, preferred allocation, Allocate
responses, the listing): it knows nothing about devices. Its own part is serving -- the options,
the current health map (which the health monitor updates through
:meth:`DevicePluginService.set_health`), the ListAndWatch streams, running preferred allocation
off the event loop -- and the manager's request errors become INVALID_ARGUMENT. Nothing here
touches NVML: a GetPreferredAllocation asks the policy on a worker thread, whatever health is
doing.

A resource whose devices need something besides their GPUs -- an MPS resource its control
daemon -- is *held* while that is missing (:meth:`DevicePluginService.hold`): every device is
Unhealthy, whatever its GPU's health, until the hold is released.

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
starts a new one on the same path (:mod:`nvplugin.plugin.registrar` decides when); the service
object, and with it the health state, lives on across those restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
import os
import socket
import stat
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from nvplugin.allocator import DEFAULT_BUDGET_S, Policy
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.errors import NvpluginError
from nvplugin.log import RateLimited, get_logger
from nvplugin.plugin.executor import Busy, Closed, RequestExecutor
from nvplugin.rm import (
    CheckedRequest,
    ContainerRequest,
    RequestError,
    ResourceManager,
    check_container_count,
)

PUBLISH_S_PER_DEVICE = 50e-6
"""Seconds between two device lists, per advertised device. A list costs the loop a build and
a serialization per stream, both linear in the devices (docs/architecture.md, "Threads and
tasks", has the figures ``python -m bench sharing`` prints), and the kubelet a parse and a
checkpoint write; this keeps a storm's lists to a small share of the loop whatever the node's
size: 8000 devices get at most 2.5 lists a second."""
MAX_PUBLISH_INTERVAL_S = 1.0
"""However long the list, a change waits at most this long to be sent."""


def publish_interval(devices: int) -> float:
    """The least time between two lists sent to the streams, for ``devices`` devices."""
    return min(MAX_PUBLISH_INTERVAL_S, devices * PUBLISH_S_PER_DEVICE)


PREFERRED_SLACK_S = 1.0
"""What a GetPreferredAllocation request gets beyond one container's search budget: the other
containers, the wait for a thread, thread switches on a loaded node."""
_INVALID = grpc.StatusCode.INVALID_ARGUMENT
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_BUSY = grpc.StatusCode.RESOURCE_EXHAUSTED


def preferred_budget(allocation_budget_s: float) -> float:
    """How long one GetPreferredAllocation request may take, every container of it together:
    the config's ``allocationBudget`` (one container's search) and :data:`PREFERRED_SLACK_S`."""
    return allocation_budget_s + PREFERRED_SLACK_S


Reply = TypeVar("Reply")


def _refused(context: Any, status: tuple[grpc.StatusCode, str], empty: Reply) -> Reply:
    """End the RPC with ``status`` (its code and message; the empty reply is not what the
    client gets). Not ``context.abort``: the exception it raises stays in the call's state,
    which the handler's frame in that exception's traceback holds too -- a cycle that keeps the
    request, and whatever the handler built, until the garbage collector comes by (a flood of
    refused 3 MB requests held hundreds of MB that way)."""
    code, message = status
    context.set_code(code)
    context.set_details(message)
    return empty


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """DevicePlugin for one resource: the gRPC face of ``manager``.

    ``policy`` (the resource's, :mod:`nvplugin.rm.policies`) may still be computing when the service
    starts (the daemon serves the socket, and so health checks, while it builds, and registers
    once it is ready): GetPreferredAllocation awaits it; nothing else needs it.
    """

    def __init__(
        self,
        manager: ResourceManager,
        policy: Policy | asyncio.Future[Policy],
        *,
        pre_start_required: bool = False,
        health: Mapping[int, bool] | None = None,
        publish_interval_s: float | None = None,
        executor: RequestExecutor | None = None,
        preferred_budget_s: float = preferred_budget(DEFAULT_BUDGET_S),
    ) -> None:
        """``health``: the health map to start from (GPU index -> healthy; default: all
        healthy); ``publish_interval_s``: the least time between two lists (None: by the
        number of devices, :func:`publish_interval`); ``executor``: the threads that do the
        requests' work (the daemon's, shared by its resources; None: one of its own, closed by
        :meth:`close`); ``preferred_budget_s``: how long one GetPreferredAllocation may take
        (:func:`preferred_budget`)."""
        self.manager = manager
        self.resource_name = manager.name
        self._policy = policy
        self._options = api_pb2.DevicePluginOptions(
            pre_start_required=pre_start_required, get_preferred_allocation_available=True
        )
        self._gpu_health = {gpu: True for gpu in manager.gpus}  # as the health monitor says
        if health is not None:
            self._gpu_health.update({i: h for i, h in health.items() if i in self._gpu_health})
        self._held: str | None = None  # why every device is Unhealthy regardless (hold)
        self._health = dict(self._gpu_health)  # what the devices are: GPU health, unless held
        # What the streams were last sent (``_health`` may be newer while a publish is due).
        self._published = dict(self._health)
        self._version = 0
        self._snapshot = manager.listing(self._published)
        self._interval = (
            publish_interval(len(manager.devices))
            if publish_interval_s is None
            else publish_interval_s
        )
        self._published_at = -math.inf  # loop time of the last publish
        self._due: asyncio.TimerHandle | None = None  # the coalesced publish, when one is due
        self._coalesced = 0  # changes taken since the last publish
        self._changed = asyncio.Event()
        self._closing = False
        self._streams = 0
        self._log = get_logger("nvplugin.plugin", resource=self.resource_name)
        self._own_executor = executor is None
        self._executor = executor if executor is not None else RequestExecutor()
        self._preferred_budget_s = preferred_budget_s
        self._out_of_time = RateLimited(self._log, "warning")
        self._busy = RateLimited(self._log, "warning")
        self._health_watchers: list[Callable[[dict[int, bool]], None]] = []

    # --- state ---

    @property
    def health(self) -> dict[int, bool]:
        """The latest health map taken (the streams get it within the interval)."""
        return dict(self._health)

    @property
    def held(self) -> str | None:
        """Why every device is Unhealthy regardless of its GPU (None: not held)."""
        return self._held

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
        self._gpu_health.update({i: bool(h) for i, h in health.items() if i in self._gpu_health})
        self._take()

    def hold(self, reason: str | None) -> None:
        """Make every device Unhealthy for ``reason`` (None: release; GPU health applies again),
        sent as :meth:`set_health` sends a change. Event loop thread only."""
        if reason == self._held:
            return
        self._held = reason
        self._take()

    def _take(self) -> None:
        """Take the devices' health now (GPU health, unless held) and publish it when due."""
        new = {i: h and self._held is None for i, h in self._gpu_health.items()}
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
        if self._own_executor:
            self._executor.close()

    def uuids(self) -> list[str]:
        """UUIDs of what this resource serves (its GPUs, or its MIG devices), in index order."""
        return self.manager.uuids()

    def unhealthy_uuids(self) -> list[str]:
        """UUIDs of this resource's Unhealthy GPUs (MIG devices: all of an Unhealthy parent's),
        in index order (as last sent)."""
        return self.manager.unhealthy_uuids(self._published)

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
            held=self._held,
            unhealthy=self.unhealthy_uuids(),
            streams=self._streams,
            coalesced=coalesced,
        )
        self._version += 1
        self._snapshot = self.manager.listing(self._published)
        self._wake()
        self._tell_watchers()

    def _wake(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._preferred_budget_s
        remaining = context.time_remaining()  # the client's own deadline, if it gave one
        if remaining is not None:
            deadline = min(deadline, loop.time() + remaining)
        containers = request.container_requests
        total = len(containers)
        try:
            check_container_count(total, "GetPreferredAllocation")
            answers, done = await self._preferred(containers, deadline)
        except RequestError as exc:
            status = (_INVALID, str(exc))
        except Closed as exc:
            status = (_UNAVAILABLE, str(exc))
        else:
            response = api_pb2.PreferredAllocationResponse()
            for ids in answers:
                response.container_responses.add(deviceIDs=ids)
            for _ in range(total - len(answers)):
                response.container_responses.add()  # no preference: the kubelet chooses
            ms = round((time.perf_counter() - started) * 1000, 3)
            if not done:
                self._out_of_time.log(
                    "GetPreferredAllocation out of time",
                    rest="no preference: the kubelet chooses for the containers not answered",
                    answered=len(answers),
                    containers=total,
                    budget_s=self._preferred_budget_s,
                    ms=ms,
                )
            self._log.debug("rpc", method="GetPreferredAllocation", ms=ms, answers=answers)
            return response
        self._log.debug("rpc", method="GetPreferredAllocation", error=status[1])
        return _refused(context, status, api_pb2.PreferredAllocationResponse())

    async def _preferred(
        self, containers: Sequence[api_pb2.ContainerPreferredAllocationRequest], deadline: float
    ) -> tuple[list[list[str]], bool]:
        """The answers reached by the loop time ``deadline``, in order, and whether that is all
        of them. On the request executor, a container at a time: health checks, ListAndWatch
        and other RPCs keep answering, other requests take turns, and the deadline holds however
        long the policy takes (:mod:`.executor`). Every place there taken: no answer."""
        answers: list[list[str]] = []
        if not containers:
            return answers, True
        requests = [
            ContainerRequest(c.available_deviceIDs, c.must_include_deviceIDs, c.allocation_size)
            for c in containers
        ]
        timeout = asyncio.timeout_at(deadline)
        try:
            async with timeout:
                policy = await self._current_policy()
                with self._executor.admitted():
                    run = self._executor.run
                    checked, first = await run(self._check_and_prefer_first, policy, requests)
                    answers.append(first)
                    for one in checked[1:]:
                        answers.append(await run(self.manager.prefer, policy, one))
        except TimeoutError:
            if not timeout.expired():
                raise
            return answers, False
        except Busy as exc:
            self._busy.log(
                "GetPreferredAllocation turned away",
                reason=str(exc),
                rest="no preference: the kubelet chooses",
            )
        return answers, True

    def _check_and_prefer_first(
        self, policy: Policy, requests: list[ContainerRequest]
    ) -> tuple[list[CheckedRequest], list[str]]:
        """The first unit of a GetPreferredAllocation: every container checked, then the first
        one answered (the kubelet's request is one container: one unit, one thread switch)."""
        checked = self.manager.checked(requests)
        return checked, self.manager.prefer(policy, checked[0])

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: Any
    ) -> api_pb2.AllocateResponse:
        containers = request.container_requests
        total = len(containers)
        try:
            check_container_count(total, "Allocate")
            # On the request executor too: the responses' strategies (CDI names, device specs
            # with a stat each) stay off the loop.
            with self._executor.admitted():
                reply = await self._executor.run(
                    self.manager.allocate, [c.devices_ids for c in containers]
                )
        except RequestError as exc:
            status = (_INVALID, str(exc))
        except Busy as exc:
            status = (_BUSY, f"the plugin is busy: {exc}")
        except Closed as exc:
            status = (_UNAVAILABLE, str(exc))
        else:
            self._log.debug("rpc", method="Allocate", containers=total)
            return reply
        self._log.debug("rpc", method="Allocate", error=status[1])
        return _refused(context, status, api_pb2.AllocateResponse())

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Any
    ) -> api_pb2.PreStartContainerResponse:
        self._log.debug("rpc", method="PreStartContainer", devices=list(request.devices_ids))
        return api_pb2.PreStartContainerResponse()

    # --- policy ---

    async def _current_policy(self) -> Policy:
        if isinstance(self._policy, asyncio.Future):
            return await asyncio.shield(self._policy)
        return self._policy


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
