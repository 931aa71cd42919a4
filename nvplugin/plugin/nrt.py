"""``serve`` publishing the node's NodeResourceTopology object (``nvplugin.topology.publish``;
docs/topology.md), through :mod:`nvplugin.kube.nrt`.

:meth:`TopologyPublisher.update` hands over what is served (the node's topology and the plan) and
returns at once; one background task keeps the object in line. It reads the kubelet's pod
resources API (``List`` and ``GetAllocatableResources``, each under a deadline) and builds the
object (:func:`nvplugin.nrt.objects.build_nrt`, off the event loop) whenever something may have
changed: the plan (a re-serve), the kubelet's device checkpoint (it is rewritten on every
allocation and every freed pod: the device-plugin directory is watched), and a slow timer
(``nvplugin.topology.resyncPeriod``), the safety net. The object is written only when it differs
from the last one written; the API is asked only then.

While the pod resources API or the Kubernetes API fails, it retries with capped exponential
backoff, says the outage once and its end, and counts each failure
(``nvplugin_topology_failures_total``); the daemon serves on meanwhile, untouched. The object is
owned by the Node (its uid read once, ``get`` of the Node) and left in place when the plugin
stops: a restarted plugin brings it up to date.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

import grpc

from nvplugin.api.podresources.v1 import api_pb2, api_pb2_grpc
from nvplugin.backoff import Backoff, Retry
from nvplugin.config.model import Config, TopologyConfig
from nvplugin.config.pod import PodIdentity
from nvplugin.errors import NvpluginError
from nvplugin.node.model import Topology
from nvplugin.nrt.bestgroups import BestGroups
from nvplugin.nrt.kubeletconfig import merged, read_policies, read_reserved_cpu
from nvplugin.nrt.objects import KubeletPolicies, build_nrt
from nvplugin.nrt.volcano import build_numatopology
from nvplugin.plugin.metrics import Metrics
from nvplugin.plugin.publisher import ApiPublisher
from nvplugin.plugin.registrar import DirWatcher
from nvplugin.plugin.tasks import Tasks
from nvplugin.rm.plan import ResourcePlan

PODRESOURCES_S = 5.0
"""Longest wait for one pod resources call."""
MAX_MESSAGE = 64 * 1024 * 1024
"""Largest pod resources answer read (the kubelet's own limit is 16 MiB)."""


@dataclass(frozen=True)
class Served:
    """What the object is built from, besides the kubelet's answers."""

    settings: TopologyConfig
    device_plugin_dir: str
    topology: Topology
    plan: ResourcePlan


class PodResourcesReader:
    """``List`` and ``GetAllocatableResources`` on the kubelet's socket, over one channel kept
    between reads (a failed read closes it; the next read dials again, so a restarted kubelet's
    new socket is found)."""

    def __init__(self, socket: str, timeout: float = PODRESOURCES_S) -> None:
        self.socket = socket
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None

    async def read(
        self,
    ) -> tuple[api_pb2.ListPodResourcesResponse, api_pb2.AllocatableResourcesResponse]:
        """Both answers; NvpluginError naming the socket when either fails."""
        if self._channel is None:
            if not os.path.exists(self.socket):
                raise NvpluginError(f"pod resources socket {self.socket} does not exist (yet)")
            options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
            self._channel = grpc.aio.insecure_channel(f"unix:{self.socket}", options=options)
        stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        try:
            listed = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)
            allocatable = await stub.GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            await self.close()
            raise NvpluginError(
                f"pod resources on {self.socket} failed ({exc.code().name}): {exc.details()}"
            ) from None
        return listed, allocatable

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()


