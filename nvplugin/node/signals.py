"""Health signals beyond Xid events: what NVML's fabric state and error counters say of a GPU,
polled on a fixed schedule and judged here (pure: readings and times in, faults out).

Each signal makes a GPU Unhealthy with its own reason and recovers on its own rule:

- ``fabric`` (``nvmlDeviceGetGpuFabricInfoV``): on NVSwitch systems, a registration that has not
  completed, or whose status is an error; recovers once it has stayed completed for the
  recovery quiet period. A GPU without a fabric (NotSupported) is never judged.
- ``ecc`` (``nvmlDeviceGetTotalEccErrors``, volatile, uncorrected): the count rising by
  ``ecc_threshold`` within the window; recovers when NVML reports the GPU reset (the volatile
  count falls back).
- ``row-remap`` (``nvmlDeviceGetRemappedRows``): a pending remap or a failed one; recovers when
  NVML clears the flag (a pending remap takes effect at a GPU reset).
- ``nvlink`` (``nvmlDeviceGetNvLinkState``, ``nvmlDeviceGetNvLinkErrorCounter``): a link that
  was up at discovery going down (recovers once it has stayed up for the quiet period), or its
  CRC/replay/recovery counters climbing by ``nvlink_threshold`` within the window (recovers once
  the window holds fewer). Only links up at discovery are watched: a PCIe GPU has none.
- ``pcie`` (``nvmlDeviceGetPcieReplayCounter``): the replay counter climbing by
  ``pcie_threshold`` within the window; recovers once the window holds fewer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from nvplugin.node.nvml import Fabric

SIGNALS = ("fabric", "ecc", "row-remap", "nvlink", "pcie")
"""The polled signals, by the name reasons, metrics and settings use."""

MIN_POLL_S = 0.1
"""The shortest poll interval: bounds what polling costs (``make bench`` prints it)."""
MAX_THRESHOLD = 1 << 30
DEFAULT_POLL_S = 5.0
DEFAULT_WINDOW_S = 60.0
DEFAULT_ECC_THRESHOLD = 1
DEFAULT_NVLINK_THRESHOLD = 100
DEFAULT_PCIE_THRESHOLD = 8


@dataclass(frozen=True)
class SignalSettings:
    """Which signals are polled, how often, and their thresholds (``nvplugin.health.*``)."""

    poll_s: float = DEFAULT_POLL_S
    window_s: float = DEFAULT_WINDOW_S
    fabric: bool = True
    ecc: bool = True
    ecc_threshold: int = DEFAULT_ECC_THRESHOLD
    row_remap: bool = True
    nvlink: bool = True
    nvlink_threshold: int = DEFAULT_NVLINK_THRESHOLD
    pcie: bool = True
    pcie_threshold: int = DEFAULT_PCIE_THRESHOLD

    def on(self, signal: str) -> bool:
        """Whether ``signal`` (a name of :data:`SIGNALS`) is polled."""
        return bool(getattr(self, signal.replace("-", "_")))

    @property
    def any(self) -> bool:
        """Whether any signal is polled at all."""
        return self.fabric or self.ecc or self.row_remap or self.nvlink or self.pcie


class SignalNvml(Protocol):
    """The part of :class:`nvplugin.node.nvml.Nvml` the signals read."""

    def nvlinks(self, index: int) -> tuple[int, ...]: ...

    def fabric(self, index: int) -> Fabric | None: ...

    def ecc_uncorrected(self, index: int) -> int | None: ...

    def row_remap(self, index: int) -> tuple[bool, bool] | None: ...

    def nvlink(self, index: int, link: int) -> tuple[bool, int] | None: ...

    def pcie_replays(self, index: int) -> int | None: ...


class _Window:
    """A counter's samples over the last ``window_s``: how much it rose within the window."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, value: int) -> int:
        """Record ``value`` at ``now``; the rise within the window (a counter that fell was
        reset: counting starts again from it)."""
        if self._samples and value < self._samples[-1][1]:
            self._samples.clear()
        self._samples.append((now, value))
        while len(self._samples) > 1 and self._samples[1][0] <= now - self._window_s:
            self._samples.popleft()
        return value - self._samples[0][1]


@dataclass
class _Since:
    """A state signal's fault: its reason while it lasts, and since when it has been clear."""

    reason: str | None = None
    clear_since: float | None = None


