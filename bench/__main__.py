"""Run every ``bench/bench_*.py`` module's ``run()`` in name order, or those named on the
command line (``python -m bench allocator discovery``).

Everything a benchmark writes (sockets, node files, kubelet checkpoints, logs) goes to one run
directory, ``/tmp/nvpb-XXXXXXXX`` (:mod:`tests.support.rundir`), removed at the end however the
run ends: benchmarks make their files with ``tempfile.mkdtemp()`` / ``mkstemp()`` without
``dir=``."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import bench
from tests.support.rundir import run_directory


def main(argv: list[str]) -> int:
    names = sorted(
        m.name.removeprefix("bench_")
        for m in pkgutil.iter_modules(bench.__path__)
        if m.name.startswith("bench_")
    )
    wanted = argv or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; have: {', '.join(names)}")
        return 2
    with run_directory("nvpb-"):
        for name in wanted:
            print(f"== {name}", flush=True)
            started = time.perf_counter()
            importlib.import_module(f"bench.bench_{name}").run()
            print(f"   ({time.perf_counter() - started:.1f} s)\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
