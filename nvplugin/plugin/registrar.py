"""Registering with the kubelet, and doing it again every time the kubelet restarts.

The kubelet never dials a plugin on its own: a plugin serves its socket, calls ``Register`` on
``kubelet.sock``, and the kubelet dials back. When the kubelet restarts it deletes every socket in
the device-plugin directory (ours included) and serves ``kubelet.sock`` anew; the old registration
is gone, and nothing tells the plugin except the directory itself
(docs/kubelet-behaviour.md#registration).

So :class:`DirWatcher` watches the directory (inotify through asyncinotify; where inotify is not
available, the registrar's own periodic check is the fallback), and a :class:`Registrar` per
resource re-checks on every change: our socket gone or replaced -> serve again; ``kubelet.sock``
re-created -> register again. While the kubelet is down it retries with capped exponential
backoff, and any change in the directory (the kubelet's socket appearing) cuts the wait short.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable

import grpc

from nvplugin.api import VERSION
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.backoff import Backoff, Retry
from nvplugin.errors import NvpluginError
from nvplugin.log import get_logger
from nvplugin.plugin.server import DevicePluginService, PluginSocket

POLL_WITH_INOTIFY_S = 2.0
"""A safety re-check even with inotify (a missed event must not cost a registration)."""
POLL_WITHOUT_INOTIFY_S = 0.25
"""Without inotify the check is the only detector; 0.25 s keeps re-registration within 1 s."""

REGISTER_TIMEOUT_S = 15.0
"""Deadline of one Register call: the kubelet dials us back with a 10 s timeout before replying."""


SERVE_AGAIN_GIVE_UP_S = 20.0
"""How long re-creating our socket may keep failing (retried with backoff) before the plugin gives
up and exits non-zero, so that Kubernetes restarts it: a plugin that can no longer serve its
socket is a zombie the kubelet cannot see."""


class SocketLostError(NvpluginError):
    """Our socket was removed and could not be served again; the daemon exits with this."""


class RegistrationError(NvpluginError):
    """Register failed: the kubelet is not there yet, or it refused us (message says which)."""


REGISTER_BACKOFF = Backoff(initial_s=0.1, maximum_s=5.0)
"""Between Register attempts while the kubelet is down (and serve attempts of a lost socket)."""


async def register(
    kubelet_socket: str, request: api_pb2.RegisterRequest, timeout: float = REGISTER_TIMEOUT_S
) -> None:
    """One ``Register`` call on ``kubelet_socket``; raises :class:`RegistrationError`."""
    if not os.path.exists(kubelet_socket):
        raise RegistrationError(f"kubelet socket {kubelet_socket} does not exist (yet)")
    async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        try:
            await stub.Register(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            details = exc.details() or exc.code().name
            raise RegistrationError(
                f"Register on {kubelet_socket} failed ({exc.code().name}): {details}"
            ) from None


class DirWatcher:
    """Tells waiters that something in ``directory`` changed (a socket created or deleted; a file
    written, or a ConfigMap volume's ``..data`` link swapped: per-node configs watch their
    directory with it too, ``what`` naming it in the log).

    :meth:`wait` returns on the next change or after its timeout, whichever comes first; callers
    re-check what they care about either way, so a missed or spurious wake-up costs nothing but a
    ``stat``. :attr:`poll_s` is the timeout callers should use: short when inotify is unavailable.
    """

    def __init__(self, directory: str, what: str = "the device-plugin directory") -> None:
        self.directory = directory
        self.what = what
        self._changed = asyncio.Event()
        self._inotify_ok = False
        self._log = get_logger("nvplugin.registration")

    @property
    def watching(self) -> bool:
        """Whether inotify watches the directory now (else waiters poll)."""
        return self._inotify_ok

    @property
    def poll_s(self) -> float:
        return POLL_WITH_INOTIFY_S if self._inotify_ok else POLL_WITHOUT_INOTIFY_S

    def poke(self) -> None:
        """Wake every waiter now."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait(self, timeout: float) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that
        # races with the event being set, and then shutdown would wait for a registrar that
        # never stops.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    async def run(self) -> None:
        """Watch until cancelled; re-arms the watch when the directory is re-created."""
        try:
            from asyncinotify import Inotify, Mask
        except (ImportError, OSError) as exc:
            self._log.info("inotify unavailable; polling", error=str(exc), poll_s=self.poll_s)
            return
        mask = (
            Mask.CREATE
            | Mask.DELETE
            | Mask.MOVED_TO
            | Mask.MOVED_FROM
            | Mask.CLOSE_WRITE
            | Mask.ATTRIB
            | Mask.DELETE_SELF
            | Mask.MOVE_SELF
        )
        warned = False
        while True:
            try:
                with Inotify() as inotify:
                    inotify.add_watch(self.directory, mask)
                    self._inotify_ok = True
                    warned = False
                    self.poke()  # something may have changed before the watch was armed
                    async for event in inotify:
                        self.poke()
                        if event.mask & (Mask.IGNORED | Mask.DELETE_SELF | Mask.MOVE_SELF):
                            break  # the directory itself went away: re-arm when it is back
            except OSError as exc:
                if not warned:
                    self._log.info(
                        f"cannot watch {self.what}; polling",
                        directory=self.directory,
                        error=exc.strerror or str(exc),
                    )
                    warned = True
            self._inotify_ok = False
            await asyncio.sleep(POLL_WITHOUT_INOTIFY_S)


