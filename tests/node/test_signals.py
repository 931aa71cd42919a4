"""Polled health signals (fabric, ECC, row remap, NVLink, PCIe) and the cordon, end to end
through the simulated NVML: scripted node-file events, real pynvml calls, the real monitor.

The simulated node runs on a simulated clock that moves only when the monitor waits (its NVML
event waits sleep on it): each run is exact in simulated time and quick in real time. Simulated
time runs on while a test looks, so a passing state is read from what was recorded when it
happened (``Run.reasons``, the changes' queue), never from the monitor afterwards."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from nvplugin.errors import InputError
from nvplugin.node.health import HealthMonitor, HealthSettings
from nvplugin.node.nvml import Nvml
from nvplugin.node.signals import SignalSettings
from nvplugin.nodefile.reader import load_node
from nvplugin.sim.fakenvml import SimulatedNvml
from tests.support.serve import run_nvplugin
from tests.support.waiting import WAIT_S, until_sync

SIGNALS_NODE = """
version: v1
name: signals
gpus:
  - {name: H100 SXM, nvswitch_links: 4, numa_node: 0}
  - {name: H100 SXM, nvswitch_links: 4, numa_node: 0}
  - {name: A100 PCIe, numa_node: 0}
links: |2
        GPU0   GPU1   GPU2
  GPU0  X      NV4    PIX
  GPU1  NV4    X      PIX
  GPU2  PIX    PIX    X
events: {events}
"""

PCIE_NODE = """
version: v1
name: pcie-only
gpus: [{name: A100 PCIe}, {name: A100 PCIe}]
links: |2
        GPU0  GPU1
  GPU0  X     PIX
  GPU1  PIX   X
events: {events}
"""

POLL = SignalSettings(poll_s=0.1, window_s=1.0, nvlink_threshold=100, pcie_threshold=8)


class SimClock:
    """Simulated time: moves only by ``sleep`` (the simulated NVML's waits)."""

    def __init__(self) -> None:
        self._now = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@dataclass
class Run:
    sim: SimulatedNvml
    clock: SimClock
    monitor: HealthMonitor
    changes: queue.Queue[tuple[float, dict[int, bool]]]
    reasons: list[dict[int, dict[str, str]]]

    def next(self) -> tuple[float, dict[int, bool]]:
        return self.changes.get(timeout=WAIT_S)

    def polls(self) -> int:
        """Signal reads so far (ECC and PCIe: one of them is on in every test)."""
        calls = self.sim.calls
        return calls["nvmlDeviceGetPcieReplayCounter"] + calls["nvmlDeviceGetTotalEccErrors"]


@contextmanager
def running(
    tmp_path: Path,
    events: list[dict[str, object]],
    signals: SignalSettings = POLL,
    *,
    node: str = SIGNALS_NODE,
    quiet_s: float = 0.0,
    dead_nvlinks: int = 0,
) -> Iterator[Run]:
    path = tmp_path / "node.yaml"
    path.write_text(node.replace("{events}", json.dumps(events)))
    clock = SimClock()
    sim = SimulatedNvml(
        load_node(str(path)), clock=clock, sleep=clock.sleep, dead_nvlinks=dead_nvlinks
    )
    with sim:
        nvml = Nvml(sim.sysfs_root, sim.driver_root)
        try:
            nvml.scan("signals")
            changes: queue.Queue[tuple[float, dict[int, bool]]] = queue.Queue()
            reasons: list[dict[int, dict[str, str]]] = []
            monitor = HealthMonitor(
                nvml,
                range(len(sim.spec.gpus)),
                HealthSettings(recovery_quiet_s=quiet_s, signals=signals),
                lambda health: changes.put((clock(), health)),
                clock=clock,
                on_reasons=reasons.append,
            )
            run = Run(sim, clock, monitor, changes, reasons)
            monitor.start()
            try:
                yield run
            finally:
                monitor.stop()
        finally:
            nvml.close()


def healthy(n: int, *bad: int) -> dict[int, bool]:
    return {i: i not in bad for i in range(n)}


# --- fabric ---------------------------------------------------------------------------------


def test_fabric_in_progress_is_unhealthy_until_completed_and_quiet(tmp_path: Path) -> None:
    events = [
        {"after_s": 0, "gpu": 1, "fabric": "in-progress"},
        {"after_s": 2.0, "gpu": 1, "fabric": "completed"},
    ]
    with running(tmp_path, events, quiet_s=0.5) as run:
        at, health = run.next()
        assert health == healthy(3, 1)
        assert run.reasons[0] == {1: {"fabric": "fabric in-progress"}}
        at, health = run.next()
        assert health == healthy(3)
        assert at >= 2.5  # completed at 2.0, then the quiet period
        assert run.monitor.reasons == {}


def test_fabric_status_error_names_the_status(tmp_path: Path) -> None:
    events = [{"after_s": 0.5, "gpu": 0, "fabric": {"state": "completed", "status": "unknown"}}]
    with running(tmp_path, events) as run:
        assert run.next()[1] == healthy(3, 0)
        assert run.monitor.reasons[0]["fabric"] == "fabric completed, status NVML_ERROR_UNKNOWN"


def test_fabric_event_on_a_gpu_outside_the_fabric_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(SIGNALS_NODE.replace("{events}", "[{after_s: 1, gpu: 2, fabric: in-progress}]"))
    with pytest.raises(InputError, match=r"events\[0\]\.fabric.*GPU 2 is not in an NVSwitch"):
        load_node(str(path))


def test_nvlink_event_on_a_link_the_gpu_lacks_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        SIGNALS_NODE.replace("{events}", "[{after_s: 1, gpu: 2, nvlink: {link: 0, state: down}}]")
    )
    with pytest.raises(InputError, match=r"events\[0\]\.nvlink\.link.*GPU 2 has 0 NVLink"):
        load_node(str(path))


