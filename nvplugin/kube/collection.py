"""A cluster-wide collection followed as an informer does, for the scheduler extender: LIST
(every object, and the resourceVersion to watch from), then WATCH from there, resumed from the
last resourceVersion when the watch ends, listed again on 410 Gone, with capped backoff while
the API is away (the same rules as :mod:`nvplugin.kube.node`). Objects come out as plain dicts.

Kinds: NodeResourceTopology (``topology.node.k8s.io/v1alpha2``), Node, and Pod (bound pods only:
``spec.nodeName`` set).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient, operators
from lightkube.generic_resource import create_global_resource
from lightkube.resources.core_v1 import Node, Pod

from nvplugin.backoff import Backoff
from nvplugin.kube.client import REQUEST_S, WATCH_S
from nvplugin.kube.node import API_BACKOFF, BOOKMARK, Outage, _gone
from nvplugin.log import get_logger

NRT = create_global_resource(
    "topology.node.k8s.io", "v1alpha2", "NodeResourceTopology", "noderesourcetopologies"
)
KINDS: dict[str, tuple[Any, dict[str, Any] | None]] = {
    "noderesourcetopologies": (NRT, None),
    "nodes": (Node, None),
    "pods": (Pod, {"spec.nodeName": operators.not_equal("")}),  # bound pods only
}
LIST_S = 120.0
"""Longest wait for one whole LIST (5,000 NRT objects come in pages)."""


@dataclass(frozen=True)
class Event:
    """``SYNC`` (``objects``: everything, after a LIST) or ADDED / MODIFIED / DELETED
    (``objects``: the one object)."""

    kind: str
    objects: tuple[dict[str, Any], ...]


async def follow(
    client: AsyncClient,
    what: str,
    *,
    backoff: Backoff = API_BACKOFF,
    watch_s: int = WATCH_S,
    request_s: float = REQUEST_S,
) -> AsyncIterator[Event]:
    """Events of the collection ``what`` (a key of :data:`KINDS`) until the caller stops.
    Never raises for the API's sake."""
    log = get_logger("nvplugin.kube", collection=what)
    resource, fields = KINDS[what]
    loop = asyncio.get_running_loop()
    version: str | None = None
    outage = Outage(backoff, log)
    namespace: dict[str, Any] = {"namespace": "*"} if resource is Pod else {}
    while True:
        try:
            if version is None:
                async with asyncio.timeout(max(request_s, LIST_S)):
                    listed = client.list(resource, fields=fields, chunk_size=500, **namespace)
                    objects = tuple([o.to_dict() async for o in listed])
                    version = listed.resourceVersion
                outage.over()
                yield Event("SYNC", objects)
            watch = client.watch(
                resource,
                fields=fields,
                resource_version=version,
                server_timeout=watch_s,
                **namespace,
            )
            async with contextlib.aclosing(watch) as events:  # type: ignore[type-var]
                async for kind, obj in events:
                    outage.over()
                    if obj.metadata is not None and obj.metadata.resourceVersion:
                        version = obj.metadata.resourceVersion
                    if kind == BOOKMARK:
                        continue
                    yield Event(kind, (obj.to_dict(),))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if _gone(exc):
                log.info("watch too old (410 Gone); listing again")
                version = None
                continue
            await asyncio.sleep(outage.failed(exc, loop.time()))
