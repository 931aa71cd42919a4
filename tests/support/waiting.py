"""What every test shares about waiting.

A test waits on an event (a log line, a registration, a device change, a predicate turning
true), never for a fixed time, and gives up after :data:`WAIT_S`. That bound is only reached
when something is broken, so it is generous and the same everywhere: under load (two cores,
other test runs, busy loops) a subprocess that starts in 0.5 s takes seconds, and short per-step
deadlines (2 s, 5 s) were what made tests flaky.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

WAIT_S = 30.0
"""How long a test waits for one thing it expects before it fails."""


async def until(predicate: Callable[[], bool], what: str = "a condition") -> None:
    """Poll ``predicate`` (every 10 ms) until it holds; AssertionError naming ``what`` after
    :data:`WAIT_S`. For state with no event to wait on (a list a stream task appends to)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {WAIT_S:g} s waiting for {what}")
        await asyncio.sleep(0.01)


def until_sync(predicate: Callable[[], bool], what: str = "a condition") -> None:
    """:func:`until` for a test without an event loop (state another thread moves)."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_S:g} s waiting for {what}")
        time.sleep(0.01)
