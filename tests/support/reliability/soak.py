"""``make soak``: every reliability scenario at full scale, then the table.

    python -m tests.support.reliability.soak              # all scenarios, full scale
    python -m tests.support.reliability.soak load fuzz    # some of them
    python -m tests.support.reliability.soak --test-scale # the make-test scale (a quick look)

Prints one Markdown table (scenario, iterations, failures, p50/p99/max, RSS start/end of the
plugin process) and every failure; exits 1 if any scenario failed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

from nvplugin.log import configure
from tests.support.harness import Outcome, format_table
from tests.support.reliability import floods, fuzzing, scenarios
from tests.support.rundir import run_directory

RUNS: dict[str, Callable[[scenarios.Scale], Outcome]] = {
    "fuzz": lambda scale: fuzzing.fuzz(scale.fuzz_examples),
    "kubelet-restarts": lambda scale: asyncio.run(scenarios.kubelet_restarts(scale)),
    "plugin-kills": lambda scale: asyncio.run(scenarios.plugin_kills(scale)),
    "kubelet-down": lambda scale: asyncio.run(scenarios.kubelet_down(scale)),
    "gpu-lost": lambda scale: asyncio.run(scenarios.gpu_lost_during_watch(scale)),
    "event-wait": lambda scale: asyncio.run(scenarios.event_wait_failures(scale)),
    "sighup": lambda scale: asyncio.run(scenarios.sighup_during_traffic(scale)),
    "load": lambda scale: asyncio.run(scenarios.load(scale)),
    "health-storm": lambda scale: asyncio.run(scenarios.health_storm(scale)),
    "idle-connections": lambda scale: asyncio.run(scenarios.idle_connections(scale)),
    "preferred-flood": lambda scale: asyncio.run(floods.preferred_flood(scale)),
    "allocate-flood": lambda scale: asyncio.run(floods.allocate_flood(scale)),
    "mig-kubelet-restarts": lambda scale: asyncio.run(floods.mig_kubelet_restarts(scale)),
}


def main(argv: list[str]) -> int:
    configure("console", "warning", stream=sys.stderr)  # the fake kubelet's lines: errors only
    scale = scenarios.SOAK
    if "--test-scale" in argv:
        scale = scenarios.TEST
        argv = [a for a in argv if a != "--test-scale"]
    wanted = argv or list(RUNS)
    unknown = [name for name in wanted if name not in RUNS]
    if unknown:
        print(f"unknown scenario(s) {', '.join(unknown)}; have: {', '.join(RUNS)}")
        return 2
    outcomes = []
    started = time.monotonic()
    with run_directory("nvps-"):  # everything the scenarios write, removed at the end
        for name in wanted:
            print(f"== {name}", file=sys.stderr, flush=True)
            begun = time.monotonic()
            outcome = RUNS[name](scale)
            print(
                f"   {outcome.iterations} iterations, {len(outcome.failures)} failures "
                f"({time.monotonic() - begun:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
            outcomes.append(outcome)
    print(format_table(outcomes))
    print(f"\n({time.monotonic() - started:.0f} s in all)")
    for outcome in outcomes:
        for note in outcome.notes:
            print(f"note: {outcome.scenario}: {note}")
        for failure in outcome.failures[:20]:
            print(f"FAILED: {outcome.scenario}: {failure[:1000]}")
    return 1 if any(o.failures for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
