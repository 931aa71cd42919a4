"""One directory for everything a run writes -- a pytest session, ``make bench``, ``make soak``
-- removed at the end however the run ends.

:meth:`RunDirectory.enter` makes a short directory (``/tmp/<prefix>XXXXXXXX``: unix socket paths
must stay under ~107 bytes) and points :mod:`tempfile` (``tempfile.tempdir``) and child processes
(``TMPDIR``) at it; :meth:`RunDirectory.leave` removes it, puts both back and sweeps the simulated
sysfs trees of plugins that were killed (in /dev/shm, named by owner pid). Code that runs inside
makes its files with ``tempfile.mkdtemp()`` / ``mkstemp()`` without ``dir=``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

SHM = "/dev/shm"


@dataclass
class RunDirectory:
    root: str
    old_tempdir: str | None
    old_env: str | None

    @classmethod
    def enter(cls, prefix: str) -> RunDirectory:
        root = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        run = cls(root, tempfile.tempdir, os.environ.get("TMPDIR"))
        tempfile.tempdir = root
        os.environ["TMPDIR"] = root
        return run

    def leave(self) -> None:
        from nvplugin.sim.tree import remove_stale_sysfs_trees  # late: benchmarks time imports

        shutil.rmtree(self.root, ignore_errors=True)
        tempfile.tempdir = self.old_tempdir
        if self.old_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = self.old_env
        remove_stale_sysfs_trees(SHM)


@contextlib.contextmanager
def run_directory(prefix: str) -> Iterator[str]:
    """:meth:`RunDirectory.enter` for the block; its path."""
    run = RunDirectory.enter(prefix)
    try:
        yield run.root
    finally:
        run.leave()
