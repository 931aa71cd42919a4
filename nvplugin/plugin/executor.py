"""The request executor: the daemon's own few threads that do the work of its
GetPreferredAllocation and Allocate requests, off the event loop, a unit at a time.

Why threads of our own, and why units:

- Off the event loop. A request's work can take a while (a search per container, within the
  policy's budget); on the loop it would stall health checks, ListAndWatch and every other RPC
  meanwhile.
- Not the loop's default executor. Reload and shutdown use that one (policy tables, NVML, the
  health monitor's stop), and ``asyncio.run`` waits for every thread of it before the process may
  exit: a flood of requests queued there delayed a SIGTERM by tens of seconds. This one is a
  :class:`~concurrent.futures.ThreadPoolExecutor` of :data:`WORKERS` threads that the daemon
  closes first when it stops (:meth:`RequestExecutor.close`): every caller is told at once
  (:class:`Closed`, which the server answers UNAVAILABLE) and what is queued is dropped; a unit
  already running ends within its own bound (one container's search: the policy's budget), and
  the interpreter's exit waits for nothing longer.
- Units, taken in turn. A request hands the executor one unit at a time (its checks and first
  container, then each next container: one policy call) and waits for it under its own deadline,
  so the queue interleaves the requests in flight: one that asks for a lot never delays one that
  asks for little by more than a unit of each other request, and a request whose deadline passed
  or whose client went (its caller cancelled) hands over no further unit; its queued one is
  dropped.
- Bounded. At most :data:`CAPACITY` requests hold a place (:meth:`RequestExecutor.admitted`), and
  each has at most one unit queued or running, so the queue never holds more than that. A request
  that finds every place taken is turned away at once (:class:`Busy`): the server answers
  GetPreferredAllocation with no preference (the kubelet then chooses) and Allocate with
  RESOURCE_EXHAUSTED. The kubelet sends one request at a time; only a flood from elsewhere fills
  the places.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

WORKERS = 4
"""Threads. The work is CPU-bound Python (and numpy), so more threads would not answer faster;
four keep a few slow units (a search each) from holding every thread."""
CAPACITY = 16
"""Requests that may hold a place at once (each with at most one unit queued or running)."""

STOPPING = "the plugin is stopping"

T = TypeVar("T")


class Closed(RuntimeError):
    """The executor was closed (the daemon is stopping) before the unit was done."""


class Busy(RuntimeError):
    """Every place is taken: the request is turned away without being queued."""


class RequestExecutor:
    """The threads and their bounded queue (see the module docstring)."""

    def __init__(
        self, workers: int = WORKERS, capacity: int = CAPACITY, name: str = "nvplugin-requests"
    ) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._capacity = capacity
        self._admitted = 0
        self._closed = False
        self._waiters: set[asyncio.Future[Any]] = set()  # callers waiting for a unit

    @property
    def in_flight(self) -> int:
        """Requests holding a place now."""
        return self._admitted

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """Hold a place for the block (event loop thread): :class:`Busy` when every place is
        taken, :class:`Closed` after :meth:`close`."""
        if self._closed:
            raise Closed(STOPPING)
        if self._admitted >= self._capacity:
            raise Busy(f"{self._admitted} requests in progress, the most the plugin takes at once")
        self._admitted += 1
        try:
            yield
        finally:
            self._admitted -= 1

    async def run(self, unit: Callable[..., T], *args: Any) -> T:
        """``unit(*args)`` on a thread; its result, or what it raised. :class:`Closed` when the
        executor closes first. Cancelling the caller drops the unit if it has not started (one
        that has runs to its end, unheard)."""
        if self._closed:
            raise Closed(STOPPING)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()
        job = self._pool.submit(unit, *args)
        job.add_done_callback(functools.partial(_settle_soon, loop, waiter))
        self._waiters.add(waiter)
        try:
            return await waiter
        finally:
            self._waiters.discard(waiter)
            job.cancel()  # still queued (the caller went): never run
            # An exception raised here holds this frame, which must not hold the exception in
            # turn (waiter and job -> exception): that cycle would keep the request's objects
            # alive until the garbage collector happens by.
            del waiter, job

    def close(self) -> None:
        """Tell every caller the plugin is stopping and drop what is queued; the threads end
        once a unit in progress is done (not waited for)."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(Closed(STOPPING))


def _settle_soon(
    loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[T], job: Future[T]
) -> None:
    """A unit is done (on its thread), or dropped: hand the outcome to the caller's loop."""
    with contextlib.suppress(RuntimeError):  # the caller's loop has closed
        loop.call_soon_threadsafe(_settle, waiter, job)


def _settle(waiter: asyncio.Future[T], job: Future[T]) -> None:
    if waiter.done():  # the caller went, or close() told it already
        return
    if job.cancelled():
        waiter.set_exception(Closed(STOPPING))
        return
    error = job.exception()
    if error is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(job.result())
