"""The API client (lightkube's :class:`AsyncClient`) from
:class:`~nvplugin.kube.kubeconfig.ApiAccess`.

Every request is bounded: connecting, writing and waiting in the pool by ``request_s``; reading
by ``read_s``, which must outlast the quiet stretches of a watch (the API server ends a watch
cleanly after the ``timeoutSeconds`` it was asked for, so ``read_s`` only catches a server that
hangs). Callers also put their own deadline around a whole request (:data:`REQUEST_S`).

Every answer is bounded in size too (:class:`BoundedTransport`): a body, or one line of a watch,
larger than :data:`MAX_BODY` fails the request. And a watch is one request: where lightkube
would open the next at once when the server ends one, the end is raised to the caller
(:class:`WatchEnded`), which decides when to resume -- after a backoff when the server ends
every watch at once.

Building the client reads files (the kubeconfig, the token, the CA): call :func:`open_client`
off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import httpx2
from lightkube import AsyncClient, ConfigError, KubeConfig
from lightkube.config.client_adapter import BearerTokenFileAuth
from lightkube.config.models import Cluster, User

from nvplugin import yamlinput
from nvplugin.errors import InputError, NvpluginError, reason
from nvplugin.kube.kubeconfig import ApiAccess

REQUEST_S = 10.0
"""Longest wait for one request's answer (connect, send, receive)."""
WATCH_S = 240
"""How long the API server keeps one watch open (``timeoutSeconds``) before the client resumes
it from the last resourceVersion."""
READ_S = WATCH_S + 30.0
"""Longest silence on a connection before it counts as dead."""


MAX_BODY = 16 * 1024 * 1024
"""Largest answer read: a list's body, or one watch event (one line). A Node, the largest object
read, is far smaller (its labels, annotations, images and status)."""


class ResponseTooLarge(httpx2.ReadError):
    """An answer larger than :data:`MAX_BODY`: read no further."""


class WatchEnded(httpx2.ReadError):
    """The server ended a watch cleanly (its ``timeoutSeconds``, or at once)."""


class BoundedTransport(httpx2.AsyncBaseTransport):
    """``inner`` with every response body bounded (see the module docstring)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, max_body: int = MAX_BODY) -> None:
        self._inner = inner
        self._max = max_body

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        watch = request.url.params.get("watch") in ("true", "1")
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _BoundedStream(
            response.stream, self._max, watch, ended=watch and response.status_code == 200
        )
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedStream(httpx2.AsyncByteStream):
    """A body of at most ``limit`` bytes (a watch's: each line), raising :class:`WatchEnded` at
    the end of a watch's stream when ``ended``."""

    def __init__(
        self, inner: httpx2.AsyncByteStream, limit: int, per_line: bool, *, ended: bool
    ) -> None:
        self._inner = inner
        self._limit = limit
        self._per_line = per_line
        self._ended = ended

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0  # the body's bytes, or the current line's
        async for chunk in self._inner:
            if self._per_line and (newline := chunk.rfind(b"\n")) >= 0:
                longest = max(size + chunk.find(b"\n"), _longest_line(chunk))
                size = len(chunk) - newline - 1
            else:
                size += len(chunk)
                longest = size
            if longest > self._limit:
                what = "a watch event" if self._per_line else "an answer"
                raise ResponseTooLarge(f"{what} of the kubernetes api over {self._limit} bytes")
            yield chunk
        if self._ended:
            raise WatchEnded("the kubernetes api ended the watch")

    async def aclose(self) -> None:
        await self._inner.aclose()


def _longest_line(chunk: bytes) -> int:
    return max(len(line) for line in chunk.split(b"\n"))


class ApiUnavailable(NvpluginError):
    """No client can be built from the credentials (a bad kubeconfig, an unreadable token)."""


MAX_KUBECONFIG = 1024 * 1024
"""Largest kubeconfig read (one with embedded certificates is a few KiB)."""
MAX_TOKEN = 64 * 1024
"""Largest token file read (a service account's token is about 1 KiB)."""


class TokenFileAuth(httpx2.Auth):
    """A bearer token from a file, read at the first request and again after a 401 (the
    kubelet rotates a projected token), as lightkube's own does -- but off the event loop,
    bounded by :data:`MAX_TOKEN`, and only from a regular file: a FIFO or ``/dev/zero`` there
    fails the request, naming the file."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._bearer: str | None = None

    def _read(self) -> str:
        try:
            data = yamlinput.read_bytes(self._path, f"token file {self._path}", MAX_TOKEN)
            text = yamlinput.decode(data, f"token file {self._path}", MAX_TOKEN)
        except InputError as exc:
            raise ApiUnavailable(str(exc)) from None
        return f"Bearer {text.strip()}"

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        if self._bearer is None:
            self._bearer = await asyncio.to_thread(self._read)
        request.headers["Authorization"] = self._bearer
        response = yield request
        if response.status_code == 401:
            self._bearer = await asyncio.to_thread(self._read)
            request.headers["Authorization"] = self._bearer
            yield request


def open_client(
    access: ApiAccess, *, request_s: float = REQUEST_S, read_s: float = READ_S
) -> AsyncClient:
    """A client for ``access`` (blocking: reads files). Raises :class:`ApiUnavailable`."""
    problem = access.problem()
    if problem is not None:
        raise ApiUnavailable(problem)
    try:
        if access.kubeconfig is not None:
            where = f"KUBECONFIG {access.kubeconfig}"
            text = yamlinput.read_text(access.kubeconfig, where, MAX_KUBECONFIG)
            document = yamlinput.load(text, where)
            config = KubeConfig.from_dict(document, fname=Path(access.kubeconfig))
        else:
            host = access.service_host or ""
            if ":" in host:
                host = f"[{host}]"
            config = KubeConfig.from_one(
                cluster=Cluster(
                    server=f"https://{host}:{access.service_port}",
                    certificate_auth=f"{access.service_account_dir}/ca.crt",
                ),
                # Re-read on a 401: the kubelet rotates the projected token.
                user=User(token_file=access.token_file),
            )
        timeout = httpx2.Timeout(request_s, read=read_s)
        # trust_env: HTTPS_PROXY / NO_PROXY apply, as they do to client-go.
        client = AsyncClient(config=config, timeout=timeout)
    except InputError as exc:
        raise ApiUnavailable(f"cannot use the credentials: {exc}") from None
    except (ConfigError, OSError, ValueError, KeyError, TypeError) as exc:
        where = access.kubeconfig or access.service_account_dir
        raise ApiUnavailable(f"cannot use the credentials in {where}: {reason(exc)}") from None
    inner = client._client._client  # lightkube's GenericAsyncClient's httpx client
    # lightkube reads a token file on the event loop, whole, and whatever it is: read here off
    # the loop, bounded, regular files only.
    if isinstance(inner.auth, BearerTokenFileAuth):
        inner.auth = TokenFileAuth(inner.auth._token_file)
    # lightkube builds its httpx client's transport from the config (TLS, proxies); each one is
    # wrapped here, as lightkube offers no hook for it.
    inner._transport = BoundedTransport(inner._transport)
    for pattern, mounted in list(inner._mounts.items()):
        if mounted is not None:
            inner._mounts[pattern] = BoundedTransport(mounted)
    return client
