"""``nvplugin scheduler-extender``: the extender's HTTP endpoints on asyncio's own streams (no
web framework), the NRT objects, Nodes and bound Pods followed through ``kube/``, and one worker
thread that owns the :class:`~nvplugin.extender.view.View`.

Every touch of the view -- a request's judgement, an NRT update, a binding -- is a job on that
one thread, in arrival order: the loop never blocks on a judgement, the view needs no lock, and
an update waits at most for the request in progress (never a stall of the loop). Requests are
bounded in size and time; a bad request gets its own error back and the service keeps serving.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import gc
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from nvplugin.errors import InputError, NvpluginError, reason
from nvplugin.extender.nrt import parse_nrt
from nvplugin.extender.protocol import ExtenderArgs, filter_result, parse_args, priority_list
from nvplugin.extender.view import View
from nvplugin.log import get_logger

MAX_HEADER = 64 * 1024
MAX_BODY = 64 * 1024 * 1024
"""An ExtenderArgs with whole Nodes (``nodeCacheCapable: false``) for 5,000 nodes fits."""
READ_S = 30.0
"""Longest wait for a request's next bytes."""
JUDGE_S = 25.0
"""Longest a request waits for its verdicts (the scheduler's extender timeout is shorter)."""
EXPIRE_EVERY_S = 5.0
GC_THRESHOLDS = (10_000, 50, 100)
"""The cyclic collector's thresholds in the extender's process (CPython's: 700, 10, 10)."""

T = TypeVar("T")
_log = get_logger("nvplugin.extender")


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"


class Extender:
    """The view behind one worker thread, and the protocol's two verbs."""

    def __init__(self, view: View, managed: tuple[str, ...] = ()) -> None:
        self.view = view
        self.managed = managed
        self._worker = concurrent.futures.ThreadPoolExecutor(1, "nvplugin-extender")
        self.ready = asyncio.Event()

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    async def on_worker(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn)

    # --- the verbs ---------------------------------------------------------------------

    def _filter(self, args: ExtenderArgs) -> dict[str, Any]:
        passed, failed = self.view.filter(args.pod, args.node_names)
        unresolvable: dict[str, str] = {}
        for node in list(failed):
            nrt = self.view.nrt(node)
            if nrt is None:
                continue
            for resource, zones in nrt.resources.items():
                if resource in ("cpu", "memory"):
                    continue
                need = args.pod.effective_count(resource)
                if need and sum(c.allocatable for c in zones.values()) < need:
                    unresolvable[node] = failed.pop(node)
                    break
        return filter_result(args, passed, failed, unresolvable)

    async def filter(self, body: bytes) -> dict[str, Any]:
        try:
            args = parse_args(body)
        except InputError as exc:
            return {"NodeNames": None, "FailedNodes": {}, "Error": str(exc)}
        async with asyncio.timeout(JUDGE_S):
            return await self.on_worker(lambda: self._filter(args))

    async def prioritize(self, body: bytes) -> list[dict[str, Any]]:
        args = parse_args(body)  # InputError: a 400 (the protocol has no error field here)
        async with asyncio.timeout(JUDGE_S):
            scores = await self.on_worker(lambda: self.view.prioritize(args.pod, args.node_names))
        return priority_list(scores)

    def reservations(self) -> dict[str, list[str]]:
        """Node -> UIDs of the pods reserved there (nodes with none left out)."""
        out = {}
        for node in self.view.names():
            held = self.view.reservations(node)
            if held:
                out[node] = sorted(r.pod_uid for r in held)
        return out

    # --- what the API says ---------------------------------------------------------------

    def apply_nrt(self, kind: str, objects: tuple[Mapping[str, Any], ...]) -> None:
        if kind == "SYNC":
            seen = set()
            for obj in objects:
                name = self._set_nrt(obj)
                if name is not None:
                    seen.add(name)
            for name in set(self.view.names()) - seen:
                self.view.remove_nrt(name)
            return
        for obj in objects:
            if kind == "DELETED":
                name = obj.get("metadata", {}).get("name")
                if isinstance(name, str):
                    self.view.remove_nrt(name)
            else:
                self._set_nrt(obj)

    def _set_nrt(self, obj: Mapping[str, Any]) -> str | None:
        try:
            nrt = parse_nrt(obj)
        except InputError as exc:
            _log.warning("NodeResourceTopology skipped", error=str(exc))
            return None
        self.view.set_nrt(nrt)
        return nrt.name

    def apply_pod(self, kind: str, objects: tuple[Mapping[str, Any], ...]) -> None:
        for obj in objects:
            metadata = obj.get("metadata") or {}
            uid = metadata.get("uid")
            node = (obj.get("spec") or {}).get("nodeName")
            phase = (obj.get("status") or {}).get("phase")
            if not isinstance(uid, str):
                continue
            if kind == "DELETED" or phase in ("Succeeded", "Failed"):
                self.view.pod_gone(uid)
            elif isinstance(node, str) and node and self.view.bound(uid, node):
                _log.info("reserved on the node until its NRT shows the pod", pod=uid, node=node)


# --- HTTP ------------------------------------------------------------------------------------


def _json(status: int, value: object) -> Response:
    return Response(status, json.dumps(value, separators=(",", ":")).encode())


