"""The request workers: the few threads of the daemon's own that do the work of its
GetPreferredAllocation and Allocate requests, a little of each request at a time.

Why threads of our own, and why a little at a time:

- Off the event loop. A request's work can take a while (600 containers, a search per container,
  or an Allocate reply of thousands of containers); on the loop it would stall health checks,
  ListAndWatch and every other RPC meanwhile.
- Not the loop's default executor. Reload and shutdown use that one (policy tables, stopping the
  health monitor), and ``asyncio.run`` waits for every thread of it before the process may exit:
  a flood of requests queued there delayed a SIGTERM by tens of seconds. These threads are
  daemon threads nobody waits for; :meth:`RequestWorkers.close` drops every request.
- Round robin. A request is a :class:`Job` done in steps (a step: a millisecond or two of work,
  or one container's policy call); the workers take turns between the requests in flight, one
  step each, so a request that asks for a lot never delays one that asks for little by more than
  a step of each other request.
- Bounded. A caller may give a deadline (:meth:`RequestWorkers.run`): when it passes, or when the
  caller is cancelled (the client went away, the server stops), the job is dropped at its next
  turn and the caller returns at once, whatever the step in progress is still doing (it ends
  within its own bound: a policy call within the policy's budget).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from typing import Generic, Protocol, TypeVar

WORKERS = 4
"""Threads per :class:`RequestWorkers`. The work is CPU-bound Python (and numpy), so more threads
would not answer faster; four keep a few slow steps (a search each) from holding every worker."""
STEP_S = 0.002
"""How long a :class:`StepsJob` step goes on before the job gives up its turn."""

CLOSE_WAIT_S = 0.1
"""How long :meth:`RequestWorkers.close` waits for its threads to end."""

T = TypeVar("T")


class WorkersClosed(RuntimeError):
    """The request workers were closed (the daemon is stopping) before the job was done."""


class Job(Protocol):
    """Work done in steps on a worker thread."""

    def step(self, dropped: Callable[[], bool]) -> bool:
        """Do a step of the work; True when there is none left. An exception ends the job and
        is raised to its caller. ``dropped()`` turns true when the caller no longer waits: a
        step that has more than one unit of work stops before the next one."""
        ...


class StepsJob(Generic[T]):
    """A :class:`Job` over a generator that yields between its units of work and returns the
    result (``value`` once :meth:`step` has returned True). A step runs units for up to
    ``step_s``: a turn is neither a single microsecond-long unit nor a long run of them."""

    def __init__(self, steps: Generator[object, None, T], step_s: float = STEP_S) -> None:
        self._steps = steps
        self._step_s = step_s
        self._value: T | None = None
        self._done = False

    @property
    def value(self) -> T:
        if not self._done:
            raise RuntimeError("the job has not finished")
        return self._value  # type: ignore[return-value]

    def step(self, dropped: Callable[[], bool]) -> bool:
        until = time.monotonic() + self._step_s
        try:
            while True:
                next(self._steps)
                if time.monotonic() >= until or dropped():
                    return False
        except StopIteration as stop:
            self._value = stop.value
            self._done = True
            return True


class _Entry:
    """A job in flight and the future its caller awaits (resolved on the caller's loop)."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        self.job = job
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        # Set when the caller no longer waits: the worker drops the job at its next turn (an
        # Event of its own, so that what reads it need not hold the entry and its future).
        self.dropped = threading.Event()

    def finish(self, error: BaseException | None) -> None:
        """Called on a worker thread: tell the caller, unless it is gone."""

        def settle() -> None:
            if self.future.done():
                return
            if error is None:
                self.future.set_result(None)
            else:
                self.future.set_exception(error)

        with contextlib.suppress(RuntimeError):  # the caller's loop has closed
            self.loop.call_soon_threadsafe(settle)


def _step(entry: _Entry) -> tuple[bool, BaseException | None]:
    """One step of ``entry``'s job: (done, the exception that ended it). Caught here, in a frame
    of its own, so that the exception's traceback does not hold the worker's frame (and, through
    it, the next entries)."""
    job = entry.job
    dropped = entry.dropped.is_set
    del entry  # the traceback holds this frame: not the future the exception goes to
    try:
        return job.step(dropped), None
    except BaseException as exc:  # the caller gets it; the worker goes on
        return True, exc


class RequestWorkers:
    """The worker threads and their round-robin queue (see the module docstring)."""

    def __init__(self, workers: int = WORKERS, name: str = "nvplugin-requests") -> None:
        self._queue: deque[_Entry] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._entries: set[_Entry] = set()  # jobs in flight (queued or in a step)
        self._workers = workers
        self._name = name
        self._threads: list[threading.Thread] = []  # started with the first job

    @property
    def in_flight(self) -> int:
        """Jobs queued or in a step now (a dropped job counts until its turn comes)."""
        with self._cond:
            return len(self._entries)

    async def run(self, job: Job, deadline: float | None = None) -> bool:
        """Do ``job`` on the workers; True once it is done, False when the loop time
        ``deadline`` came first (the job is then dropped). Raises what a step raised, and
        :class:`WorkersClosed` after :meth:`close`. Cancelling the caller drops the job too."""
        loop = asyncio.get_running_loop()
        entry = _Entry(job, loop)
        with self._cond:
            if self._closed:
                raise WorkersClosed("the plugin is stopping")
            while len(self._threads) < self._workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
            self._queue.append(entry)
            self._entries.add(entry)
            self._cond.notify()
        try:
            if deadline is None:
                await entry.future
                return True
            try:
                async with asyncio.timeout_at(deadline):
                    await entry.future
            except TimeoutError:
                return False
            return True
        finally:
            entry.dropped.set()  # done already, or to be dropped at its next turn
            # An exception raised here holds this frame, which must not hold the exception in
            # turn (entry -> future -> exception): that cycle would keep the request's objects
            # alive until the garbage collector happens by.
            del entry

    def close(self) -> None:
        """Drop every job and end the threads: the idle ones at once (waited for, at most
        :data:`CLOSE_WAIT_S` in all), one in a step when its step ends (not waited for: they
        are daemon threads, and the process may exit meanwhile)."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            dropped, self._entries = self._entries, set()
            self._cond.notify_all()
            threads, self._threads = self._threads, []
        for entry in dropped:  # those in a step too: their callers are told now
            entry.dropped.set()
            entry.finish(WorkersClosed("the plugin is stopping"))
        until = time.monotonic() + CLOSE_WAIT_S
        for thread in threads:
            thread.join(max(0.0, until - time.monotonic()))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                entry = self._queue.popleft()
            if entry.dropped.is_set():
                self._release(entry)
                continue
            done, error = _step(entry)
            if done:
                self._release(entry)
                entry.finish(error)
                continue
            with self._cond:
                if self._closed:
                    return  # close() has told its caller
                self._queue.append(entry)  # at the back: every other job gets its turn first
                self._cond.notify()

    def _release(self, entry: _Entry) -> None:
        with self._cond:
            self._entries.discard(entry)