# --- counters ---------------------------------------------------------------------------------

TRIPS = {
    "ecc": (
        [{"after_s": 0.5, "gpu": 2, "ecc": 2}, {"after_s": 3.0, "gpu": 2, "reset": True}],
        2,
        "volatile uncorrectable ECC errors rose by 2 (now 2)",
        3.0,
    ),
    "row-remap": (
        [{"after_s": 0.5, "gpu": 0, "remap": "pending"}, {"after_s": 3.0, "gpu": 0, "reset": True}],
        0,
        "row remap pending",
        3.0,
    ),
    "pcie": (
        [{"after_s": 0.5, "gpu": 2, "pcie_replays": 8}],
        2,
        "PCIe replays rose by 8 (now 8)",
        1.5,  # the window (1 s) passed without new replays
    ),
    "nvlink": (
        [{"after_s": 0.5, "gpu": 1, "nvlink": {"link": 3, "errors": 150}}],
        1,
        "nvlink errors climbing on 3 (+150)",
        1.5,
    ),
}


@pytest.mark.parametrize("signal", sorted(TRIPS))
def test_counter_signal_trips_and_recovers(tmp_path: Path, signal: str) -> None:
    events, gpu, reason, recovered_after = TRIPS[signal]
    with running(tmp_path, events) as run:
        at, health = run.next()
        assert health == healthy(3, gpu)
        assert at >= 0.5
        assert run.reasons[0] == {gpu: {signal: reason}}
        at, health = run.next()
        assert health == healthy(3)
        assert at >= recovered_after
        assert run.reasons[-1] == {}


def test_remap_failure_lasts_until_nvml_clears_it(tmp_path: Path) -> None:
    events = [{"after_s": 0.5, "gpu": 2, "remap": "failed"}]
    with running(tmp_path, events) as run:
        assert run.next()[1] == healthy(3, 2)
        assert run.monitor.reasons[2] == {"row-remap": "row remap failed"}
        target = run.polls() + 30  # 3 s of polls later: still failed
        until_sync(lambda: run.polls() >= target)
        assert run.changes.empty()


def test_ecc_below_the_threshold_does_not_trip(tmp_path: Path) -> None:
    events = [{"after_s": 0.5, "gpu": 0, "ecc": 1}]
    with running(tmp_path, events, replace(POLL, ecc_threshold=2)) as run:
        until_sync(lambda: run.clock() > 2.0 and run.polls() > 60)
        assert run.changes.empty()


def test_nvlink_down_then_up_after_the_quiet_period(tmp_path: Path) -> None:
    events = [
        {"after_s": 0.5, "gpu": 0, "nvlink": {"link": 1, "state": "down"}},
        {"after_s": 1.0, "gpu": 0, "nvlink": {"link": 1, "state": "up"}},
    ]
    with running(tmp_path, events, quiet_s=1.0) as run:
        assert run.next()[1] == healthy(3, 0)
        assert run.reasons[0] == {0: {"nvlink": "nvlink 1 down"}}
        at, health = run.next()
        assert health == healthy(3)
        assert at >= 2.0


@pytest.mark.parametrize("signal", sorted(TRIPS))
def test_a_signal_turned_off_is_silent(tmp_path: Path, signal: str) -> None:
    events = TRIPS[signal][0]
    off = {"row-remap": "row_remap"}.get(signal, signal)
    with running(tmp_path, events, replace(POLL, **{off: False})) as run:
        until_sync(lambda: run.clock() > 2.0 and run.polls() > 20)
        assert run.changes.empty()
        assert run.reasons == []


