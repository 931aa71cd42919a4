"""Stopping the daemon's background tasks: one way, bounded in time.

Every long-lived task the daemon starts (registrars, policies, the config selector, MPS watchers,
label refreshers) is stopped with :func:`cancel`: cancelled, then waited for at most ``timeout``
seconds. A task that failed earlier is logged rather than raised into the shutdown that stops it,
and a task that ignores cancellation is logged and left behind, so a stop never hangs (shutdown
has a 2 s budget inside Kubernetes' 30 s grace period).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from nvplugin.log import get_logger


async def cancel(tasks: Iterable[asyncio.Task[Any] | None], timeout: float = 1.0) -> None:
    """Cancel ``tasks`` (``None`` entries are skipped) and wait for them, never longer than
    ``timeout`` seconds."""
    started = [task for task in tasks if task is not None]
    for task in started:
        task.cancel()
    if not started:
        return
    done, pending = await asyncio.wait(started, timeout=timeout)
    log = get_logger("nvplugin.daemon")
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error("task failed", task=task.get_name(), error=repr(task.exception()))
    for task in pending:
        log.error("task did not stop", task=task.get_name())
