"""Discovery of the 16-GPU node (DGX-2): in process, and ``nvplugin devices`` as a command.

Targets: discovery <= 50 ms in process; ``nvplugin devices --simulate dgx-2`` <= 0.5 s wall.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

NODE = "dgx-2"


def _discovery_ms(repeats: int) -> list[float]:
    from nvplugin.node.nvml import Nvml
    from nvplugin.nodefile.reader import load_node
    from nvplugin.sim.fakenvml import SimulatedNvml

    spec = load_node(NODE)
    times = []
    with SimulatedNvml(spec) as sim:
        for _ in range(repeats):
            started = time.perf_counter()
            with Nvml(sim.sysfs_root) as nvml:
                nvml.discover(NODE)
            times.append((time.perf_counter() - started) * 1000)
    return times


def _open_node_ms(repeats: int) -> list[float]:
    from nvplugin.nodesession import load_topology

    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        load_topology(NODE)
        times.append((time.perf_counter() - started) * 1000)
    return times


def _command_s(repeats: int) -> list[float]:
    times = []
    command = [sys.executable, "-m", "nvplugin", "devices", "--simulate", NODE]
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return times


def run() -> None:
    discovery = _discovery_ms(50)
    print(
        f"   discovery of {NODE} (16 GPUs) in process: p50 {statistics.median(discovery):.1f} ms, "
        f"max {max(discovery):.1f} ms over {len(discovery)} runs (target <= 50 ms)"
    )
    whole = _open_node_ms(10)
    print(
        f"   open_node({NODE!r}) incl. node file, simulated sysfs and discovery: "
        f"p50 {statistics.median(whole):.1f} ms"
    )
    command = _command_s(7)
    print(
        f"   `nvplugin devices --simulate {NODE}` wall time: median "
        f"{statistics.median(command):.3f} s over {len(command)} runs (target <= 0.5 s)"
    )
