"""The HTTP endpoint (metrics, probes) over real TCP on 127.0.0.1: answers, refusals, and the
bounds: connections capped (the oldest closed), slow or idle clients dropped, no thread per
connection."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from nvplugin.plugin.httpendpoint import HttpEndpoint, Response
from tests.support.harness import dropped
from tests.support.waiting import WAIT_S


def run(body: Callable[[], Awaitable[None]], timeout: float = 60) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


def _broken() -> Response:
    raise RuntimeError("a bug")


@asynccontextmanager
async def endpoint(**options: float) -> AsyncIterator[HttpEndpoint]:
    served = HttpEndpoint(
        "test",
        "127.0.0.1:0",
        {"/hello": lambda: Response(200, b"hello\n"), "/broken": _broken},
        **options,  # type: ignore[arg-type]
    )
    await served.start()
    try:
        yield served
    finally:
        await served.stop()


async def exchange(port: int, request: bytes) -> bytes:
    """Send ``request``, read the whole answer (the endpoint closes after it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def test_answers_and_refusals() -> None:
    async def body() -> None:
        async with endpoint() as served:
            port = served.port
            assert port
            answer = await exchange(port, get("/hello?x=1"))
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"Content-Length: 6\r\n" in answer and b"Connection: close\r\n" in answer
            assert answer.endswith(b"\r\n\r\nhello\n")
            head = await exchange(port, get("/hello", "HEAD"))
            assert b"Content-Length: 6\r\n" in head and head.endswith(b"\r\n\r\n")
            missing = await exchange(port, get("/nope"))
            assert missing.startswith(b"HTTP/1.1 404 ")
            assert missing.endswith(b"this endpoint serves /broken, /hello\n")
            post = await exchange(port, get("/hello", "POST"))
            assert post.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD\r\n" in post
            assert (await exchange(port, b"hello\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
            broken = await exchange(port, get("/broken"))
            assert broken.startswith(b"HTTP/1.1 500 ")
            assert (await exchange(port, get("/hello"))).endswith(b"hello\n")  # still serving

    run(body)


def test_a_request_head_too_large_gets_431() -> None:
    async def body() -> None:
        async with endpoint(max_request_bytes=1024) as served:
            assert served.port
            request = b"GET /hello HTTP/1.1\r\nX: " + b"a" * 4096 + b"\r\n\r\n"
            assert (await exchange(served.port, request)).startswith(b"HTTP/1.1 431 ")

    run(body)


def test_heads_with_bare_lf_line_endings_are_answered() -> None:
    """HTTP/1.1 lets a server take a bare LF as a line's end (RFC 9112, 2.2); what `printf
    'GET /livez HTTP/1.1\\n\\n' | nc` sends is answered, not held until the timeout."""

    async def body() -> None:
        async with endpoint(request_timeout_s=WAIT_S, max_request_bytes=1024) as served:
            assert served.port
            for request in (
                b"GET /hello HTTP/1.1\n\n",
                b"GET /hello HTTP/1.1\nHost: x\n\n",
                b"GET /hello HTTP/1.1\r\nHost: x\n\r\n",
                b"\r\nGET /hello HTTP/1.1\r\n\r\n",  # an empty line before it is skipped
            ):
                answer = await asyncio.wait_for(exchange(served.port, request), WAIT_S)
                assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"hello\n")
            many = b"GET /hello HTTP/1.1\n" + b"X: y\n" * 400 + b"\n"  # short lines, long head
            assert (await exchange(served.port, many)).startswith(b"HTTP/1.1 431 ")

    run(body)


def test_idle_and_slow_clients_are_dropped() -> None:
    async def body() -> None:
        async with endpoint(request_timeout_s=0.2) as served:
            assert served.port
            idle = await asyncio.open_connection("127.0.0.1", served.port)
            slow = await asyncio.open_connection("127.0.0.1", served.port)
            slow[1].write(b"GET /hello HTTP/1.1\r\n")  # ... and never the rest
            for reader, _ in (idle, slow):
                assert await dropped(reader)  # closed without an answer
            assert served.connections == 0
            for _, writer in (idle, slow):
                writer.close()

    run(body)


def test_connections_are_capped_the_oldest_closed_and_no_thread_each() -> None:
    async def body() -> None:
        # Threads that were there before may end meanwhile (a previous test's executor winding
        # down); what must not happen is a new one per connection.
        before = {thread.ident for thread in threading.enumerate()}
        async with endpoint(max_connections=8) as served:
            assert served.port
            idle = [await asyncio.open_connection("127.0.0.1", served.port) for _ in range(50)]
            # The 42 oldest are closed to make room, in order; the 8 newest stay open.
            for reader, _ in idle[:42]:
                assert await dropped(reader)
            assert served.connections <= 8
            assert {thread.ident for thread in threading.enumerate()} <= before
            # One more client is still served (it closes the oldest idle one).
            assert (await exchange(served.port, get("/hello"))).endswith(b"hello\n")
            assert served.connections <= 8
            for _, writer in idle:
                writer.close()

    run(body)
