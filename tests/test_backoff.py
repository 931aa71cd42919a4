"""The package's one backoff: capped doubling, jitter that only shortens, and a retry loop that
starts over after a good attempt or a good run; each user keeps its own schedule."""

from __future__ import annotations

from nvplugin.backoff import Backoff, Retry
from nvplugin.kube.node import API_BACKOFF
from nvplugin.node.health import BACKOFF_INITIAL_S, BACKOFF_MAX_S
from nvplugin.plugin.mps import Timing
from nvplugin.plugin.registrar import REGISTER_BACKOFF


def test_waits_double_up_to_the_cap_and_start_over_after_a_good_attempt() -> None:
    retry = Retry(Backoff(0.1, 1.0))
    assert [retry.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    retry.reset()
    assert [retry.next() for _ in range(2)] == [0.1, 0.2]


def test_a_good_run_starts_the_waits_over() -> None:
    retry = Retry(Backoff(0.5, 4.0))
    assert [retry.next_after(0.0) for _ in range(3)] == [0.5, 1.0, 2.0]
    assert retry.next_after(3.9) == 4.0  # ran shorter than the longest wait: still failing
    assert retry.next_after(4.0) == 0.5  # ran as long as the longest wait: a good run


def test_jitter_only_shortens_a_wait() -> None:
    retry = Retry(Backoff(1.0, 8.0, jitter=0.2))
    waits = [retry.next() for _ in range(200)]
    assert all(0.8 * 8.0 <= wait <= 8.0 for wait in waits[3:])
    assert len(set(waits[3:])) > 1
    assert Backoff(1.0, 8.0).jittered(3.0) == 3.0


def test_each_user_keeps_its_schedule() -> None:
    assert (REGISTER_BACKOFF.initial_s, REGISTER_BACKOFF.maximum_s) == (0.1, 5.0)
    assert (API_BACKOFF.initial_s, API_BACKOFF.maximum_s, API_BACKOFF.jitter) == (0.5, 10.0, 0.2)
    assert (BACKOFF_INITIAL_S, BACKOFF_MAX_S) == (0.1, 2.0)
    assert (Timing().backoff_s, Timing().backoff_max_s) == (0.5, 30.0)
