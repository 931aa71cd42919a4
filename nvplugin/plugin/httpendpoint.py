"""A small HTTP/1.1 endpoint on the daemon's event loop: GET (and HEAD) of a few fixed paths.

It serves ``/metrics`` (:mod:`nvplugin.plugin.metrics`) and the kubelet's probes (``/livez``,
``/readyz``). Why not ``prometheus_client``'s server, or ``http.server``: they give every
connection a thread for as long as the client keeps it open, so idle connections -- which any pod
that reaches the port can open -- cost a thread each, without bound; under a pids limit every
later scrape fails. Here a connection is a socket and a task on the loop, and each is bounded:

- at most ``max_connections`` at once; one more closes the oldest, so that idle holders cannot
  lock the kubelet's probe or Prometheus out (a client's request is answered within
  milliseconds of its connection: the oldest connection is the one least likely to be one);
- the request head must arrive whole within ``request_timeout_s`` and fit in
  ``max_request_bytes``; a slow or endless sender is dropped; its lines may end in CRLF or a
  bare LF;
- one request per connection (``Connection: close``), answered from memory; a client that does
  not take its answer within the timeout is dropped too.

Handlers are plain functions called on the loop: they must be quick and must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from nvplugin.config.rules import parse_address
from nvplugin.errors import NvpluginError, reason
from nvplugin.log import get_logger

MAX_CONNECTIONS = 32
"""Connections served at once per endpoint (one more closes the oldest). Prometheus and the
kubelet each hold one for a few milliseconds per scrape or probe."""
REQUEST_TIMEOUT_S = 5.0
"""From accepting a connection to the last byte of the answer handed to the kernel."""
MAX_REQUEST_BYTES = 8192
"""The longest request head (request line and headers) read; longer ones get 431."""

TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Response:
    """What a handler answers."""

    status: int
    body: bytes
    content_type: str = TEXT


Handler = Callable[[], Response]


class HttpEndpoint:
    """GET/HEAD of ``routes`` (path -> handler) on exactly ``address``, from the running loop.

    ``name`` says what it serves in messages ("metrics", "health probes").
    """

    def __init__(
        self,
        name: str,
        address: str,
        routes: Mapping[str, Handler],
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_request_bytes: int = MAX_REQUEST_BYTES,
    ) -> None:
        self.name = name
        self.address = address
        self._routes = dict(routes)
        self._max_connections = max_connections
        self._timeout = request_timeout_s
        self._max_request_bytes = max_request_bytes
        self._server: asyncio.Server | None = None
        # Open connections, oldest first (dicts keep insertion order).
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._log = get_logger("nvplugin.http", endpoint=name)

    @property
    def port(self) -> int | None:
        """The port bound (the one the OS chose when the address asked for port 0)."""
        if self._server is None or not self._server.sockets:
            return None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        """Connections open right now."""
        return len(self._connections)

    async def start(self) -> None:
        """Bind and serve; :class:`NvpluginError` naming the address when it cannot bind."""
        try:
            host, port = parse_address(self.address)
        except ValueError as exc:
            raise NvpluginError(f"{self.name}: {exc}") from None
        try:
            self._server = await asyncio.start_server(
                self._serve, host, port, limit=self._max_request_bytes
            )
        except OSError as exc:
            raise NvpluginError(
                f"cannot serve {self.name} on {self.address}: {_why(exc)}"
            ) from None
        paths = sorted(self._routes)
        self._log.info(f"serving {self.name}", address=self.address, port=self.port, paths=paths)

    async def stop(self) -> None:
        """Stop listening and drop every connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        tasks = list(self._connections)
        for writer in self._connections.values():
            writer.transport.abort()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        while len(self._connections) >= self._max_connections:
            # Aborted, not cancelled: its read ends at once and its task finishes on its own
            # (asyncio 3.11 logs a traceback for every cancelled connection task).
            oldest, its_writer = next(iter(self._connections.items()))
            del self._connections[oldest]
            its_writer.transport.abort()
        self._connections[task] = writer
        # drain() returns only once the whole answer is with the kernel: nothing stays buffered
        # here for a client that never reads.
        writer.transport.set_write_buffer_limits(0)
        answered = False
        try:
            async with asyncio.timeout(self._timeout):
                request_line = await _read_head(reader, self._max_request_bytes)
                if request_line is None:
                    answer = _answer(Response(431, b"request head too large\n"), head=False)
                else:
                    answer = self._answer(request_line)
                writer.write(answer)
                await writer.drain()
                answered = True
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass  # too slow, gone, or closed to make room: nothing to answer
        finally:
            self._connections.pop(task, None)
            if answered:
                writer.close()  # FIN after the answer (the kernel holds what is unsent)
            else:
                writer.transport.abort()

    def _answer(self, request_line: bytes) -> bytes:
        parts = request_line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return _answer(Response(400, b"not an HTTP/1.x request\n"), head=False)
        method, target = parts[0], parts[1]
        if method not in (b"GET", b"HEAD"):
            return _answer(Response(405, b"only GET and HEAD\n"), head=False, allow=True)
        path = target.split(b"?", 1)[0].decode("ascii", "replace")
        handler = self._routes.get(path)
        if handler is None:
            paths = ", ".join(sorted(self._routes))
            return _answer(Response(404, f"not found; this endpoint serves {paths}\n".encode()))
        try:
            response = handler()
        except Exception as exc:  # a handler's bug answers 500; the endpoint goes on
            self._log.error("handler failed", path=path, error=reason(exc))
            response = Response(500, b"internal error\n")
        return _answer(response, head=method == b"HEAD")


async def _read_head(reader: asyncio.StreamReader, max_bytes: int) -> bytes | None:
    """Read a request head -- the request line, then header lines up to an empty one -- and
    return its request line; None when the head is longer than ``max_bytes``. Lines may end in
    CRLF or in a bare LF, which HTTP/1.1 allows a server to accept (RFC 9112, section 2.2) and
    which clients typed by hand (printf, nc) send: a head of bare LFs is answered, not held
    until the timeout."""
    request_line: bytes | None = None
    read = 0
    while True:
        try:
            line = await reader.readuntil(b"\n")  # IncompleteReadError: the client went
        except asyncio.LimitOverrunError:
            return None
        read += len(line)
        if read > max_bytes:
            return None
        line = line.rstrip(b"\r\n")
        if request_line is None:
            if line:  # empty lines before the request line are skipped (RFC 9112, 2.2)
                request_line = line
            continue
        if not line:
            return request_line


def _why(exc: OSError) -> str:
    """An error binding, as the system says it (asyncio wraps the errno in a longer text)."""
    if isinstance(exc, socket.gaierror) or not exc.errno:
        return str(exc.strerror or exc)
    return os.strerror(exc.errno)


def _answer(response: Response, *, head: bool = False, allow: bool = False) -> bytes:
    """The bytes of ``response`` (without its body for HEAD)."""
    phrase = http.HTTPStatus(response.status).phrase
    lines = [
        f"HTTP/1.1 {response.status} {phrase}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Connection: close",
    ]
    if allow:
        lines.append("Allow: GET, HEAD")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (b"" if head else response.body)
