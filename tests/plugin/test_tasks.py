"""One owner per lifetime: ending it cancels every task it still has and waits a bounded time
(a task that ignores cancellation is logged and left, never waited for); a task's failure is
logged when it happens; nothing starts in a lifetime that has ended."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from nvplugin.plugin.tasks import Tasks
from tests.support.waiting import WAIT_S, until


async def _forever() -> None:
    await asyncio.Event().wait()


async def _stubborn(release: asyncio.Event, cancelled: asyncio.Event) -> None:
    """Ignores cancellation until ``release`` is set."""
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.set()


def test_closing_cancels_every_task_and_refuses_new_ones() -> None:
    async def body() -> None:
        tasks = Tasks("test")
        started = [tasks.spawn(_forever(), f"forever-{n}") for n in range(3)]
        assert len(tasks) == 3
        await tasks.close()
        assert all(task.cancelled() for task in started) and len(tasks) == 0
        work = _forever()
        with pytest.raises(RuntimeError, match="test: ended; cannot start late"):
            tasks.spawn(work, "late")
        assert work.cr_frame is None  # closed, not left un-awaited

    asyncio.run(asyncio.wait_for(body(), WAIT_S))


def test_a_task_that_ignores_cancellation_does_not_hold_the_close() -> None:
    async def body() -> None:
        release, cancelled = asyncio.Event(), asyncio.Event()
        with capture_logs() as logs:
            tasks = Tasks("test", timeout=0.05)
            stubborn = tasks.spawn(_stubborn(release, cancelled), "stubborn")
            await asyncio.sleep(0)  # started
            await tasks.close()
            assert cancelled.is_set() and not stubborn.done()  # left behind, not waited for
        assert [(e["event"], e["task"]) for e in logs] == [("task did not stop", "stubborn")]
        release.set()
        await stubborn

    asyncio.run(asyncio.wait_for(body(), WAIT_S))


def test_a_failure_is_logged_when_it_happens() -> None:
    async def fails() -> None:
        raise ValueError("broken")

    async def body() -> None:
        with capture_logs() as logs:
            tasks = Tasks("test")
            failed = tasks.spawn(fails(), "fails")
            quiet = tasks.spawn(fails(), "passes it on", quiet=True)
            await until(lambda: failed.done() and quiet.done(), "both to fail")
            await asyncio.sleep(0)  # the done callbacks
            assert len(tasks) == 0
            failures = [e for e in logs if e["event"] == "task failed"]
            assert [(e["owner"], e["task"]) for e in failures] == [("test", "fails")]
            assert "broken" in failures[0]["error"]
            await tasks.close()
        assert len(logs) == 1

    asyncio.run(asyncio.wait_for(body(), WAIT_S))