class TopologyPublisher(ApiPublisher):
    """Publishes the node's NRT object (see the module docstring); the arguments:
    :class:`~nvplugin.plugin.publisher.ApiPublisher`'s."""

    def __init__(
        self,
        pod: PodIdentity,
        metrics: Metrics,
        *,
        tasks: Tasks,
        backoff: tuple[float, float] = (0.5, 10.0),
    ) -> None:
        super().__init__(pod, metrics, tasks=tasks, backoff=backoff, logger="nvplugin.topology")
        self._served: Served | None = None
        self._dirty = asyncio.Event()  # something may have changed since the last pass
        self._stored: dict[str, dict[str, Any]] = {}  # by kind: as the API last returned it
        self._running = False
        self.published: dict[str, dict[str, Any]] = {}
        """By kind, the object last written (or found already saying it)."""
        self.last_write: float | None = None
        """``time.monotonic()`` of the last write (bench: allocation to update)."""

    def update(self, config: Config, topology: Topology | None, plan: ResourcePlan | None) -> None:
        """Publish for what is served now (soon; never blocks). Nothing while the setting is
        off or no GPU is served yet."""
        if not config.topology.publish or topology is None or plan is None:
            return
        if self._refused(self._problem(), "NodeResourceTopology object"):
            return
        self._served = Served(config.topology, config.device_plugin_dir, topology, plan)
        self._dirty.set()
        if not self._running:
            self._running = True
            self._tasks.spawn(self._run(), "nvplugin-topology")

    def _problem(self) -> str | None:
        if not self._pod.node_name:
            return "NODE_NAME is not set (the downward API's spec.nodeName)"
        return self._pod.access.problem()

    async def _run(self) -> None:
        from nvplugin.kube.node import API_JITTER, Outage

        served = self._served
        assert served is not None
        tasks, watcher = self._watch(served.device_plugin_dir)
        api_outage = Outage(Backoff(*self._backoff, jitter=API_JITTER), self._log)
        kubelet_retry = Retry(Backoff(*self._backoff, jitter=API_JITTER))
        kubelet_failures = 0
        loop = asyncio.get_running_loop()
        built_for: Served | None = None
        groups: BestGroups | None = None
        policies = KubeletPolicies()
        reserved_cpu = "0"
        client: Any = None
        owner: str | None = None
        reader: PodResourcesReader | None = None
        try:
            while True:
                self._dirty.clear()
                served = self._served
                assert served is not None
                if served.device_plugin_dir != watcher.directory:  # a reload moved it
                    await tasks.close()
                    tasks, watcher = self._watch(served.device_plugin_dir)
                if built_for is None or served.topology is not built_for.topology:
                    groups = await asyncio.to_thread(BestGroups, served.topology)
                if built_for is None or served.settings != built_for.settings:
                    policies, reserved_cpu = await asyncio.to_thread(
                        self._policies, served.settings
                    )
                built_for = served
                wait = served.settings.resync_s
                socket = served.settings.pod_resources_socket
                if reader is None or reader.socket != socket:
                    if reader is not None:
                        await reader.close()
                    reader = PodResourcesReader(socket)
                try:
                    listed, allocatable = await reader.read()
                except NvpluginError as exc:
                    self._metrics.topology_failed("podresources")
                    kubelet_failures += 1
                    if kubelet_failures == 1:
                        self._log.warning(
                            "cannot read the kubelet's pod resources; retrying", error=str(exc)
                        )
                    wait = min(wait, kubelet_retry.next())
                else:
                    if kubelet_failures:
                        self._log.info("kubelet's pod resources answering again")
                    kubelet_failures = 0
                    kubelet_retry.reset()
                    objects = await asyncio.to_thread(
                        self._build, served, listed, allocatable, policies, groups, reserved_cpu
                    )
                    try:
                        if client is None:
                            from nvplugin.kube.client import open_client

                            client = await asyncio.to_thread(open_client, self._pod.access)
                        if owner is None:
                            owner = await self._owner(client)
                        for obj in objects:
                            await self._publish(client, obj, owner)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        self._metrics.topology_failed("api")
                        wait = min(wait, api_outage.failed(exc, loop.time()))
                    else:
                        api_outage.over()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._dirty.wait()
        finally:
            await tasks.close()
            if reader is not None:
                with contextlib.suppress(Exception):
                    await reader.close()
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()

    def _build(
        self,
        served: Served,
        listed: api_pb2.ListPodResourcesResponse,
        allocatable: api_pb2.AllocatableResourcesResponse,
        policies: KubeletPolicies,
        groups: BestGroups | None,
        reserved_cpu: str,
    ) -> list[dict[str, Any]]:
        """The objects to publish (off the loop): the NRT object, and Volcano's when asked."""
        node = self._pod.node_name or ""
        topology, plan = served.topology, served.plan
        objects = [build_nrt(node, topology, plan, listed, allocatable, policies, groups)]
        if served.settings.volcano:
            objects.append(
                build_numatopology(
                    node, topology, plan, listed, allocatable, policies, reserved_cpu
                )
            )
        return objects

    def _watch(self, directory: str) -> tuple[Tasks, DirWatcher]:
        """The device-plugin directory's watch and its wake-up, in a lifetime of their own."""
        tasks = Tasks("topology publisher")
        watcher = DirWatcher(directory, "the kubelet's device-plugin directory")
        tasks.spawn(watcher.run(), "nvplugin-topology-watch")
        tasks.spawn(self._forward(watcher), "nvplugin-topology-wake")
        return tasks, watcher

    async def _forward(self, watcher: DirWatcher) -> None:
        """Each change in the device-plugin directory (the checkpoint rewritten) marks the
        state dirty; without inotify, every poll does."""
        while True:
            await watcher.wait(3600.0 if watcher.watching else watcher.poll_s)
            self._dirty.set()

    def _policies(self, settings: TopologyConfig) -> tuple[KubeletPolicies, str]:
        """The kubelet's policies and reserved CPU (the kubelet config file's, the settings
        over them)."""
        from_file, reserved = None, "0"
        if settings.kubelet_config is not None:
            try:
                from_file = read_policies(settings.kubelet_config)
                reserved = read_reserved_cpu(settings.kubelet_config)
            except NvpluginError as exc:
                self._log.error("kubelet config not read; its policies left out", error=str(exc))
        policies = merged(from_file, settings)
        return policies, reserved

    async def _owner(self, client: Any) -> str:
        from nvplugin.kube.nrt import node_uid

        return await node_uid(client, self._pod.node_name or "")

    async def _publish(self, client: Any, obj: dict[str, Any], owner: str) -> None:
        from nvplugin.kube.nrt import owned, publish

        node = self._pod.node_name or ""
        kind = obj["kind"]
        wanted = owned(obj, node, owner)
        if wanted == self.published.get(kind):
            return
        result, self._stored[kind] = await publish(client, wanted, known=self._stored.get(kind))
        self.published[kind] = wanted
        if result != "unchanged":
            self.last_write = time.monotonic()
            self._metrics.topology_written(result)
            self._log.info(f"{result} the {kind} object", object=node)