async def route(extender: Extender, method: str, path: str, body: bytes) -> Response:
    path = path.split("?", 1)[0].rstrip("/")
    if method == "GET" and path in ("/healthz", "/livez"):
        return Response(200, b"ok\n", "text/plain")
    if method == "GET" and path == "/readyz":
        ok = extender.ready.is_set()
        return Response(200 if ok else 503, b"ok\n" if ok else b"not synced\n", "text/plain")
    if method == "GET" and path == "/reservations":
        held = await extender.on_worker(extender.reservations)
        return _json(200, held)
    if method != "POST":
        return Response(405, b"POST /filter or /prioritize\n", "text/plain")
    try:
        if path.endswith("/filter"):
            return _json(200, await extender.filter(body))
        if path.endswith("/prioritize"):
            return _json(200, await extender.prioritize(body))
    except InputError as exc:
        return Response(400, f"{exc}\n".encode(), "text/plain")
    except TimeoutError:
        return Response(503, b"judgement took too long\n", "text/plain")
    return Response(404, b"POST /filter or /prioritize\n", "text/plain")


REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


async def serve_connection(
    extender: Extender, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """HTTP/1.1 with keep-alive (the scheduler's client reuses connections)."""
    try:
        while True:
            try:
                async with asyncio.timeout(READ_S):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, TimeoutError):
                return
            except asyncio.LimitOverrunError:
                await _write(writer, Response(413, b"headers too large\n", "text/plain"), False)
                return
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3:
                await _write(writer, Response(400, b"bad request line\n", "text/plain"), False)
                return
            method, path, version = parts
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length_text = headers.get("content-length", "0")
            if not length_text.isdigit() or int(length_text) > MAX_BODY:
                await _write(writer, Response(413, b"body too large\n", "text/plain"), False)
                return
            try:
                async with asyncio.timeout(READ_S):
                    body = await reader.readexactly(int(length_text))
            except (asyncio.IncompleteReadError, TimeoutError):
                return
            try:
                response = await route(extender, method, path, body)
            except NvpluginError as exc:
                response = Response(500, f"{exc}\n".encode(), "text/plain")
            except Exception as exc:  # the service outlives any one request
                _log.error("request failed", path=path, error=reason(exc))
                response = Response(500, b"internal error\n", "text/plain")
            keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
            await _write(writer, response, keep)
            if not keep:
                return
    except (ConnectionError, OSError):
        return
    finally:
        writer.close()


async def _write(writer: asyncio.StreamWriter, response: Response, keep: bool) -> None:
    head = (
        f"HTTP/1.1 {response.status} {REASONS.get(response.status, 'Error')}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
    )
    writer.write(head.encode() + response.body)
    await writer.drain()


async def start_http(extender: Extender, host: str, port: int) -> asyncio.Server:
    return await asyncio.start_server(
        lambda r, w: serve_connection(extender, r, w), host, port, limit=MAX_HEADER
    )


async def follow_api(extender: Extender, kubeconfig: str | None, env: Mapping[str, str]) -> None:
    """Follow NRT objects, Nodes and bound Pods into the view until cancelled."""
    from nvplugin.kube.client import open_client
    from nvplugin.kube.collection import follow
    from nvplugin.kube.kubeconfig import ApiAccess

    client = await asyncio.to_thread(open_client, ApiAccess.of(kubeconfig, env))
    nodes: set[str] = set()

    async def nrts() -> None:
        async for event in follow(client, "noderesourcetopologies"):
            await extender.on_worker(
                functools.partial(extender.apply_nrt, event.kind, event.objects)
            )
            extender.ready.set()

    async def pods() -> None:
        async for event in follow(client, "pods"):
            await extender.on_worker(
                functools.partial(extender.apply_pod, event.kind, event.objects)
            )

    async def node_names() -> None:
        async for event in follow(client, "nodes"):
            names = {str((o.get("metadata") or {}).get("name")) for o in event.objects}
            if event.kind == "SYNC":
                nodes.clear()
            if event.kind == "DELETED":
                nodes.difference_update(names)
            else:
                nodes.update(names)

    async def expire() -> None:
        while True:
            await asyncio.sleep(EXPIRE_EVERY_S)
            await extender.on_worker(extender.view.expire)

    async with asyncio.TaskGroup() as group:
        group.create_task(nrts())
        group.create_task(pods())
        group.create_task(node_names())
        group.create_task(expire())


def tune_collector() -> None:
    """Run CPython's cyclic collector rarely: the extender keeps thousands of NRT objects and
    its verdict tables, and with the default thresholds a full collection came every few
    requests and paused one for 50 to 180 ms (docs/scheduler-extender.md#speed). Garbage
    without cycles is freed at once either way; cyclic garbage (dropped judges and parts)
    waits longer."""
    gc.set_threshold(*GC_THRESHOLDS)


async def run_extender(
    view: View, host: str, port: int, kubeconfig: str | None, env: Mapping[str, str]
) -> None:
    tune_collector()
    extender = Extender(view)
    server = await start_http(extender, host, port)
    bound = server.sockets[0].getsockname()
    _log.info("scheduler extender serving", address=f"{bound[0]}:{bound[1]}")
    try:
        async with server:
            await follow_api(extender, kubeconfig, env)
    finally:
        extender.close()
