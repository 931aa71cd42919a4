"""Capped exponential backoff: the one way the daemon waits between attempts at something that
keeps failing -- registering with a kubelet that is not there, the Kubernetes API, NVML's event
set, an MPS control daemon that will not start.

:class:`Backoff` is the schedule (first wait, cap, optional jitter), a value each user declares
once with its own defaults; :class:`Retry` is one retry loop's place in it: :meth:`Retry.next`
is the wait before the next attempt (the first wait, then doubling up to the cap), and the loop
starts over after a good attempt (:meth:`Retry.reset`) or a good run (:meth:`Retry.next_after`:
an attempt that lasted at least the cap before it failed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Waits of ``initial_s``, doubling up to ``maximum_s``. ``jitter`` (0 to 1): each wait is
    shortened by up to that fraction, at random, so that many clients that failed together do
    not retry together."""

    initial_s: float = 0.1
    maximum_s: float = 5.0
    jitter: float = 0.0

    def after(self, wait: float) -> float:
        """The wait that follows one of ``wait`` seconds (0: none yet, the first wait)."""
        if wait <= 0:
            return self.initial_s
        return min(wait * 2, self.maximum_s)

    def jittered(self, wait: float) -> float:
        """``wait`` shortened by the jitter (unchanged without one)."""
        if self.jitter <= 0:
            return wait
        return wait * random.uniform(1.0 - self.jitter, 1.0)


class Retry:
    """One retry loop's waits under ``backoff`` (see the module docstring)."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self._wait = 0.0  # the last wait handed out (0: none since the start or a reset)

    def next(self) -> float:
        """The wait before the next attempt; the one after it is twice as long (capped)."""
        self._wait = self.backoff.after(self._wait)
        return self.backoff.jittered(self._wait)

    def next_after(self, ran_s: float) -> float:
        """:meth:`next` after an attempt that ran ``ran_s`` seconds before it failed: one that ran
        at least the cap was a good run, and the waits start over."""
        if ran_s >= self.backoff.maximum_s:
            self.reset()
        return self.next()

    def reset(self) -> None:
        """A good attempt: the next wait is the first one again."""
        self._wait = 0.0
