"""Health events through the real pynvml event calls, replayed by the simulated NVML.

A fake clock drives the scripted events, so these tests wait for nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nvplugin.node.nvml import EventWaitError, GpuEvent, Nvml
from nvplugin.nodefile.reader import parse_node
from nvplugin.sim.fakenvml import SimulatedNvml
from tests.support.nodefiles import EVENTS_NODE


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds
        self.slept += seconds


def _session(events: str, **options: object) -> Iterator[tuple[Nvml, SimulatedNvml, FakeClock]]:
    clock = FakeClock()
    spec = parse_node(EVENTS_NODE.replace("{events}", events), "test")
    sim = SimulatedNvml(spec, clock=clock, sleep=clock.sleep, **options)  # type: ignore[arg-type]
    with sim:
        nvml = Nvml(sim.sysfs_root)
        nvml.discover("events")
        yield nvml, sim, clock
        nvml.close()


@pytest.fixture
def script(request: pytest.FixtureRequest) -> Iterator[tuple[Nvml, SimulatedNvml, FakeClock]]:
    yield from _session(request.param)


@pytest.mark.parametrize("script", ["  - {after_s: 2.5, gpu: 1, xid: 79}"], indirect=True)
def test_xid_event_arrives_once_at_its_time(
    script: tuple[Nvml, SimulatedNvml, FakeClock],
) -> None:
    nvml, sim, clock = script
    watcher = nvml.watch_events([0, 1, 2])
    assert watcher.wait(1000) == []  # timeout: nothing due within 1 s
    assert clock.now == pytest.approx(1001.0)
    assert watcher.wait(5000) == [GpuEvent(1, xid=79)]
    assert clock.now == pytest.approx(1002.5)
    assert watcher.wait(0) == []
    watcher.close()
    assert sim.calls["nvmlEventSetFree"] == 1
    assert sim.calls["nvmlDeviceRegisterEvents"] == 3


@pytest.mark.parametrize(
    "script",
    ["  - {after_s: 0, gpu: 0, xid: 48}\n  - {after_s: 0, gpu: 2, xid: 63}"],
    indirect=True,
)
def test_queued_events_are_drained_together(
    script: tuple[Nvml, SimulatedNvml, FakeClock],
) -> None:
    nvml, _, _ = script
    watcher = nvml.watch_events([0, 1, 2])
    assert watcher.wait(100) == [GpuEvent(0, xid=48), GpuEvent(2, xid=63)]


@pytest.mark.parametrize(
    "script",
    [
        "  - {after_s: 1, gpu: 2, lost: true}\n"
        "  - {after_s: 5, gpu: 2, recover: true}\n"
        "  - {after_s: 6, gpu: 2, xid: 79}"
    ],
    indirect=True,
)
def test_lost_gpu_is_probed_and_reported_then_recovers(
    script: tuple[Nvml, SimulatedNvml, FakeClock],
) -> None:
    nvml, sim, clock = script
    watcher = nvml.watch_events([0, 1, 2])
    assert nvml.probe(2)
    assert watcher.wait(3000) == [GpuEvent(2, lost=True)]
    assert clock.now == pytest.approx(1001.0)
    assert not nvml.probe(2) and nvml.probe(0)
    assert watcher.wait(1000) == []  # GpuIsLost is raised once only
    clock.now = 1005.0
    assert nvml.probe(2)
    assert watcher.wait(2000) == [GpuEvent(2, xid=79)]
    assert sim.is_lost(2) is False


@pytest.mark.parametrize("script", ["  - {after_s: 1, wait_error: true, for_s: 2}"], indirect=True)
def test_wait_errors_for_a_while(script: tuple[Nvml, SimulatedNvml, FakeClock]) -> None:
    nvml, _, clock = script
    watcher = nvml.watch_events([0, 1, 2])
    assert watcher.wait(500) == []
    clock.now = 1001.5
    with pytest.raises(EventWaitError, match="waiting for NVML events failed"):
        watcher.wait(100)
    clock.now = 1003.0
    assert watcher.wait(100) == []


def test_gpu_without_xid_support_is_skipped() -> None:
    sessions = _session("  - {after_s: 0, gpu: 1, xid: 13}", no_xid_events=frozenset({1}))
    nvml, _, _ = next(sessions)
    watcher = nvml.watch_events([0, 1, 2])
    assert watcher.registered == (0, 2)
    assert watcher.wait(10) == []  # GPU 1's event never reaches an unregistered set
    watcher.close()
    with pytest.raises(EventWaitError, match="closed"):
        watcher.wait(10)
    list(sessions)


def test_lost_gpu_is_skipped_when_the_event_set_is_created() -> None:
    sessions = _session("  - {after_s: 1, gpu: 0, lost: true}\n  - {after_s: 2, gpu: 1, xid: 31}")
    nvml, _, clock = next(sessions)
    clock.now += 1.5
    watcher = nvml.watch_events([0, 1, 2])
    assert watcher.registered == (1, 2)
    assert watcher.wait(10) == [GpuEvent(0, lost=True)]  # the pending GpuIsLost, probed
    assert watcher.wait(1000) == [GpuEvent(1, xid=31)]
    watcher.close()
    list(sessions)
