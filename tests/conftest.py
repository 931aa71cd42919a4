"""One scratch directory per test run, removed at the end, and a guard that fails the run when a
test leaves something outside it.

Tests write sockets, node files, configs, logs and checkpoints; plugins they start write sysfs
trees. Before this, each test chose its own place in /tmp and a run left hundreds of entries
behind. Now ``pytest_configure`` makes one short directory, ``/tmp/nvpt-XXXXXXXX`` (unix socket
paths must stay under ~107 bytes), and points everything at it: :func:`tempfile.mkdtemp` and
friends (``tempfile.tempdir``), subprocesses (``TMPDIR``) and pytest's ``tmp_path``
(``--basetemp``). ``pytest_unconfigure`` removes it, whatever the tests did or did not clean up.

The guard: an audit hook records every temporary file or directory made in this process outside
the run directory (``tempfile.mkdtemp(dir="/tmp")``, say), with the test that made it; at the end
of the session any of them still there fails the run, named. So do child processes still running
(a plugin a test forgot to stop). Simulated sysfs trees of killed plugins (in /dev/shm, named by
owner pid) are swept the way every new simulation sweeps them.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

import pytest

from nvplugin.node.sim import remove_stale_sysfs_trees

RUN_PREFIX = "nvpt-"
SHM = "/dev/shm"


@dataclass
class _Scratch:
    """The run directory, what was there before it, and what was made outside it."""

    root: str
    old_tempdir: str | None
    old_env: str | None
    outside: dict[str, str] = field(default_factory=dict)  # path -> test that made it

    def audit(self, event: str, args: tuple[object, ...]) -> None:
        if event not in ("tempfile.mkdtemp", "tempfile.mkstemp") or not args:
            return
        path = os.path.abspath(str(args[0]))
        if not path.startswith(self.root + os.sep):
            test = os.environ.get("PYTEST_CURRENT_TEST", "outside any test")
            self.outside.setdefault(path, test)


_STASH = pytest.StashKey[_Scratch]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    root = tempfile.mkdtemp(prefix=RUN_PREFIX, dir="/tmp")
    scratch = _Scratch(root, tempfile.tempdir, os.environ.get("TMPDIR"))
    config.stash[_STASH] = scratch
    tempfile.tempdir = root
    os.environ["TMPDIR"] = root
    if config.option.basetemp is None:
        config.option.basetemp = os.path.join(root, "pytest")
    sys.addaudithook(scratch.audit)  # hooks cannot be removed: it stays, harmless, after the run


def pytest_sessionfinish(session: pytest.Session) -> None:
    scratch = session.config.stash.get(_STASH, None)
    if scratch is None:
        return
    problems = [
        f"{path} (made by {test})"
        for path, test in sorted(scratch.outside.items())
        if os.path.lexists(path)
    ]
    problems += [f"process {pid} still running: {command}" for pid, command in _children()]
    remove_stale_sysfs_trees(SHM)
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_sep("=", "tests left these behind", red=True)
            for problem in problems:
                reporter.write_line(problem, red=True)
            reporter.write_line(
                "make temporary files with tempfile.mkdtemp() / mkstemp() without dir= (they go "
                "to the run's directory, removed at the end), and stop what you start"
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    scratch = config.stash.get(_STASH, None)
    if scratch is None:
        return
    shutil.rmtree(scratch.root, ignore_errors=True)
    tempfile.tempdir = scratch.old_tempdir
    if scratch.old_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = scratch.old_env


def _children() -> list[tuple[int, str]]:
    """Running processes whose parent is this one, with their command lines (zombies, exited
    but not yet reaped, are gone for our purpose)."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                state, ppid = stat.read().rsplit(")", 1)[1].split()[:2]
            if int(ppid) != me or state == "Z":
                continue
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not readable
        found.append((int(name), command[:200]))
    return found