def test_fabric_turned_off_is_silent(tmp_path: Path) -> None:
    events = [{"after_s": 0, "gpu": 0, "fabric": "not-started"}]
    with running(tmp_path, events, replace(POLL, fabric=False)) as run:
        until_sync(lambda: run.clock() > 1.0 and run.polls() > 10)
        assert run.changes.empty()
        assert run.sim.calls["nvmlDeviceGetGpuFabricInfoV"] == 0


# --- no false alarms ----------------------------------------------------------------------------


def test_pcie_only_node_never_reports_nvlink_or_fabric(tmp_path: Path) -> None:
    # Its GPUs answer 12 NVLinks DISABLED, with error counters that climb at every read, as
    # NVLink-capable PCIe cards without a bridge may: none was up at discovery, none is watched.
    with running(tmp_path, [], node=PCIE_NODE, dead_nvlinks=12) as run:
        until_sync(lambda: run.clock() > 3.0 and run.polls() > 60)
        assert run.changes.empty()
        assert run.reasons == []
        assert run.sim.calls["nvmlDeviceGetNvLinkErrorCounter"] == 0
        # The fabric was asked once per GPU: NotSupported, never judged, not asked again.
        assert run.sim.calls["nvmlDeviceGetGpuFabricInfoV"] == 2


# --- cordon -------------------------------------------------------------------------------------


def test_cordon_withdraws_and_restores_exactly_the_named_gpus(tmp_path: Path) -> None:
    events = [{"after_s": 0.5, "gpu": 2, "ecc": 3}]
    with running(tmp_path, events) as run:
        assert run.next()[1] == healthy(3, 2)
        run.monitor.set_cordon(frozenset({0, 2}))
        assert run.next()[1] == healthy(3, 0, 2)
        assert run.monitor.reasons[0] == {"cordon": "cordoned by node annotation"}
        assert set(run.monitor.reasons[2]) == {"ecc", "cordon"}
        run.monitor.set_cordon(frozenset())
        assert run.next()[1] == healthy(3, 2)  # its own fault stays
        assert run.monitor.reasons == {
            2: {"ecc": "volatile uncorrectable ECC errors rose by 3 (now 3)"}
        }


def test_cordon_applies_with_health_checks_off(tmp_path: Path) -> None:
    seen: list[dict[int, bool]] = []
    monitor = HealthMonitor(
        Nvml.__new__(Nvml), range(2), HealthSettings(enabled=False), seen.append
    )
    monitor.start()
    monitor.set_cordon(frozenset({1}))
    assert seen == [healthy(2, 1)]
    assert monitor.health == healthy(2, 1)


# --- nvplugin devices ---------------------------------------------------------------------------


@pytest.mark.process
def test_devices_says_what_one_read_finds(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    events = [
        {"after_s": 0, "gpu": 1, "fabric": "in-progress"},
        {"after_s": 0, "gpu": 2, "remap": "failed"},
    ]
    path.write_text(SIGNALS_NODE.replace("{events}", json.dumps(events)))
    table = run_nvplugin("devices", "--simulate", str(path), timeout=WAIT_S)
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()
    assert rows[0].split()[-1] == "HEALTH"
    assert rows[1].endswith(" ok")
    assert rows[2].endswith(" fabric in-progress")
    assert rows[3].endswith(" row remap failed")
    data = run_nvplugin("devices", "--simulate", str(path), "--output", "json", timeout=WAIT_S)
    gpus = json.loads(data.stdout)["gpus"]
    assert [g.get("health") for g in gpus] == [
        None,
        {"fabric": "fabric in-progress"},
        {"row-remap": "row remap failed"},
    ]


def test_counters_that_keep_climbing_are_said_once(tmp_path: Path) -> None:
    events = [
        {"after_s": 0.5 + 0.2 * k, "gpu": 1, "nvlink": {"link": 3, "errors": 150}} for k in range(4)
    ] + [{"after_s": 0.5 + 0.2 * k, "gpu": 2, "pcie_replays": 10} for k in range(4)]
    with running(tmp_path, events) as run:
        assert run.next()[1] in (healthy(3, 1), healthy(3, 2), healthy(3, 1, 2))
        until_sync(lambda: run.monitor.reasons == {})
        nvlink = [r[1]["nvlink"] for r in run.reasons if 1 in r]
        pcie = [r[2]["pcie"] for r in run.reasons if 2 in r]
        assert len(set(nvlink)) == 1 and nvlink[0] == "nvlink errors climbing on 3 (+150)"
        assert len(set(pcie)) == 1 and pcie[0] == "PCIe replays rose by 10 (now 10)"
