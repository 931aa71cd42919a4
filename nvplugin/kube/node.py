"""The plugin's own Node: read it, and follow its labels for as long as the plugin runs.

:func:`follow_labels` is an informer for one object, written out: LIST the Node with
``fieldSelector=metadata.name=<node>`` (its labels, and the resourceVersion to watch from), then
WATCH from there. When the watch ends -- the server's ``timeoutSeconds``, a dropped connection, an
API server restart -- it is resumed from the last resourceVersion seen, so no change is missed or
seen twice; when the server answers that the version is too old (410 Gone, as an HTTP status or
as an ``ERROR`` event carrying a Status with code 410), it lists again. A watch the server ends
at once (410 after 410, an empty answer) is resumed after a backoff (:class:`Storm`), and a
``Retry-After`` is honoured. While the API cannot be
reached it retries with capped exponential backoff (:data:`API_BACKOFF`), and says so once per
outage, not once per attempt. Every request has a deadline; nothing is kept but the last
resourceVersion and the last labels.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node

from nvplugin.backoff import Backoff, Retry
from nvplugin.errors import reason
from nvplugin.kube.client import REQUEST_S, WATCH_S, WatchEnded
from nvplugin.log import get_logger

BOOKMARK = "BOOKMARK"


API_JITTER = 0.2
"""Each wait for the API is shortened by up to a fifth, at random: the plugins of many nodes
that lost the API together do not come back to it together."""
API_BACKOFF = Backoff(initial_s=0.5, maximum_s=10.0, jitter=API_JITTER)
"""Between attempts while the API is away."""


@dataclass(frozen=True)
class NodeLabels:
    """A Node's labels and annotations as last seen, or ``exists=False`` when there is no such
    Node."""

    exists: bool
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, node: Node | None) -> NodeLabels:
        if node is None:
            return cls(False)
        meta = node.metadata
        labels = meta.labels if meta is not None else None
        annotations = meta.annotations if meta is not None else None
        return cls(
            True, MappingProxyType(dict(labels or {})), MappingProxyType(dict(annotations or {}))
        )


async def get_node(client: AsyncClient, name: str, *, request_s: float = REQUEST_S) -> NodeLabels:
    """GET the Node ``name`` once (``exists=False`` on 404). Raises on any other failure."""
    try:
        async with asyncio.timeout(request_s):
            node = await client.get(Node, name=name)
    except ApiError as exc:
        if exc.status.code == 404:
            return NodeLabels(False)
        raise
    return NodeLabels.of(node)


async def follow_labels(
    client: AsyncClient,
    name: str,
    *,
    backoff: Backoff = API_BACKOFF,
    watch_s: int = WATCH_S,
    request_s: float = REQUEST_S,
) -> AsyncIterator[NodeLabels]:
    """The Node's labels now, then each time they change (or the Node appears or goes), until
    the caller stops iterating. Never raises for the API's sake: see the module docstring."""
    log = get_logger("nvplugin.kube", node=name)
    loop = asyncio.get_running_loop()
    selector: dict[str, Any] = {"metadata.name": name}
    version: str | None = None  # None: list (again) before watching
    last: NodeLabels | None = None
    outage = Outage(backoff, log)
    storm = Storm(backoff, log)
    while True:
        started, answered = loop.time(), False
        try:
            if version is None:
                async with asyncio.timeout(request_s):
                    listed = client.list(Node, fields=selector)
                    nodes = [node async for node in listed]
                    version = listed.resourceVersion
                outage.over()
                state = NodeLabels.of(nodes[0] if nodes else None)
                if state != last:
                    last = state
                    yield state
            started = loop.time()
            watch = client.watch(
                Node, fields=selector, resource_version=version, server_timeout=watch_s
            )
            async with contextlib.aclosing(watch) as events:  # type: ignore[type-var]
                async for kind, node in events:
                    outage.over()
                    if not answered:
                        answered = True
                        storm.held()
                    if node.metadata is not None and node.metadata.resourceVersion:
                        version = node.metadata.resourceVersion
                    if kind == BOOKMARK:
                        continue
                    state = NodeLabels.of(None if kind == "DELETED" else node)
                    if state != last:
                        last = state
                        yield state
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            gone = _gone(exc)
            if gone or isinstance(exc, WatchEnded):
                outage.over()
                if gone:
                    version = None  # too old: list again
                # A watch that brought something or ran a while resumes at once; one the server
                # ended at once (410 Gone again, an empty answer) waits, doubling.
                wait = storm.ended(gone, answered or loop.time() - started >= backoff.maximum_s)
            else:
                wait = outage.failed(exc, loop.time())
            await asyncio.sleep(max(wait, retry_after(exc)))


