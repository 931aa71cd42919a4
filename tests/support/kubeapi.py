"""A Kubernetes API server for Nodes (and the Pods and NodeFeatures the plugin reads and writes),
small but real: HTTP/1.1 over TCP, speaking the REST and watch protocol the kubelet's API server
speaks, so that the plugin's client library (lightkube, over httpx) is driven exactly as in a
cluster -- never a mock of nvplugin's own module.

What it serves (``/api/v1/nodes``):

- ``GET /api/v1/nodes/NAME``: the Node, or 404 with a ``Status``;
- ``GET /api/v1/nodes?fieldSelector=metadata.name=NAME``: a ``NodeList`` whose
  ``metadata.resourceVersion`` is the version to watch from;
- ``GET /api/v1/nodes?watch=true&resourceVersion=RV&timeoutSeconds=N[&allowWatchBookmarks=true]``:
  a chunked stream of JSON watch events, one per line (``ADDED``, ``MODIFIED``, ``DELETED``,
  ``BOOKMARK``, ``ERROR``): without RV the current objects as ``ADDED`` first; with RV every
  change after it; RV older than the last compaction: 410 Gone, as an ``ERROR`` event carrying a
  ``Status`` with code 410 (what the API server does) or, with ``gone_as="status"``, as the HTTP
  status; the stream ends cleanly after ``timeoutSeconds``;
- ``PATCH /api/v1/nodes/NAME`` (merge or strategic merge patch of ``metadata.labels``);
- ``GET /api/v1/namespaces/NS/pods/NAME``: a Pod the test added (:meth:`KubeApiServer.add_pod`);
- NodeResourceTopology objects (``/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies``)
  and Volcano's Numatopology objects (``/apis/nodeinfo.volcano.sh/v1alpha1/numatopologies``),
  cluster-scoped: ``GET .../NAME``, ``POST``, ``PUT .../NAME``, as NodeFeatures below;
- NFD's NodeFeature objects (``/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/NS/nodefeatures``):
  ``GET .../NAME``, ``POST`` (201; 409 AlreadyExists when it exists), ``PUT .../NAME`` (200; 409
  Conflict unless ``metadata.resourceVersion`` is the object's current one, as the API server's
  optimistic concurrency does; 400 when the body's name or namespace is not the path's).

Every request needs ``Authorization: Bearer <token>`` (401 otherwise). With ``tls`` (a server
SSL context, e.g. from :func:`self_signed`) it serves HTTPS, as the in-cluster API does. The test
side edits Nodes directly too (:meth:`KubeApiServer.label`), drops or ends every open watch,
compacts the history (so a resumed watch gets 410), and takes the whole server down and up again
on the same port.
Every request is recorded (:attr:`KubeApiServer.requests`) for the tests to check what the client
asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import tempfile
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from tests.support.waiting import WAIT_S

TOKEN = "nvplugin-test-token"
NODEFEATURES = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/"
NRTS = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
NUMATOPOLOGIES = "/apis/nodeinfo.volcano.sh/v1alpha1/numatopologies"
CLUSTER_OBJECTS = {
    NRTS: ("topology.node.k8s.io/v1alpha2", "NodeResourceTopology", "nrts"),
    NUMATOPOLOGIES: ("nodeinfo.volcano.sh/v1alpha1", "Numatopology", "numatopologies"),
}
"""Cluster-scoped custom objects served: path -> apiVersion, kind, the attribute holding them."""
HISTORY = 1000
"""Events kept for watches resuming from an older resourceVersion."""


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    at: float = field(default_factory=time.monotonic)


@dataclass
class _Watch:
    name: str | None  # the fieldSelector's metadata.name, None: every Node
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    writer: asyncio.StreamWriter | None = None
    bookmarks: bool = False


class KubeApiServer:
    """The server; ``async with KubeApiServer() as api:`` starts it on a free port."""

    def __init__(
        self, *, token: str = TOKEN, gone_as: str = "event", tls: ssl.SSLContext | None = None
    ) -> None:
        self.token = token
        self.tls = tls
        self.forbidden = False  # True: every request is refused as RBAC refuses it (403)
        self.gone_as = gone_as
        self.watch_fault: str | None = None
        """How every watch is answered, when set: ``"gone"`` (410 Gone at once, as an ``ERROR``
        event, whatever its version), ``"empty"`` (an empty 200 that ends at once), ``"endless"``
        (one line that never ends), ``"throttle"`` (429 with ``Retry-After: 1``)."""
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodefeatures: dict[tuple[str, str], dict[str, Any]] = {}
        """NodeFeature objects by (namespace, name), as stored."""
        self.nrts: dict[str, dict[str, Any]] = {}
        """NodeResourceTopology objects by name, as stored."""
        self.numatopologies: dict[str, dict[str, Any]] = {}
        """Volcano's Numatopology objects by name, as stored."""
        self.requests: list[Request] = []
        self.port = 0
        self._rv = 100
        self._compacted = 0
        self._history: deque[tuple[int, str, dict[str, Any]]] = deque(maxlen=HISTORY)
        self._watches: list[_Watch] = []
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()

    async def __aenter__(self) -> KubeApiServer:
        await self.up()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.down()

    # --- the server's life ------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def up(self) -> None:
        """Listen (again: on the same port)."""
        self._server = await asyncio.start_server(
            self._connection, "127.0.0.1", self.port, reuse_address=True, ssl=self.tls
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        """Stop listening and cut every connection (watches included): the API server is gone."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._connections):
            writer.transport.abort()
        for watch in list(self._watches):
            watch.queue.put_nowait(None)
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._watches.clear()

    def kubeconfig(self, directory: str | None = None, token: str | None = None) -> str:
        """A kubeconfig file for this server (written in ``directory``, else a new temp dir)."""
        directory = directory or tempfile.mkdtemp()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "plugin", "user": {"token": token or self.token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "plugin"}}],
            "current-context": "test",
        }
        path = os.path.join(directory, "kubeconfig")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        return path

    # --- what the test does to the cluster ----------------------------------------------------

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        self._rv += 1
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "resourceVersion": str(self._rv),
                "labels": dict(labels or {"kubernetes.io/hostname": name}),
            },
            "spec": {},
            "status": {},
        }
        self.nodes[name] = node
        self._event("ADDED", node)

    def add_pod(self, namespace: str, name: str) -> str:
        """A Pod (only its metadata matters here; a pod always has containers); its uid."""
        self._rv += 1
        uid = f"uid-pod-{namespace}-{name}"
        self.pods[(namespace, name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "resourceVersion": str(self._rv),
            },
            "spec": {"containers": [{"name": "nvplugin", "image": "nvplugin"}]},
        }
        return uid

    def label(self, name: str, key: str, value: str | None) -> None:
        """Set (or, with None, remove) one label: a MODIFIED event."""
        self._patch(name, {key: value})

    def annotate(self, name: str, key: str, value: str | None) -> None:
        """Set (or, with None, remove) one annotation: a MODIFIED event."""
        current = self.nodes[name]["metadata"].setdefault("annotations", {})
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
        self._patch(name, {})

    def touch(self, name: str) -> None:
        """A change that is no label's (a status update): MODIFIED with the same labels."""
        self._patch(name, {})

    def delete_node(self, name: str) -> None:
        node = self.nodes.pop(name)
        self._rv += 1
        node = json.loads(json.dumps(node))
        node["metadata"]["resourceVersion"] = str(self._rv)
        self._event("DELETED", node)

    def compact(self) -> None:
        """Forget the history: a watch from any version seen so far gets 410 Gone (other
        objects moved the cluster's version on)."""
        self._rv += 1
        self._compacted = self._rv
        self._history.clear()

    def drop_watches(self) -> None:
        """Cut every open watch connection mid-stream (a reset, no clean end)."""
        for watch in list(self._watches):
            if watch.writer is not None:
                watch.writer.transport.abort()
            watch.queue.put_nowait(None)

    def end_watches(self) -> None:
        """End every open watch cleanly, as the server does after ``timeoutSeconds``."""
        for watch in list(self._watches):
            watch.queue.put_nowait(None)

    def bookmark(self) -> None:
        """A BOOKMARK (the current version) to every watch that allowed bookmarks."""
        for watch in self._watches:
            if watch.bookmarks:
                watch.queue.put_nowait(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": "Node",
                            "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(self._rv)},
                        },
                    }
                )

    @property
    def open_watches(self) -> int:
        """How many watches are streaming now."""
        return len(self._watches)

    def watches(self) -> list[Request]:
        return [r for r in self.requests if r.query.get("watch") in ("true", "1")]

    async def wait_for(self, condition: Callable[[], bool], timeout: float = WAIT_S) -> None:
        """Until ``condition()`` holds (checked after every request and change)."""
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await self._changed.wait()

    # --- internals ------------------------------------------------------------------------------

    def _patch(self, name: str, labels: dict[str, str | None]) -> dict[str, Any]:
        node = self.nodes[name]
        current = node["metadata"].setdefault("labels", {})
        for key, value in labels.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        self._rv += 1
        node["metadata"]["resourceVersion"] = str(self._rv)
        self._event("MODIFIED", node)
        return node

    def _event(self, kind: str, node: dict[str, Any]) -> None:
        copy = json.loads(json.dumps(node))
        self._history.append((self._rv, kind, copy))
        for watch in self._watches:
            if watch.name in (None, node["metadata"]["name"]):
                watch.queue.put_nowait({"type": kind, "object": copy})
        self._changed.set()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self._connections.add(writer)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while True:
                    header = await reader.readline()
                    if header in (b"\r\n", b"\n", b""):
                        break
                    key, _, value = header.decode("latin-1").partition(":")
                    headers[key.strip().lower()] = value.strip()
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                url = urllib.parse.urlsplit(target)
                query = dict(urllib.parse.parse_qsl(url.query))
                self.requests.append(Request(method, url.path, query, headers))
                self._changed.set()
                if not await self._answer(method, url.path, query, headers, body, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._connections.discard(writer)
            self._tasks.discard(task)  # type: ignore[arg-type]
            writer.transport.abort()

    async def _answer(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        headers: dict[str, str],
        body: bytes,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer one request; False when the connection is done."""
        if headers.get("authorization") != f"Bearer {self.token}":
            await _send(writer, 401, _status(401, "Unauthorized", "Unauthorized"))
            return True
        if self.forbidden:
            message = (
                'nodes is forbidden: User "system:serviceaccount:kube-system:nvplugin" cannot '
                f'{method.lower()} resource "nodes" in API group "" at the cluster scope'
            )
            await _send(writer, 403, _status(403, "Forbidden", message))
            return True
        if path.startswith("/api/v1/namespaces/"):
            await self._pod(method, path, writer)
            return True
        if path.startswith(NODEFEATURES):
            await self._nodefeature(method, path, body, writer)
            return True
        for prefix, kind in CLUSTER_OBJECTS.items():
            if path == prefix or path.startswith(prefix + "/"):
                await self._cluster_object(
                    kind, method, path[len(prefix) + 1 :] or None, body, writer
                )
                return True
        prefix = "/api/v1/nodes"
        if path == prefix and method == "GET":
            name = _name_selector(query.get("fieldSelector", ""))
            if name is False:
                message = f"unsupported fieldSelector {query.get('fieldSelector')!r}"
                await _send(writer, 400, _status(400, "BadRequest", message))
                return True
            if query.get("watch") in ("true", "1"):
                await self._watch(name, query, writer)
                return True
            items = [n for n in self.nodes.values() if name in (None, n["metadata"]["name"])]
            await _send(
                writer,
                200,
                {
                    "apiVersion": "v1",
                    "kind": "NodeList",
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": items,
                },
            )
            return True
        if path.startswith(prefix + "/"):
            name = path[len(prefix) + 1 :]
            node = self.nodes.get(name)
            if node is None:
                message = f'nodes "{name}" not found'
                await _send(writer, 404, _status(404, "NotFound", message))
                return True
            if method == "GET":
                await _send(writer, 200, node)
                return True
            if method == "PATCH":
                patch = json.loads(body or b"{}")
                labels = (patch.get("metadata") or {}).get("labels") or {}
                await _send(writer, 200, self._patch(name, labels))
                return True
        await _send(writer, 404, _status(404, "NotFound", f"{method} {path}"))
        return True

    async def _pod(self, method: str, path: str, writer: asyncio.StreamWriter) -> None:
        parts = path.split("/")  # ['', 'api', 'v1', 'namespaces', NS, 'pods', NAME]
        if method != "GET" or len(parts) != 7 or parts[5] != "pods":
            await _send(writer, 404, _status(404, "NotFound", f"{method} {path}"))
            return
        pod = self.pods.get((parts[4], parts[6]))
        if pod is None:
            await _send(writer, 404, _status(404, "NotFound", f'pods "{parts[6]}" not found'))
            return
        await _send(writer, 200, pod)

    async def _nodefeature(
        self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter
    ) -> None:
        parts = path[len(NODEFEATURES) :].split("/")  # [NS, 'nodefeatures'(, NAME)]
        if len(parts) not in (2, 3) or parts[1] != "nodefeatures":
            await _send(writer, 404, _status(404, "NotFound", f"{method} {path}"))
            return
        namespace = parts[0]
        name = parts[2] if len(parts) == 3 else None
        if method == "GET" and name is not None:
            found = self.nodefeatures.get((namespace, name))
            if found is None:
                message = f'nodefeatures.nfd.k8s-sigs.io "{name}" not found'
                await _send(writer, 404, _status(404, "NotFound", message))
                return
            await _send(writer, 200, found)
            return
        if method not in ("POST", "PUT") or (method == "PUT") != (name is not None):
            await _send(writer, 405, _status(405, "MethodNotAllowed", f"{method} {path}"))
            return
        obj = json.loads(body or b"{}")
        meta = obj.get("metadata") or {}
        if (
            obj.get("apiVersion") != "nfd.k8s-sigs.io/v1alpha1"
            or obj.get("kind") != "NodeFeature"
            or meta.get("namespace", namespace) != namespace
            or (name is not None and meta.get("name") != name)
            or not meta.get("name")
        ):
            message = "the object's apiVersion, kind, name or namespace does not match the request"
            await _send(writer, 400, _status(400, "BadRequest", message))
            return
        key = (namespace, meta["name"])
        current = self.nodefeatures.get(key)
        if method == "POST" and current is not None:
            message = f'nodefeatures.nfd.k8s-sigs.io "{meta["name"]}" already exists'
            await _send(writer, 409, _status(409, "AlreadyExists", message))
            return
        if method == "PUT":
            if current is None:
                message = f'nodefeatures.nfd.k8s-sigs.io "{name}" not found'
                await _send(writer, 404, _status(404, "NotFound", message))
                return
            if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
                message = (
                    f'Operation cannot be fulfilled on nodefeatures.nfd.k8s-sigs.io "{name}": '
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again"
                )
                await _send(writer, 409, _status(409, "Conflict", message))
                return
        self._rv += 1
        stored = json.loads(json.dumps(obj))
        stored["metadata"]["namespace"] = namespace
        stored["metadata"]["resourceVersion"] = str(self._rv)
        stored["metadata"].setdefault("uid", f"uid-nodefeature-{namespace}-{meta['name']}")
        self.nodefeatures[key] = stored
        self._changed.set()
        await _send(writer, 201 if method == "POST" else 200, stored)

    async def _cluster_object(
        self,
        kind: tuple[str, str, str],
        method: str,
        name: str | None,
        body: bytes,
        writer: asyncio.StreamWriter,
    ) -> None:
        api_version, kind_name, attribute = kind
        store: dict[str, dict[str, Any]] = getattr(self, attribute)
        what = f"{kind_name.lower()}s.{api_version.split('/')[0]}"
        if method == "GET" and name is not None:
            found = store.get(name)
            if found is None:
                await _send(writer, 404, _status(404, "NotFound", f'{what} "{name}" not found'))
                return
            await _send(writer, 200, found)
            return
        if method not in ("POST", "PUT") or (method == "PUT") != (name is not None):
            await _send(writer, 405, _status(405, "MethodNotAllowed", f"{method} {name}"))
            return
        obj = json.loads(body or b"{}")
        meta = obj.get("metadata") or {}
        if (
            obj.get("apiVersion") != api_version
            or obj.get("kind") != kind_name
            or not meta.get("name")
            or (name is not None and meta.get("name") != name)
        ):
            message = "the object's apiVersion, kind or name does not match the request"
            await _send(writer, 400, _status(400, "BadRequest", message))
            return
        current = store.get(meta["name"])
        if method == "POST" and current is not None:
            message = f'{what} "{meta["name"]}" already exists'
            await _send(writer, 409, _status(409, "AlreadyExists", message))
            return
        if method == "PUT":
            if current is None:
                await _send(writer, 404, _status(404, "NotFound", f'{what} "{name}" not found'))
                return
            if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
                message = f'Operation cannot be fulfilled on {what} "{name}": modified'
                await _send(writer, 409, _status(409, "Conflict", message))
                return
        self._rv += 1
        stored = json.loads(json.dumps(obj))
        stored["metadata"]["resourceVersion"] = str(self._rv)
        stored["metadata"].setdefault("uid", f"uid-{attribute}-{meta['name']}")
        store[meta["name"]] = stored
        self._changed.set()
        await _send(writer, 201 if method == "POST" else 200, stored)

    async def _watch(
        self, name: str | None, query: dict[str, str], writer: asyncio.StreamWriter
    ) -> None:
        if self.watch_fault is not None:
            await _fault(writer, self.watch_fault)
            return
        version = query.get("resourceVersion", "")
        start = int(version) if version not in ("", "0") else None
        if start is not None and start < self._compacted:
            status = _status(410, "Expired", f"too old resource version: {start}")
            if self.gone_as == "status":
                await _send(writer, 410, status)
                return
            await _start_stream(writer)
            await _chunk(writer, {"type": "ERROR", "object": status})
            await _end_stream(writer)
            return
        watch = _Watch(name, writer=writer, bookmarks=query.get("allowWatchBookmarks") == "true")
        if start is None:
            for node in self.nodes.values():
                if name in (None, node["metadata"]["name"]):
                    watch.queue.put_nowait({"type": "ADDED", "object": node})
        else:
            for rv, kind, node in self._history:
                if rv > start and name in (None, node["metadata"]["name"]):
                    watch.queue.put_nowait({"type": kind, "object": node})
        self._watches.append(watch)
        self._changed.set()
        try:
            await _start_stream(writer)
            timeout = float(query["timeoutSeconds"]) if "timeoutSeconds" in query else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    while (event := await watch.queue.get()) is not None:
                        await _chunk(writer, event)
            await _end_stream(writer)
        finally:
            self._watches.remove(watch)


def self_signed(directory: str) -> tuple[ssl.SSLContext, str]:
    """A server SSL context for 127.0.0.1 with a new self-signed certificate (made by the
    openssl command), and the certificate's path: the CA a client must trust."""
    cert, key = os.path.join(directory, "ca.crt"), os.path.join(directory, "server.key")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", key, "-out", cert, "-subj", "/CN=kube-apiserver"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context, cert


def _name_selector(selector: str) -> str | bool | None:
    """The node name of ``metadata.name=NAME`` (None: no selector; False: one we do not serve)."""
    if not selector:
        return None
    key, op, value = selector.partition("=")
    if key != "metadata.name" or not op or value.startswith("="):
        return False
    return value


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


_REASONS = {
    200: "OK",
    201: "Created",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    410: "Gone",
    429: "Too Many Requests",
}


async def _fault(writer: asyncio.StreamWriter, fault: str) -> None:
    """One watch answered as :attr:`KubeApiServer.watch_fault` says."""
    if fault == "throttle":
        status = _status(429, "TooManyRequests", "too many requests, please try again later")
        await _send(writer, 429, status, extra="Retry-After: 1\r\n")
        return
    await _start_stream(writer)
    if fault == "gone":
        status = _status(410, "Expired", "too old resource version")
        await _chunk(writer, {"type": "ERROR", "object": status})
    elif fault == "endless":
        piece = b"x" * 65536
        while True:  # until the client goes (the connection's end raises)
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
    await _end_stream(writer)


async def _send(
    writer: asyncio.StreamWriter, code: int, payload: dict[str, Any], extra: str = ""
) -> None:
    body = json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: application/json\r\n"
        f"{extra}Content-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()


async def _start_stream(writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    await writer.drain()


async def _chunk(writer: asyncio.StreamWriter, event: dict[str, Any]) -> None:
    data = json.dumps(event).encode() + b"\n"
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def _end_stream(writer: asyncio.StreamWriter) -> None:
    writer.write(b"0\r\n\r\n")
    await writer.drain()