def _identity(path: str) -> tuple[int, int, int] | None:
    """Which file ``path`` is now (device, inode, mtime), or None when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_mtime_ns)


class Registrar:
    """Keeps one resource served and registered with whichever kubelet is running.

    ``on_registered`` is called after every successful registration (tests and the bench count
    them through the log line; the daemon uses it for nothing else).
    """

    def __init__(
        self,
        plugin_socket: PluginSocket,
        service: DevicePluginService,
        kubelet_socket: str,
        watcher: DirWatcher,
        *,
        backoff: Backoff | None = None,
        on_registered: Callable[[], None] | None = None,
        on_unregistered: Callable[[], None] | None = None,
        serve_give_up_s: float = SERVE_AGAIN_GIVE_UP_S,
    ) -> None:
        self._socket = plugin_socket
        self._service = service
        self._kubelet_socket = kubelet_socket
        self._request = api_pb2.RegisterRequest(
            version=VERSION,
            endpoint=os.path.basename(plugin_socket.path),
            resource_name=service.resource_name,
            options=service.options,
        )
        self._watcher = watcher
        self._backoff = backoff if backoff is not None else REGISTER_BACKOFF
        self._on_registered = on_registered
        self._on_unregistered = on_unregistered
        self._serve_give_up_s = serve_give_up_s
        self.registered = False
        self._last_serve_error = ""
        self._log = get_logger("nvplugin.registration", resource=service.resource_name)
        self.registrations = 0

    async def run(self) -> None:
        """Serve and register until cancelled. The socket must already be started once.

        Each round goes in this order: read ``kubelet.sock``, then make sure our own socket is
        served, then register. A restarting kubelet deletes our socket *before* it creates its
        own, so when a round reads a new ``kubelet.sock``, our socket's deletion has already
        happened and the check after the read sees it: the endpoint we register is one we serve.
        (In the other order -- our socket checked, then ``kubelet.sock`` read -- the kubelet can
        delete our socket in between; the new kubelet then dials an endpoint that no longer
        exists for its whole 10 s dial timeout, and the resource has no devices meanwhile.)
        """
        registered_with: tuple[int, int, int] | None = None
        last_seen: tuple[int, int, int] | None = None
        retry = Retry(self._backoff)
        failures = 0
        serve_failures = 0
        failing_since = 0.0
        waiting_logged = False
        while True:
            kubelet = _identity(self._kubelet_socket)  # first: see the docstring
            if kubelet != last_seen:
                last_seen = kubelet
                retry.reset()  # a new kubelet: try again right away
            if registered_with is not None and kubelet != registered_with:
                if kubelet is None:
                    self._log.info("kubelet socket gone (kubelet restart?); waiting for it")
                else:
                    self._log.info("kubelet socket re-created (kubelet restart); registering again")
                registered_with = None
                self._lost()
            if not self._socket.intact():
                self._lost()
                registered_with = None
                if not await self._serve_again():
                    delay = retry.next()
                    self._log.error(
                        "cannot serve again", error=self._last_serve_error, retry_s=delay
                    )
                    now = time.monotonic()
                    serve_failures += 1
                    failing_since = now if serve_failures == 1 else failing_since
                    if serve_failures > 1 and now - failing_since >= self._serve_give_up_s:
                        raise SocketLostError(
                            f"cannot serve {self._socket.path} again: {serve_failures} attempts "
                            f"failed over {now - failing_since:.0f} s ({self._last_serve_error}); "
                            "exiting so that the plugin is restarted"
                        )
                    await self._watcher.wait(delay)
                    continue
                serve_failures = 0
                continue  # a new round: kubelet.sock is read again before we register
            if registered_with is not None:
                await self._watcher.wait(self._watcher.poll_s)
                continue
            if kubelet is None:
                if not waiting_logged:
                    self._log.info("waiting for the kubelet", kubelet_socket=self._kubelet_socket)
                    waiting_logged = True
                await self._watcher.wait(min(retry.next(), self._watcher.poll_s))
                continue
            try:
                await self._register()
            except RegistrationError as exc:
                failures += 1
                delay = retry.next()
                log = self._log.warning if failures == 1 else self._log.debug
                log("registration failed; will retry", error=str(exc), retry_s=delay)
                await self._watcher.wait(delay)
                continue
            registered_with = kubelet
            self.registered = True
            failures = 0
            waiting_logged = False
            retry.reset()
            self.registrations += 1
            self._log.info(
                "registered with kubelet",
                kubelet_socket=self._kubelet_socket,
                endpoint=self._request.endpoint,
                registrations=self.registrations,
                tasks=len(asyncio.all_tasks()),
            )
            if self._on_registered is not None:
                self._on_registered()

    def _lost(self) -> None:
        """The registration is gone (the kubelet restarted): tell ``on_unregistered`` once."""
        if not self.registered:
            return
        self.registered = False
        if self._on_unregistered is not None:
            self._on_unregistered()

    async def _serve_again(self) -> bool:
        self._log.info(
            "plugin socket gone (kubelet restart?); serving again", socket=self._socket.path
        )
        await self._socket.stop(grace=0)
        try:
            await self._socket.start()
        except NvpluginError as exc:
            self._last_serve_error = str(exc)
            return False
        return True

    async def _register(self) -> None:
        try:
            await register(self._kubelet_socket, self._request)
        except RegistrationError as exc:
            # The kubelet refuses a second registration of the same socket while it still reads
            # our stream: then we are registered. Right after we served again the stream it
            # means it has not noticed the old one ended yet: retry.
            if "already connected" in str(exc) and self._service.open_streams > 0:
                self._log.info("kubelet already connected to us", error=str(exc))
                return
            raise