MAX_RETRY_AFTER_S = 60.0
"""Longest ``Retry-After`` honoured: a server's longer (or absurd) one waits this long."""


def retry_after(exc: BaseException) -> float:
    """The seconds of the answer's ``Retry-After`` header (as seconds; 0 when absent or not a
    number), at most :data:`MAX_RETRY_AFTER_S`: the API server sends it with 429 and 503."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    try:
        value = float(headers.get("retry-after", "")) if headers is not None else 0.0
    except (TypeError, ValueError):
        return 0.0
    return min(max(value, 0.0), MAX_RETRY_AFTER_S) if value == value else 0.0


class Storm:
    """Watches the server ends: one that ran (brought an event, or lasted the backoff's cap) is
    resumed at once; one ended at once (410 Gone, an empty answer) waits under the backoff, so a
    server that ends every watch gets a few requests a second at most, not thousands. A storm of
    them is said once when it starts and once when it ends, with how many there were."""

    SAY_AFTER = 3

    def __init__(self, backoff: Backoff, log: Any) -> None:
        self._retry = Retry(backoff)
        self._log = log
        self._count = 0
        self._gone = 0

    def ended(self, gone: bool, ran: bool) -> float:
        """A watch ended (``gone``: with 410 Gone; ``ran``: after a good run); the wait before
        the next request."""
        if ran:
            self.held()
            if gone:
                self._log.info("watch too old (410 Gone); listing the node again")
            return 0.0
        self._count += 1
        self._gone += gone
        if self._count == 1 and gone:
            self._log.info("watch too old (410 Gone); listing the node again")
        elif self._count == self.SAY_AFTER:
            self._log.warning(
                "kubernetes api ends every watch at once; backing off",
                ended=self._count,
                gone=self._gone,
                retry_max_s=self._retry.backoff.maximum_s,
            )
        return self._retry.next()

    def held(self) -> None:
        """A watch brought an event: the server holds watches (again)."""
        if self._count >= self.SAY_AFTER:
            self._log.info("kubernetes api watches hold again", ended=self._count, gone=self._gone)
        self._count = self._gone = 0
        self._retry.reset()


class Outage:
    """Failures in a row and what to say about them: a watch the server dropped is resumed
    quietly; a few failures in a row (or any before the first answer) are an outage, said once,
    and its end is said too."""

    SAY_AFTER = 3

    def __init__(self, backoff: Backoff, log: Any) -> None:
        self._backoff = backoff
        self._log = log
        self._retry = Retry(backoff)
        self._failures = 0
        self._last_failure = 0.0
        self._answered = False
        self._said = False

    def over(self) -> None:
        """The API answered."""
        self._answered = True
        self._retry.reset()
        self._failures = 0
        if self._said:
            self._log.info("kubernetes api answering again")
            self._said = False

    def failed(self, exc: BaseException, now: float) -> float:
        """Count a failure at ``now``; the seconds to wait before the next attempt."""
        if now - self._last_failure > 2 * self._backoff.maximum_s:
            self._failures = 0  # an isolated drop long after the last one
        self._failures += 1
        self._last_failure = now
        wait = self._retry.next()
        outage = self._failures >= self.SAY_AFTER or not self._answered
        if outage and not self._said:
            self._log.warning(
                "kubernetes api failing (unreachable or refusing); still serving, retrying",
                error=reason(exc),
                retry_max_s=self._backoff.maximum_s,
            )
            self._said = True
        else:
            self._log.debug("kubernetes api request failed; retrying", error=reason(exc))
        return wait


def _gone(exc: BaseException) -> bool:
    """410 Gone: the resourceVersion is older than what the API server still keeps."""
    if isinstance(exc, ApiError):
        return exc.status is not None and exc.status.code == 410
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code == 410
    return False
