"""Health beyond Xid: what polling the signals costs, and how soon a fault reaches the kubelet.

Prints:
- polling cost on a simulated DGX-2 (16 GPUs, 6 NVLinks each into NVSwitches) and a DGX H100
  (8 GPUs, 18 NVLinks each) with every signal on: NVML calls and CPU per poll of the whole node,
  and CPU per second at the default interval (5 s) and at 1 s. The simulated NVML's own Python
  work is in the figure (a real NVML call is a few microseconds of C), so it is an upper bound;
- scripted fault -> the kubelet's ListAndWatch says Unhealthy, p50/p99: an in-process daemon on
  the DGX-2 polling every 1 s, a volatile uncorrectable ECC error scripted on GPU k % 16 every
  0.25 s (each GPU reset 2 s later), measured from the moment the simulated NVML makes the error
  due to the message arriving at a ListAndWatch client. The poll interval dominates: a fault
  waits for the next poll (on average half an interval).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from importlib import resources
from pathlib import Path

from bench.unhealthy import unhealthy_latencies

POLLS = 200
FAULTS = 48
START_S, SPACING_S, RESET_AFTER_S = 2.0, 0.25, 2.0


def _poll_cost(name: str) -> None:
    from nvplugin.node.nvml import Nvml
    from nvplugin.node.signals import DEFAULT_POLL_S, GpuSignals, SignalSettings
    from nvplugin.nodefile.reader import load_node
    from nvplugin.sim.fakenvml import SimulatedNvml

    with SimulatedNvml(load_node(name)) as sim:
        nvml = Nvml(sim.sysfs_root, sim.driver_root)
        try:
            nvml.scan(name)
            gpus = [g.index for g in sim.spec.gpus]
            settings = SignalSettings()
            signals = [GpuSignals(i, settings, nvml.nvlinks(i)) for i in gpus]
            for s in signals:  # warm up
                s.poll(nvml, 0.0)
            calls = sum(sim.calls.values())
            started_cpu, started = time.process_time(), time.perf_counter()
            for n in range(POLLS):
                for s in signals:
                    s.poll(nvml, 1.0 + n)
            cpu = (time.process_time() - started_cpu) / POLLS
            wall = (time.perf_counter() - started) / POLLS
            per_poll = (sum(sim.calls.values()) - calls) / POLLS
        finally:
            nvml.close()
    links = sum(len(nvml.nvlinks(i)) for i in gpus)
    print(
        f"   poll cost ({name}: {len(gpus)} GPUs, {links} NVLinks, every signal on): "
        f"{per_poll:.0f} NVML calls, {cpu * 1000:.2f} ms CPU ({wall * 1000:.2f} ms wall) per "
        f"poll of the node; CPU per second {cpu / DEFAULT_POLL_S * 100:.3f} % at the default "
        f"{DEFAULT_POLL_S:g} s, {cpu * 100:.2f} % at 1 s   "
        f"(simulated NVML included; load {_load()})",
        flush=True,
    )


def _fault_latencies() -> list[float]:
    directory = tempfile.mkdtemp()
    events = []
    for k in range(FAULTS):
        due = START_S + SPACING_S * k
        events.append(f"- {{after_s: {due:.2f}, gpu: {k % 16}, ecc: 1}}")
        events.append(f"- {{after_s: {due + RESET_AFTER_S:.2f}, gpu: {k % 16}, reset: true}}")
    builtin = (resources.files("nvplugin.nodefile") / "nodes" / "dgx-2.yaml").read_text()
    node_path = os.path.join(directory, "dgx-2-faults.yaml")
    Path(node_path).write_text(builtin.replace("events: []", "events:\n" + "\n".join(events)))
    return unhealthy_latencies(
        node_path,
        "version: v1\nnvplugin:\n  health:\n    poll: {interval: 1s}\n",
        [(START_S + SPACING_S * k, k % 16) for k in range(FAULTS)],
        START_S + SPACING_S * FAULTS + RESET_AFTER_S + 1.5,
    )


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def run() -> None:
    _poll_cost("dgx-2")
    _poll_cost("dgx-h100")
    latencies = sorted(_fault_latencies())
    if not latencies:
        print("   fault -> kubelet: no fault reached the kubelet", flush=True)
        return
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    print(
        f"   fault -> kubelet sees Unhealthy (dgx-2, poll every 1 s, {len(latencies)} of "
        f"{FAULTS} faults seen): p50 {statistics.median(latencies):.0f} ms, p99 {p99:.0f} ms, "
        f"max {latencies[-1]:.0f} ms   (load {_load()})",
        flush=True,
    )
