"""One scratch directory per test run, removed at the end, and a guard that fails the run when a
test leaves something outside it.

Tests write sockets, node files, configs, logs and checkpoints; plugins they start write sysfs
trees. Before this, each test chose its own place in /tmp and a run left hundreds of entries
behind. Now ``pytest_configure`` enters a :class:`tests.support.rundir.RunDirectory`,
``/tmp/nvpt-XXXXXXXX``: :func:`tempfile.mkdtemp` and friends, subprocesses (``TMPDIR``) and
pytest's ``tmp_path`` (``--basetemp``) write there. ``pytest_unconfigure`` removes it, whatever
the tests did or did not clean up.

The guard: an audit hook records every temporary file or directory made in this process outside
the run directory (``tempfile.mkdtemp(dir="/tmp")``, say), with the test that made it; at the end
of the session any of them still there fails the run, named. So do child processes still running
(a plugin a test forgot to stop).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import pytest

from tests.support.rundir import RunDirectory

RUN_PREFIX = "nvpt-"


@dataclass
class _Scratch:
    """The run directory, what was there before it, and what was made outside it."""

    run: RunDirectory
    outside: dict[str, str] = field(default_factory=dict)  # path -> test that made it

    def audit(self, event: str, args: tuple[object, ...]) -> None:
        if event not in ("tempfile.mkdtemp", "tempfile.mkstemp") or not args:
            return
        path = os.path.abspath(str(args[0]))
        if not path.startswith(self.run.root + os.sep):
            test = os.environ.get("PYTEST_CURRENT_TEST", "outside any test")
            self.outside.setdefault(path, test)


_STASH = pytest.StashKey[_Scratch]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    scratch = _Scratch(RunDirectory.enter(RUN_PREFIX))
    config.stash[_STASH] = scratch
    if config.option.basetemp is None:
        config.option.basetemp = os.path.join(scratch.run.root, "pytest")
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
    scratch.run.leave()


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
