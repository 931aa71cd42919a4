"""The daemon's background tasks, each owned by the one lifetime it belongs to.

A :class:`Tasks` is the owner of one lifetime's tasks: the daemon's whole life (the config
selector, the labeller's refresh, the NodeFeature publisher), one generation of served resources
(the directory watch, the policies' build, the registrars), the config selector's own followers,
one MPS control daemon's watch. Whatever starts a task starts it through its lifetime's owner
(:meth:`Tasks.spawn`), and nothing cancels a task by hand: the lifetime ends with
:meth:`Tasks.close`, which cancels every task it still has and waits for them, at most
``timeout`` seconds. A task that ignores cancellation is logged and left behind, so a stop never
hangs (shutdown has a 2 s budget inside Kubernetes' 30 s grace period). A task that fails is
logged when it fails, not when its lifetime ends.

Not :class:`asyncio.TaskGroup`: a group's end waits for its tasks without a bound, and the first
task that fails cancels every other -- a failing label refresh would end the daemon's serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from nvplugin.log import get_logger

STOP_S = 1.0
"""How long :meth:`Tasks.close` waits for its tasks to end once cancelled."""

T = TypeVar("T")


class Tasks:
    """The tasks of one lifetime, named ``owner`` in the log (see the module docstring)."""

    def __init__(self, owner: str, timeout: float = STOP_S) -> None:
        self.owner = owner
        self._timeout = timeout
        self._tasks: set[asyncio.Task[Any]] = set()
        self._quiet: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._log = get_logger("nvplugin.daemon")

    def __len__(self) -> int:
        """Tasks not done yet."""
        return len(self._tasks)

    def spawn(
        self, work: Coroutine[Any, Any, T], name: str, *, quiet: bool = False
    ) -> asyncio.Task[T]:
        """Run ``work`` as a task of this lifetime. ``quiet``: its failure is not logged here
        (a task that only passes on another's result, which is logged there). RuntimeError once
        the lifetime has ended."""
        if self._closed:
            work.close()
            raise RuntimeError(f"{self.owner}: ended; cannot start {name}")
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        if quiet:
            self._quiet.add(task)
        task.add_done_callback(self._done)
        return task

    async def close(self) -> None:
        """End the lifetime: no new task, every task cancelled and waited for (at most
        ``timeout`` seconds; one still running then is logged and left)."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self._timeout)
        for task in pending:
            self._log.error("task did not stop", owner=self.owner, task=task.get_name())

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        quiet = task in self._quiet
        self._quiet.discard(task)
        if task.cancelled():
            return
        error = task.exception()  # retrieved: asyncio does not report it again at exit
        if error is not None and not quiet:
            self._log.error(
                "task failed", owner=self.owner, task=task.get_name(), error=repr(error)
            )