@dataclass
class GpuSignals:
    """One GPU's signals: fed each poll's readings, says which signals are at fault and why."""

    index: int
    settings: SignalSettings
    links: tuple[int, ...]
    quiet_s: float = 0.0
    faults: dict[str, str] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)
    _fabric: _Since = field(default_factory=_Since)
    _down: dict[int, _Since] = field(default_factory=dict)
    _ecc: _Window | None = None
    _ecc_tripped_at: int | None = None
    _nvlink: dict[int, _Window] = field(default_factory=dict)
    _nvlink_key: tuple[tuple[int, ...], tuple[str, ...]] = ((), ())
    _pcie: _Window | None = None

    def poll(self, nvml: SignalNvml, now: float) -> dict[str, str]:
        """Read every enabled signal of this GPU and judge it; the faults now (signal ->
        reason). A signal the GPU does not support is not asked again."""
        s = self.settings
        if s.fabric and "fabric" not in self.unsupported:
            self._judge_fabric(nvml.fabric(self.index), now)
        if s.ecc and "ecc" not in self.unsupported:
            self._judge_ecc(nvml.ecc_uncorrected(self.index), now)
        if s.row_remap and "row-remap" not in self.unsupported:
            self._judge_remap(nvml.row_remap(self.index))
        if s.nvlink and self.links:
            self._judge_nvlinks({link: nvml.nvlink(self.index, link) for link in self.links}, now)
        if s.pcie and "pcie" not in self.unsupported:
            self._judge_pcie(nvml.pcie_replays(self.index), now)
        return dict(self.faults)

    def _set(self, signal: str, reason: str | None) -> None:
        if reason is None:
            self.faults.pop(signal, None)
        else:
            self.faults[signal] = reason

    def _state(self, since: _Since, problem: str | None, now: float) -> str | None:
        """A state signal: at fault while ``problem``; clear again once clear for the quiet
        period."""
        if problem is not None:
            since.reason, since.clear_since = problem, None
        elif since.reason is not None:
            if since.clear_since is None:
                since.clear_since = now
            if now - since.clear_since >= self.quiet_s:
                since.reason, since.clear_since = None, None
        return since.reason

    def _judge_fabric(self, fabric: Fabric | None, now: float) -> None:
        if fabric is None:
            self.unsupported.add("fabric")
            self._set("fabric", None)
            return
        self._set("fabric", self._state(self._fabric, fabric.problem, now))

    def _judge_ecc(self, count: int | None, now: float) -> None:
        if count is None:
            self.unsupported.add("ecc")
            return
        if self._ecc is None:
            self._ecc = _Window(self.settings.window_s)
        rise = self._ecc.add(now, count)
        if self._ecc_tripped_at is not None and count < self._ecc_tripped_at:
            self._ecc_tripped_at = None  # the GPU was reset: its volatile count started over
            self._set("ecc", None)
        if self._ecc_tripped_at is None and rise >= self.settings.ecc_threshold:
            self._ecc_tripped_at = count
            self._set("ecc", f"volatile uncorrectable ECC errors rose by {rise} (now {count})")

    def _judge_remap(self, remap: tuple[bool, bool] | None) -> None:
        if remap is None:
            self.unsupported.add("row-remap")
            return
        pending, failed = remap
        reasons = [
            r for r, on in (("row remap failed", failed), ("row remap pending", pending)) if on
        ]
        self._set("row-remap", ", ".join(reasons) or None)

    def _judge_nvlinks(self, readings: Mapping[int, tuple[bool, int] | None], now: float) -> None:
        down, climbing = [], []
        for link, reading in readings.items():
            since = self._down.setdefault(link, _Since())
            up, errors = reading if reading is not None else (False, 0)
            if self._state(since, None if up else "down", now) is not None:
                down.append(link)
            if not up:
                continue
            window = self._nvlink.setdefault(link, _Window(self.settings.window_s))
            rise = window.add(now, errors)
            if rise >= self.settings.nvlink_threshold:
                climbing.append(f"{link} (+{rise})")
        # The reason is said as first seen while the same links are at fault: counts that keep
        # climbing are no new reason to log.
        key = (tuple(down), tuple(c.split(" ")[0] for c in climbing))
        if key == self._nvlink_key:
            return
        self._nvlink_key = key
        reasons = []
        if down:
            reasons.append("nvlink " + ",".join(map(str, down)) + " down")
        if climbing:
            reasons.append("nvlink errors climbing on " + ", ".join(climbing))
        self._set("nvlink", "; ".join(reasons) or None)

    def _judge_pcie(self, replays: int | None, now: float) -> None:
        if replays is None:
            self.unsupported.add("pcie")
            return
        if self._pcie is None:
            self._pcie = _Window(self.settings.window_s)
        rise = self._pcie.add(now, replays)
        if rise < self.settings.pcie_threshold:
            self._set("pcie", None)
        elif "pcie" not in self.faults:  # said as first seen while it lasts
            self._set("pcie", f"PCIe replays rose by {rise} (now {replays})")


def snapshot(nvml: SignalNvml, index: int) -> dict[str, str]:
    """What one read of GPU ``index`` says is wrong with it now (``nvplugin devices``): the
    signals one read can judge -- fabric, row remapping, NVLinks up at discovery that are down
    now -- by name; counters need a window and are left to the monitor."""
    faults: dict[str, str] = {}
    try:
        fabric = nvml.fabric(index)
        if fabric is not None and fabric.problem is not None:
            faults["fabric"] = fabric.problem
        remap = nvml.row_remap(index)
        if remap is not None and any(remap):
            faults["row-remap"] = "row remap failed" if remap[1] else "row remap pending"
        down = []
        for link in nvml.nvlinks(index):
            reading = nvml.nvlink(index, link)
            if reading is None or not reading[0]:
                down.append(link)
        if down:
            faults["nvlink"] = "nvlink " + ",".join(map(str, down)) + " down"
    except Exception as exc:  # a GPU NVML cannot read is worth saying, not a failed command
        faults["nvml"] = str(exc)
    return faults
