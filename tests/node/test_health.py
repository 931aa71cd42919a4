"""Health: the state machine against a scripted in-test event source, then end to end through the
simulated NVML (real pynvml calls, scripted node-file events)."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

import nvplugin.nodefile
from nvplugin.node.health import DEFAULT_IGNORED_XIDS, HealthMonitor, HealthSettings
from nvplugin.node.nvml import EventWaitError, GpuEvent
from nvplugin.nodesession import open_node
from tests.support.waiting import WAIT_S as WAIT

# --- a scripted event source --------------------------------------------------------------


class FakeWatcher:
    def __init__(self, nvml: FakeNvml, indices: Sequence[int]) -> None:
        self.nvml = nvml
        self.indices = list(indices)
        self.closed = False

    def wait(self, timeout_ms: int) -> list[GpuEvent]:
        assert not self.closed, "wait on a closed event set"
        with self.nvml.cond:
            self.nvml.waits += 1
            self.nvml.cond.notify_all()
        try:
            item = self.nvml.script.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return []
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self.closed = True


class FakeNvml:
    """Events and wait failures come from ``script``; probes and creation are scripted too."""

    def __init__(self) -> None:
        self.script: queue.Queue[list[GpuEvent] | Exception] = queue.Queue()
        self.probe_ok: dict[int, bool] = {}
        self.create_fails = 0  # how many of the next watch_events calls fail
        self.watchers: list[FakeWatcher] = []
        self.probes: list[int] = []
        self.waits = 0
        self.cond = threading.Condition()

    def watch_events(self, indices: Sequence[int]) -> FakeWatcher:
        if self.create_fails:
            self.create_fails -= 1
            raise EventWaitError("create an NVML event set: Unknown Error")
        for index in indices:
            if not self.probe_ok.get(index, True):  # as NVML: a lost GPU cannot be registered
                raise EventWaitError(f"register Xid events of GPU {index}: GPU is lost")
        watcher = FakeWatcher(self, indices)
        self.watchers.append(watcher)
        return watcher

    def probe(self, index: int) -> bool:
        with self.cond:
            self.probes.append(index)
            self.cond.notify_all()
        return self.probe_ok.get(index, True)

    def wait_for_probes(self, count: int) -> None:
        with self.cond:
            target = len(self.probes) + count
            assert self.cond.wait_for(lambda: len(self.probes) >= target, WAIT)

    def wait_for_waits(self, count: int) -> None:
        """Block until the monitor has entered ``wait`` ``count`` more times (so it is idle)."""
        with self.cond:
            target = self.waits + count
            assert self.cond.wait_for(lambda: self.waits >= target, WAIT)


class Changes:
    """Collects on_change calls (made on the health thread)."""

    def __init__(self) -> None:
        self.seen: queue.Queue[dict[int, bool]] = queue.Queue()

    def __call__(self, health: dict[int, bool]) -> None:
        self.seen.put(health)

    def next(self) -> dict[int, bool]:
        return self.seen.get(timeout=WAIT)

    def none_pending(self) -> bool:
        return self.seen.empty()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def monitor(
    nvml: FakeNvml,
    changes: Callable[[dict[int, bool]], None],
    gpus: int = 4,
    settings: HealthSettings | None = None,
    clock: FakeClock | None = None,
) -> HealthMonitor:
    return HealthMonitor(
        nvml,
        range(gpus),
        settings or HealthSettings(),
        changes,
        wait_timeout_ms=20,
        backoff_initial_s=0.01,
        backoff_max_s=0.04,
        clock=clock or FakeClock(),
    )


def healthy(n: int, *bad: int) -> dict[int, bool]:
    return {i: i not in bad for i in range(n)}


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
def changes() -> Changes:
    return Changes()


# --- the state machine --------------------------------------------------------------------


def test_critical_xid_marks_only_that_gpu(nvml: FakeNvml, changes: Changes) -> None:
    m = monitor(nvml, changes)
    m.start()
    try:
        assert m.health == healthy(4)
        nvml.script.put([GpuEvent(2, xid=48)])
        assert changes.next() == healthy(4, 2)
        assert m.health == healthy(4, 2)
        nvml.script.put([GpuEvent(0, xid=94), GpuEvent(2, xid=48)])
        assert changes.next() == healthy(4, 0, 2)
        nvml.wait_for_waits(2)
        assert changes.none_pending()  # GPU 2 again: no change, no call
    finally:
        m.stop()


@pytest.mark.parametrize("xid", sorted(DEFAULT_IGNORED_XIDS))
def test_default_ignored_xids_change_nothing(nvml: FakeNvml, changes: Changes, xid: int) -> None:
    m = monitor(nvml, changes)
    m.start()
    try:
        nvml.script.put([GpuEvent(1, xid=xid)])
        nvml.script.put([GpuEvent(3, xid=63)])  # a critical one after it, to know it was read
        assert changes.next() == healthy(4, 3)
    finally:
        m.stop()


def test_configured_ignore_list_is_used(nvml: FakeNvml, changes: Changes) -> None:
    settings = HealthSettings(ignored_xids=frozenset({48}))  # 13 made critical, 48 ignored
    m = monitor(nvml, changes, settings=settings)
    m.start()
    try:
        nvml.script.put([GpuEvent(0, xid=48)])
        nvml.script.put([GpuEvent(1, xid=13)])
        assert changes.next() == healthy(4, 1)
    finally:
        m.stop()


def test_only_listed_xids_count(nvml: FakeNvml, changes: Changes) -> None:
    """NVIDIA's DP_DISABLE_HEALTHCHECKS=all + DP_ENABLE_HEALTHCHECKS=48,13: an Xid not listed
    changes nothing, a listed one counts even if ignored by default, a loss still counts."""
    settings = HealthSettings(only_xids=frozenset({48, 13}))
    m = monitor(nvml, changes, settings=settings)
    m.start()
    try:
        nvml.script.put([GpuEvent(0, xid=63), GpuEvent(0, xid=31)])  # not listed
        nvml.script.put([GpuEvent(1, xid=13)])  # listed, though an application Xid
        assert changes.next() == healthy(4, 1)
        nvml.script.put([GpuEvent(2, xid=48)])
        assert changes.next() == healthy(4, 1, 2)
        nvml.script.put([GpuEvent(3, lost=True)])
        assert changes.next() == healthy(4, 1, 2, 3)
    finally:
        m.stop()


def test_lost_gpu_is_unhealthy_even_when_xid_79_is_ignored(
    nvml: FakeNvml, changes: Changes
) -> None:
    settings = HealthSettings(ignored_xids=DEFAULT_IGNORED_XIDS | {79})
    m = monitor(nvml, changes, settings=settings)
    m.start()
    try:
        nvml.script.put([GpuEvent(1, xid=79)])
        assert changes.next() == healthy(4, 1)
        nvml.script.put([GpuEvent(3, lost=True)])
        assert changes.next() == healthy(4, 1, 3)
    finally:
        m.stop()


def test_events_for_gpus_not_watched_are_dropped(nvml: FakeNvml, changes: Changes) -> None:
    m = monitor(nvml, changes, gpus=2)
    m.start()
    try:
        nvml.script.put([GpuEvent(7, xid=48), GpuEvent(1, xid=48)])
        assert changes.next() == healthy(2, 1)
    finally:
        m.stop()


def test_wait_failure_marks_all_then_restores_previous_state(
    nvml: FakeNvml, changes: Changes
) -> None:
    m = monitor(nvml, changes)
    m.start()
    try:
        nvml.script.put([GpuEvent(1, xid=48)])
        assert changes.next() == healthy(4, 1)
        nvml.probe_ok[2] = False  # GPU 2 gets lost while NVML cannot tell us
        nvml.script.put(EventWaitError("waiting for NVML events failed: Unknown Error"))
        nvml.script.put(EventWaitError("waiting for NVML events failed: Unknown Error"))
        assert changes.next() == healthy(4, 0, 1, 2, 3)
        # NVML answers again: GPU 1 stays unhealthy (its own Xid), GPU 2 fails its probe.
        assert changes.next() == healthy(4, 1, 2)
        assert m.health == healthy(4, 1, 2)
        assert len(nvml.watchers) == 3  # the first, one whose wait failed again, the working one
        assert [w.closed for w in nvml.watchers] == [True, True, False]
        assert nvml.watchers[-1].indices == [0, 1, 3]  # lost GPU 2 cannot be registered
    finally:
        m.stop()
    assert nvml.watchers[-1].closed


def test_gpu_lost_at_start_is_unhealthy_and_left_out(nvml: FakeNvml, changes: Changes) -> None:
    nvml.probe_ok[1] = False
    m = monitor(nvml, changes)
    m.start()
    try:
        assert changes.next() == healthy(4, 1)
        nvml.wait_for_waits(1)
        assert [w.indices for w in nvml.watchers] == [[0, 2, 3]]
    finally:
        m.stop()


def test_lost_gpu_leaves_the_event_set(nvml: FakeNvml, changes: Changes) -> None:
    m = monitor(nvml, changes)
    m.start()
    try:
        nvml.wait_for_waits(1)
        nvml.probe_ok[2] = False
        nvml.script.put([GpuEvent(2, lost=True)])
        assert changes.next() == healthy(4, 2)
        nvml.wait_for_waits(2)
        assert [w.indices for w in nvml.watchers] == [[0, 1, 2, 3], [0, 1, 3]]
        assert [w.closed for w in nvml.watchers] == [True, False]
        nvml.script.put([GpuEvent(0, xid=48)])  # the others are still watched
        assert changes.next() == healthy(4, 0, 2)
    finally:
        m.stop()


def test_recovered_lost_gpu_is_watched_again(nvml: FakeNvml, changes: Changes) -> None:
    clock = FakeClock()
    nvml.probe_ok[3] = False
    m = monitor(nvml, changes, settings=HealthSettings(recovery_quiet_s=5), clock=clock)
    m.start()
    try:
        assert changes.next() == healthy(4, 3)
        nvml.probe_ok[3] = True
        clock.now += 5
        assert changes.next() == healthy(4)
        nvml.wait_for_waits(2)
        assert [w.indices for w in nvml.watchers] == [[0, 1, 2], [0, 1, 2, 3]]
        nvml.script.put([GpuEvent(3, xid=48)])
        assert changes.next() == healthy(4, 3)
    finally:
        m.stop()


def test_no_gpu_answering_keeps_all_unhealthy_without_blaming_them(
    nvml: FakeNvml, changes: Changes
) -> None:
    m = monitor(nvml, changes)
    m.start()
    try:
        nvml.wait_for_waits(1)
        for i in range(4):
            nvml.probe_ok[i] = False  # NVML answers nothing at all for a while
        nvml.script.put(EventWaitError("waiting for NVML events failed: Unknown Error"))
        assert changes.next() == healthy(4, 0, 1, 2, 3)
        nvml.wait_for_probes(12)  # several rounds of probes, all failing
        assert len(nvml.watchers) == 1
        for i in range(4):
            nvml.probe_ok[i] = True
        assert changes.next() == healthy(4)  # no GPU was blamed for NVML's outage
    finally:
        m.stop()


def test_event_set_creation_failing_marks_all_and_retries(nvml: FakeNvml, changes: Changes) -> None:
    nvml.create_fails = 3
    m = monitor(nvml, changes)
    m.start()
    try:
        assert changes.next() == healthy(4, 0, 1, 2, 3)
        assert changes.next() == healthy(4)
        nvml.script.put([GpuEvent(0, xid=48)])
        assert changes.next() == healthy(4, 0)
        assert len(nvml.watchers) == 1
    finally:
        m.stop()


def test_no_recovery_by_default(nvml: FakeNvml, changes: Changes) -> None:
    clock = FakeClock()
    m = monitor(nvml, changes, clock=clock)
    m.start()
    try:
        nvml.script.put([GpuEvent(1, xid=48)])
        assert changes.next() == healthy(4, 1)
        probes = len(nvml.probes)  # those of the start
        clock.now += 10_000
        nvml.wait_for_waits(3)
        assert m.health == healthy(4, 1)
        assert len(nvml.probes) == probes
    finally:
        m.stop()


def test_recovery_after_quiet_period_and_successful_probe(nvml: FakeNvml, changes: Changes) -> None:
    clock = FakeClock()
    m = monitor(nvml, changes, settings=HealthSettings(recovery_quiet_s=60), clock=clock)
    m.start()
    try:
        nvml.script.put([GpuEvent(1, xid=48)])
        assert changes.next() == healthy(4, 1)
        probes = len(nvml.probes)  # those of the start
        clock.now += 59
        nvml.wait_for_waits(3)
        assert m.health == healthy(4, 1)  # not quiet long enough
        nvml.script.put([GpuEvent(1, xid=48)])  # a new Xid restarts the quiet period
        nvml.wait_for_waits(2)
        clock.now += 59
        nvml.wait_for_waits(3)
        assert m.health == healthy(4, 1)
        assert len(nvml.probes) == probes
        nvml.probe_ok[1] = False
        clock.now += 1
        nvml.wait_for_waits(3)
        assert m.health == healthy(4, 1)  # quiet, but the probe fails
        assert nvml.probes[probes:] == [1]
        nvml.probe_ok[1] = True
        clock.now += 1  # probes of a failing GPU are spaced (at most one a second)
        assert changes.next() == healthy(4)
    finally:
        m.stop()


def test_ignored_xids_do_not_restart_the_quiet_period(nvml: FakeNvml, changes: Changes) -> None:
    clock = FakeClock()
    m = monitor(nvml, changes, settings=HealthSettings(recovery_quiet_s=60), clock=clock)
    m.start()
    try:
        nvml.script.put([GpuEvent(1, xid=48)])
        assert changes.next() == healthy(4, 1)
        clock.now += 30
        nvml.script.put([GpuEvent(1, xid=13)])
        nvml.wait_for_waits(2)
        clock.now += 30
        assert changes.next() == healthy(4)
    finally:
        m.stop()


def test_disabled_health_checks_watch_nothing(nvml: FakeNvml, changes: Changes) -> None:
    m = monitor(nvml, changes, settings=HealthSettings(enabled=False))
    m.start()
    m.stop()
    assert nvml.watchers == []
    assert m.health == healthy(4)
    assert changes.none_pending()


def test_stop_closes_the_event_set_and_ends_the_thread(nvml: FakeNvml, changes: Changes) -> None:
    m = monitor(nvml, changes)
    m.start()
    nvml.wait_for_waits(1)
    m.stop()
    assert [w.closed for w in nvml.watchers] == [True]
    assert not any(t.name == "nvplugin-health" for t in threading.enumerate())
    m.stop()  # idempotent


def test_a_failing_callback_does_not_end_monitoring(nvml: FakeNvml) -> None:
    seen: list[dict[int, bool]] = []

    def callback(health: dict[int, bool]) -> None:
        seen.append(health)
        if len(seen) == 1:
            raise RuntimeError("boom")

    m = monitor(nvml, callback)
    m.start()
    try:
        nvml.script.put([GpuEvent(0, xid=48)])
        nvml.script.put([GpuEvent(1, xid=48)])
        nvml.wait_for_waits(3)
        assert seen == [healthy(4, 0), healthy(4, 0, 1)]
    finally:
        m.stop()


def test_an_unexpected_error_in_a_cycle_does_not_end_monitoring(
    nvml: FakeNvml, changes: Changes
) -> None:
    m = monitor(nvml, changes)
    m.start()
    try:
        assert m.health == healthy(4)
        nvml.script.put([None])  # type: ignore[list-item]  # makes _apply raise
        assert changes.next() == healthy(4, 0, 1, 2, 3)  # as an NVML failure: all Unhealthy
        assert changes.next() == healthy(4)  # event set rebuilt, previous state back
        nvml.script.put([GpuEvent(1, xid=48)])
        assert changes.next() == healthy(4, 1)  # still monitoring
    finally:
        m.stop()


# --- through the simulated NVML -----------------------------------------------------------

BUILTIN = Path(nvplugin.nodefile.__file__).parent / "nodes" / "workstation-4gpu.yaml"


def node_file(tmp_path: Path, events: list[dict[str, object]]) -> str:
    """The built-in node with ``events`` set (JSON is YAML flow syntax)."""
    text = BUILTIN.read_text()
    assert text.count("\nevents: []\n") == 1
    path = tmp_path / "node.yaml"
    path.write_text(text.replace("\nevents: []\n", f"\nevents: {json.dumps(events)}\n"))
    return str(path)


def run_simulated(
    tmp_path: Path,
    events: list[dict[str, object]],
    expected: list[dict[int, bool]],
    settings: HealthSettings | None = None,
) -> None:
    """Replay ``events`` through the simulated node; the health changes must be ``expected``."""
    changes = Changes()
    with open_node(node_file(tmp_path, events)) as node:
        m = HealthMonitor(node.nvml, range(4), settings or HealthSettings(), changes)
        m.start()
        try:
            seen = [changes.next() for _ in expected]
        finally:
            m.stop()
    assert seen == expected


def test_simulated_xids(tmp_path: Path) -> None:
    run_simulated(
        tmp_path,
        [
            {"after_s": 0.1, "gpu": 2, "xid": 13},  # ignored
            {"after_s": 0.2, "gpu": 1, "xid": 48},
            {"after_s": 0.3, "gpu": 3, "xid": 79},
        ],
        [healthy(4, 1), healthy(4, 1, 3)],
    )


def test_simulated_lost_gpu_and_recovery(tmp_path: Path) -> None:
    run_simulated(
        tmp_path,
        [
            {"after_s": 0.1, "gpu": 2, "lost": True},
            {"after_s": 1.0, "gpu": 2, "recover": True},
        ],
        [healthy(4, 2), healthy(4)],
        HealthSettings(recovery_quiet_s=0.2),
    )


def test_simulated_wait_error_with_a_lost_gpu(tmp_path: Path) -> None:
    run_simulated(
        tmp_path,
        [
            {"after_s": 0.1, "gpu": 2, "lost": True},
            {"after_s": 0.3, "wait_error": True, "for_s": 1.0},
        ],
        [healthy(4, 2), healthy(4, 0, 1, 2, 3), healthy(4, 2)],
    )


def test_simulated_wait_error_marks_all_then_restores(tmp_path: Path) -> None:
    run_simulated(
        tmp_path,
        [
            {"after_s": 0.1, "gpu": 0, "xid": 48},
            {"after_s": 0.3, "wait_error": True, "for_s": 1.0},
        ],
        [healthy(4, 0), healthy(4, 0, 1, 2, 3), healthy(4, 0)],
    )
