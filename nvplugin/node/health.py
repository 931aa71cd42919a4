"""GPU health: NVML events in, a map of GPU index -> healthy out.

The rules, kept here and nowhere else:

- A critical Xid marks that GPU Unhealthy. Xids in :data:`DEFAULT_IGNORED_XIDS` (plus whatever the
  config adds, minus what it forces critical) are application errors, not GPU faults: ignored.
  When the config names the only Xids that count (``only_xids``: NVIDIA's documented
  ``DP_DISABLE_HEALTHCHECKS=all`` with ``DP_ENABLE_HEALTHCHECKS=<Xids>``), every other Xid is
  ignored and the ignore list does not apply.
- A lost GPU (Xid 79 "fallen off the bus", or NVML reporting GPU_IS_LOST for it) is Unhealthy. A
  lost GPU is a fact, not an error class, so the ignore list does not apply to it.
- A failing event wait means NVML itself can no longer be trusted: every GPU is reported Unhealthy
  until the event set can be created and waited on again (capped exponential backoff). Then the
  state from before the failure comes back -- a GPU that was Unhealthy for its own reasons stays
  so -- and each GPU is probed, so one that got lost meanwhile is not reported Healthy.
- Recovery (off unless ``recovery_quiet_s > 0``): an Unhealthy GPU becomes Healthy again when no
  critical Xid (or loss) arrived for it for ``recovery_quiet_s`` and a cheap NVML probe of it
  succeeds. NVIDIA's plugin never recovers a GPU; a node had to be rebooted for one Xid 48.
- Health checks disabled: every GPU is Healthy for good and no event set is created.
- Polled signals (:mod:`nvplugin.node.signals`: fabric state, volatile uncorrectable ECC, row
  remapping, NVLink state and error counters, PCIe replays), every ``signals.poll_s`` on this
  thread: a GPU is Unhealthy while any of them is at fault, each with its own reason and its own
  recovery rule; a lost GPU is not polled.
- Cordon (:meth:`HealthMonitor.set_cordon`, from the Node's annotation): a cordoned GPU is
  Unhealthy until the cordon is lifted, whatever else is true of it; nothing is asked of NVML.
- Every reason a GPU is Unhealthy (``xid``, ``lost``, ``nvml``, a signal's name, ``cordon``) is
  logged once per change and handed to ``on_reasons`` (the metrics' per-GPU, per-signal gauge).
- MIG: events come from the parent GPU (Xid events are registered on it), so the map stays per
  GPU and a MIG device is exactly as healthy as its parent (:func:`mig_health`): an Xid on the
  parent, or its loss, makes every one of its MIG devices Unhealthy, and its recovery brings them
  all back. (NVIDIA's plugin kept one device per parent UUID and so marked at most one MIG
  device: NVIDIA/k8s-device-plugin#1929.)

NVML calls block, so the loop runs on its own thread with short waits (a wait returns as soon as an
event arrives, so a change reaches ``on_change`` within milliseconds; the short timeout bounds how
long :meth:`HealthMonitor.stop` takes). ``on_change`` is called on that thread with the full map;
callers on an event loop hand it over with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from nvplugin.backoff import Backoff, Retry
from nvplugin.node.model import MigDevice
from nvplugin.node.nvml import GpuEvent
from nvplugin.node.signals import SIGNALS, GpuSignals, SignalNvml, SignalSettings

DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
"""Xids caused by applications, not by the GPU (NVIDIA's plugin skips the same ones):
13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
45 preemptive cleanup, 68 video processor exception, 109 context switch timeout."""

XID_GPU_LOST = 79
"""'GPU has fallen off the bus': the GPU is lost, whatever the ignore list says."""

WAIT_TIMEOUT_MS = 100
"""How long one NVML event wait blocks; bounds how long ``stop()`` takes."""

BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 2.0
"""Re-creating the event set after a failed wait: first retry after 0.1 s, doubling up to 2 s."""

_log = structlog.get_logger("nvplugin.health")


@dataclass(frozen=True)
class HealthSettings:
    """What the config says about health (``nvplugin.health``)."""

    enabled: bool = True
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    recovery_quiet_s: float = 0.0
    only_xids: frozenset[int] | None = None
    """When set, only these Xids make a GPU Unhealthy (a lost GPU still is)."""
    signals: SignalSettings | None = None
    """The polled signals (None: none polled)."""

    def counts(self, xid: int) -> bool:
        """Whether Xid ``xid`` makes a GPU Unhealthy (loss aside)."""
        if self.only_xids is not None:
            return xid in self.only_xids
        return xid not in self.ignored_xids


class EventSource(Protocol):
    """The part of :class:`nvplugin.node.nvml.EventWatcher` health needs."""

    def wait(self, timeout_ms: int) -> list[GpuEvent]: ...

    def close(self) -> None: ...


class HealthNvml(SignalNvml, Protocol):
    """The part of :class:`nvplugin.node.nvml.Nvml` health needs (the signals' reads too, when
    any signal is polled)."""

    def watch_events(self, indices: Sequence[int]) -> EventSource: ...

    def probe(self, index: int) -> bool: ...


@dataclass
class _GpuState:
    """One GPU's own health, independent of whether NVML as a whole is trusted."""

    healthy: bool = True
    lost: bool = False  # its last probe failed: it cannot be registered in an event set
    last_fault: float | None = None  # monotonic time of the last critical Xid, loss or failed probe
    next_probe: float = 0.0  # recovery: earliest monotonic time of the next probe
    reason: str = ""  # why it is Unhealthy on its own account (an Xid, lost)


class _NoEvents:
    """The event source when every GPU is lost: nothing to register, so just wait."""

    def __init__(self, stopping: threading.Event) -> None:
        self._stopping = stopping

    def wait(self, timeout_ms: int) -> list[GpuEvent]:
        self._stopping.wait(timeout_ms / 1000)
        return []

    def close(self) -> None:
        pass


class HealthMonitor:
    """Turns NVML events for ``indices`` into health changes, reported to ``on_change``."""

    def __init__(
        self,
        nvml: HealthNvml,
        indices: Sequence[int],
        settings: HealthSettings,
        on_change: Callable[[dict[int, bool]], None],
        *,
        wait_timeout_ms: int = WAIT_TIMEOUT_MS,
        backoff_initial_s: float = BACKOFF_INITIAL_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        clock: Callable[[], float] = time.monotonic,
        on_xid: Callable[[int, int], None] | None = None,
        on_reasons: Callable[[dict[int, dict[str, str]]], None] | None = None,
        cordon: frozenset[int] = frozenset(),
    ) -> None:
        """``on_xid(gpu index, xid)`` is told of every Xid event of our GPUs, ignored ones
        included, on the monitor's thread (the metrics count them); ``on_reasons`` of every
        change of why GPUs are Unhealthy (GPU -> reason kind -> reason), on whichever thread
        made it. ``cordon``: the GPUs cordoned from the start."""
        self._nvml = nvml
        self._indices = tuple(sorted(set(indices)))
        self._settings = settings
        self._on_change = on_change
        self._wait_timeout_ms = wait_timeout_ms
        self._backoff = Backoff(backoff_initial_s, backoff_max_s)
        self._clock = clock
        self._on_xid = on_xid
        self._gpus = {i: _GpuState() for i in self._indices}
        self._nvml_failed = False  # an event wait failed: every GPU reported Unhealthy
        self._watcher: EventSource | None = None  # health thread only
        self._lock = threading.Lock()
        self._on_reasons = on_reasons
        self._cordon = frozenset(cordon)
        self._faults: dict[int, dict[str, str]] = {i: {} for i in self._indices}  # signals
        self._signals: dict[int, GpuSignals] = {}  # health thread only; made at its start
        self._failed_polls: set[int] = set()  # GPUs whose last poll failed (said once)
        self._next_poll = 0.0
        self._published = {i: i not in self._cordon for i in self._indices}
        self._reasons: dict[int, dict[str, str]] = self._reasons_now()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def health(self) -> dict[int, bool]:
        """The current map GPU index -> healthy, in index order (a copy)."""
        with self._lock:
            return dict(self._published)

    @property
    def reasons(self) -> dict[int, dict[str, str]]:
        """Why each Unhealthy GPU is (GPU -> reason kind -> reason), as last published."""
        with self._lock:
            return {i: dict(r) for i, r in self._reasons.items()}

    def set_cordon(self, indices: frozenset[int]) -> None:
        """Cordon exactly ``indices`` (any thread): those GPUs are Unhealthy until lifted."""
        with self._lock:
            self._cordon = frozenset(indices)
        self._publish()

    def start(self) -> None:
        """Start watching (no-op when health checks are disabled or already started)."""
        if not self._settings.enabled or self._thread is not None or not self._indices:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="nvplugin-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; returns once the thread has closed its event set (well within 1 s)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        thread.join(timeout=2.0)

    # --- the loop (health thread) ---

    def _run(self) -> None:
        retry = Retry(self._backoff)
        signals = self._settings.signals
        try:
            if signals is not None and signals.any:
                quiet = self._settings.recovery_quiet_s
                for i in self._indices:
                    links = self._nvml.nvlinks(i) if signals.nvlink else ()
                    self._signals[i] = GpuSignals(i, signals, links, quiet)
                _log.info(
                    "health signals polled",
                    every_s=signals.poll_s,
                    signals=[name for name in SIGNALS if signals.on(name)],
                )
            while not self._stopping.is_set():
                if self._watcher is None:
                    if self._open():
                        retry.reset()
                    elif self._stopping.wait(retry.next()):  # NVML still not answering
                        break
                    continue
                try:
                    events = self._watcher.wait(self._wait_timeout_ms)
                except Exception as exc:  # EventWaitError, or anything NVML threw at us
                    self._fail("nvml event wait failed", exc)
                    continue
                try:
                    for event in events:
                        self._apply(event)
                    self._try_recover()
                    self._poll()
                except Exception as exc:
                    # A bug or an NVML surprise must not end the thread: health would freeze
                    # at its last value. Treat it as an NVML failure (every GPU Unhealthy) and
                    # rebuild the event set with backoff, as after a failed wait.
                    _log.error("health monitor cycle failed", error=repr(exc))
                    self._fail("health monitor cycle failed", exc)
        finally:
            self._close_watcher()

    def _open(self) -> bool:
        """Create an event set for the GPUs that answer a probe; False when NVML failed (again).

        A lost GPU cannot be registered in an event set (NVML refuses), so it is left out until
        it answers a probe again. After a failure NVML counts as answering again only when some
        GPU answers and a wait on the fresh set returns normally; only then are the probes
        trusted (a GPU that failed its probe is lost) and the state from before comes back.
        """
        answers = {i: self._probe(i) for i in self._indices}
        watched = [i for i, ok in answers.items() if ok]
        if self._nvml_failed and not watched:
            return False  # no GPU answers: NVML is still broken, or they are all lost anyway
        try:
            watcher = self._nvml.watch_events(watched) if watched else _NoEvents(self._stopping)
        except Exception as exc:
            self._fail("nvml event set failed", exc)
            return False
        self._watcher = watcher
        events: list[GpuEvent] = []
        if self._nvml_failed:
            try:
                events = watcher.wait(self._wait_timeout_ms)
            except Exception as exc:
                self._fail("nvml event wait failed", exc)
                return False
            self._nvml_failed = False
            _log.info("nvml event wait works again")
        self._apply_probes(answers)
        self._publish()
        for event in events:
            self._apply(event)
        return True

    def _fail(self, what: str, exc: Exception) -> None:
        """NVML failed: every GPU is Unhealthy until an event set works again."""
        self._close_watcher()
        if not self._nvml_failed:
            _log.warning(what, error=str(exc) or type(exc).__name__)
            _log.info("all gpus unhealthy: nvml events cannot be trusted")
            self._nvml_failed = True
            self._publish()

    def _close_watcher(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is None:
            return
        try:
            watcher.close()
        except Exception as exc:
            _log.debug("closing nvml event set failed", error=str(exc))

    def _apply(self, event: GpuEvent) -> None:
        gpu = self._gpus.get(event.index)
        if gpu is None:
            return  # not one of ours (e.g. a GPU this resource does not advertise)
        if event.xid is not None and self._on_xid is not None:
            try:
                self._on_xid(event.index, event.xid)
            except Exception as exc:  # counting must never stop health monitoring
                _log.error("xid callback failed", error=repr(exc))
        lost = event.lost or event.xid == XID_GPU_LOST
        if not lost and (event.xid is None or not self._settings.counts(event.xid)):
            if event.xid is not None:
                _log.debug("ignored xid", gpu=event.index, xid=event.xid)
            return
        reason: dict[str, object] = {"lost": True} if lost else {"xid": event.xid}
        if self._fault(event.index, self._clock(), **reason):
            self._publish()
        if lost:
            # Rebuild the event set without it (the next open probes every GPU): a lost GPU in
            # the set can make every later wait fail at once.
            self._close_watcher()

    def _try_recover(self) -> None:
        quiet = self._settings.recovery_quiet_s
        if quiet <= 0 or self._nvml_failed:
            return
        now = self._clock()
        recovered = []
        for index, gpu in self._gpus.items():
            if gpu.healthy or now < gpu.next_probe:
                continue
            if gpu.last_fault is not None and now - gpu.last_fault < quiet:
                continue
            if self._probe(index):
                recovered.append(index)
                _log.info("gpu recovered", gpu=index, quiet_s=quiet)
            else:
                gpu.next_probe = now + min(quiet, 1.0)
        if not recovered:
            return
        rewatch = False
        for index in recovered:
            gpu = self._gpus[index]
            rewatch = rewatch or gpu.lost
            gpu.healthy, gpu.lost, gpu.last_fault = True, False, None
        self._publish()
        if rewatch:
            self._close_watcher()  # the next open registers the recovered GPU's events again

    def _poll(self) -> None:
        """Poll the signals of every GPU that answers, when due (health thread)."""
        if not self._signals or self._nvml_failed:
            return
        now = self._clock()
        if now < self._next_poll:
            return
        assert self._settings.signals is not None
        self._next_poll = now + self._settings.signals.poll_s
        changed = False
        for index, signals in self._signals.items():
            if self._gpus[index].lost or self._stopping.is_set():
                continue
            try:
                faults = signals.poll(self._nvml, now)
            except Exception as exc:  # the GPU keeps its last verdicts until it answers again
                if index not in self._failed_polls:
                    self._failed_polls.add(index)
                    _log.warning("gpu health signals unreadable", gpu=index, error=str(exc))
                continue
            self._failed_polls.discard(index)
            if faults != self._faults[index]:
                self._faults[index] = faults
                changed = True
        if changed:
            self._publish()

    def _apply_probes(self, answers: dict[int, bool]) -> None:
        """A GPU that failed its probe is lost (and Unhealthy); one that answered is not lost."""
        now = self._clock()
        for index, ok in answers.items():
            self._gpus[index].lost = not ok
            if not ok:
                self._fault(index, now, lost=True, probe="failed")

    def _fault(self, index: int, now: float, **reason: object) -> bool:
        """A fault of GPU ``index`` at ``now``: it is Unhealthy and its quiet period (recovery)
        starts again. True when it was Healthy until now (the caller publishes)."""
        gpu = self._gpus[index]
        gpu.last_fault = now
        gpu.next_probe = now + self._settings.recovery_quiet_s
        if not gpu.healthy:
            return False
        gpu.healthy = False
        gpu.reason = "lost" if reason.get("lost") else f"xid {reason.get('xid')}"
        _log.info("gpu unhealthy", gpu=index, **reason)
        return True

    def _probe(self, index: int) -> bool:
        try:
            return self._nvml.probe(index)
        except Exception:
            return False

    def _reasons_now(self) -> dict[int, dict[str, str]]:
        """GPU -> reason kind -> reason, for every GPU with a reason (under the lock)."""
        out: dict[int, dict[str, str]] = {}
        for index, gpu in self._gpus.items():
            reasons: dict[str, str] = {}
            if self._nvml_failed:
                reasons["nvml"] = "nvml events cannot be trusted"
            if not gpu.healthy:
                kind = "lost" if gpu.lost or gpu.reason == "lost" else "xid"
                reasons[kind] = gpu.reason or kind
            reasons.update(self._faults[index])
            if index in self._cordon:
                reasons["cordon"] = "cordoned by node annotation"
            if reasons:
                out[index] = reasons
        return out

    def _publish(self) -> None:
        """Report the effective map if it differs from the last one reported (any thread: the
        lock orders the reports), and the reasons when they changed (each change logged)."""
        with self._lock:
            reasons = self._reasons_now()
            current = {i: i not in reasons for i in self._indices}
            if reasons != self._reasons:
                _log_changes(self._reasons, reasons)
                self._reasons = reasons
                if self._on_reasons is not None:
                    try:
                        self._on_reasons({i: dict(r) for i, r in reasons.items()})
                    except Exception as exc:  # a bad callback must not end health monitoring
                        _log.error("health reasons callback failed", error=repr(exc))
            if current == self._published:
                return
            self._published = current
            try:
                self._on_change(dict(current))
            except Exception as exc:  # a bad callback must not end health monitoring
                _log.error("health change callback failed", error=repr(exc))


_OWN_LOGS = ("xid", "lost", "nvml")
"""Reason kinds the monitor logs where they happen (with their details)."""


def _log_changes(
    before: Mapping[int, Mapping[str, str]], after: Mapping[int, Mapping[str, str]]
) -> None:
    """Say each signal's and cordon's change once: set (or changed) with its reason, cleared."""
    for index in sorted(set(before) | set(after)):
        old, new = before.get(index, {}), after.get(index, {})
        for kind in sorted(set(old) | set(new)):
            if kind in _OWN_LOGS or old.get(kind) == new.get(kind):
                continue
            if kind in new:
                _log.info("gpu unhealthy", gpu=index, signal=kind, reason=new[kind])
            else:
                _log.info("gpu health signal cleared", gpu=index, signal=kind)


def mig_health(health: Mapping[int, bool], devices: Iterable[MigDevice]) -> dict[str, bool]:
    """MIG device UUID -> healthy, from the per-GPU map: each device takes its parent's health
    (a parent the map does not cover is not watched, hence Healthy)."""
    return {device.uuid: health.get(device.parent, True) for device in devices}
