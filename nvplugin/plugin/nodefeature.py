"""``serve`` publishing the node's labels as NFD's NodeFeature object (GPU Feature Discovery's
NodeFeature API mode, ``flags.useNodeFeatureAPI``), through :mod:`nvplugin.kube.nodefeature`.

:meth:`NodeFeaturePublisher.want` hands over the labels to publish and returns at once: one
background task brings the object in line with the latest labels wanted (labels handed over
while it works replace each other; only the last is published). The first time, it builds the
client (off the event loop) and looks up its pod's uid for the owner reference (``POD_NAME``;
without it the object has no owner). While the API fails -- unreachable, refusing (RBAC), a
conflicting write -- it retries with capped exponential backoff, says the outage once and its
end, and counts each failure (``nvplugin_node_feature_failures_total``); the daemon serves on
meanwhile, untouched. Each publish is counted by result (``nvplugin_node_feature_writes_total``).

The object is left in place when the plugin stops: it is owned by the pod, and Kubernetes'
garbage collector removes it with the pod; a restarted container updates it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from nvplugin.backoff import Backoff, Retry
from nvplugin.config.pod import PodIdentity
from nvplugin.errors import NvpluginError
from nvplugin.plugin.metrics import Metrics
from nvplugin.plugin.publisher import ApiPublisher
from nvplugin.plugin.tasks import Tasks


class NodeFeaturePublisher(ApiPublisher):
    """Publishes the labels it is handed (see the module docstring); the arguments:
    :class:`~nvplugin.plugin.publisher.ApiPublisher`'s."""

    def __init__(
        self,
        pod: PodIdentity,
        metrics: Metrics,
        *,
        tasks: Tasks,
        backoff: tuple[float, float] = (0.5, 10.0),
    ) -> None:
        super().__init__(pod, metrics, tasks=tasks, backoff=backoff, logger="nvplugin.labels")
        self._wanted: dict[str, str] | None = None
        self._published: dict[str, str] | None = None
        self._wake = asyncio.Event()
        self._publishing = False

    @property
    def published(self) -> Mapping[str, str] | None:
        """The labels the object was last seen to hold (None: not yet)."""
        return self._published

    def want(self, labels: Mapping[str, str]) -> None:
        """Publish ``labels`` (soon; never blocks)."""
        if self._refused(self._pod.problem(), "NodeFeature object"):
            return
        self._wanted = dict(labels)
        self._wake.set()
        if not self._publishing:
            self._publishing = True
            self._tasks.spawn(self._run(), "nvplugin-nodefeature")

    async def _run(self) -> None:
        # Only here is the client library imported: without the NodeFeature mode serve never
        # loads it.
        from nvplugin.kube.client import open_client
        from nvplugin.kube.node import API_JITTER, Outage

        backoff = Backoff(*self._backoff, jitter=API_JITTER)
        outage = Outage(backoff, self._log)
        missing, said_missing = Retry(backoff), False  # POD_NAME names no pod
        client: Any = None
        owner: Any = None
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                labels = self._wanted
                if labels is None:
                    continue
                try:
                    if client is None:
                        client = await asyncio.to_thread(open_client, self._pod.access)
                    if owner is None and self._pod.pod_name:
                        owner = await self._owner(client)
                    await self._publish(client, labels, owner)
                except asyncio.CancelledError:
                    raise
                except PodNotFound as exc:  # the API answers: say what it said, once
                    self._metrics.node_feature_failed()
                    if not said_missing:
                        self._log.error("cannot publish the NodeFeature object", reason=str(exc))
                        said_missing = True
                    self._wake.set()
                    await asyncio.sleep(missing.next())
                except Exception as exc:
                    self._metrics.node_feature_failed()
                    wait = outage.failed(exc, loop.time())
                    self._wake.set()  # try again after the wait, with the latest labels
                    await asyncio.sleep(wait)
                else:
                    outage.over()
        finally:
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()

    async def _owner(self, client: Any) -> Any:
        from lightkube import ApiError

        from nvplugin.kube.nodefeature import Owner, pod_uid

        namespace, name = self._pod.namespace or "", self._pod.pod_name or ""
        try:
            return Owner(name, await pod_uid(client, namespace, name))
        except ApiError as exc:
            if exc.status is None or exc.status.code != 404:
                raise
            raise PodNotFound(
                f"POD_NAME {name}: no such pod in namespace {namespace} (NAMESPACE); the object's "
                "owner is the plugin's own pod (the downward API's metadata.name)"
            ) from None

    async def _publish(self, client: Any, labels: dict[str, str], owner: Any) -> None:
        from nvplugin.kube.nodefeature import object_name, publish

        node, namespace = self._pod.node_name or "", self._pod.namespace or ""
        result = await publish(client, node, namespace, labels, owner)
        self._metrics.node_feature_written(result)
        self._published = labels
        if result != "unchanged":
            self._log.info(
                f"{result} the NodeFeature object",
                object=f"{namespace}/{object_name(node)}",
                labels=len(labels),
                owner=owner.name if owner is not None else None,
            )


class PodNotFound(NvpluginError):
    """POD_NAME names no pod: the API answers, the setting is wrong."""
