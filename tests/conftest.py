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
(a plugin a test forgot to stop), and MPS control daemons on a pipe directory in the run directory
(they daemonize away from the plugin that started them, so they are nobody's child here).

The tiers: ``make test`` runs every test, ``make test-fast`` leaves out those marked ``process``
(they start ``nvplugin`` or another Python program as a child process: ``serve`` beside the fake
kubelet, the CLI, ``admit``) and ``slow`` (long in-process checks: reference searches, many
generated examples). Every test under ``tests/e2e/`` and ``tests/reliability/`` is marked
``process`` here; elsewhere a test says so itself. The same audit hook keeps the marks honest: a
test that starts such a child without the ``process`` mark fails, naming what it started.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.rundir import RunDirectory

RUN_PREFIX = "nvpt-"

MARKERS = {
    "process": "starts nvplugin or another Python program as a child process (not in make "
    "test-fast)",
    "slow": "a long in-process check, e.g. against a reference search (not in make test-fast)",
}
PROCESS_DIRECTORIES = ("e2e", "reliability")
"""Directories of process-level tests (real ``nvplugin serve``, real signals): all ``process``."""


SHELLS = ("sh", "bash")
MPS_CONTROL = "nvidia-cuda-mps-control"
"""The simulated MPS control program (nvplugin/sim/fakempscontrol.py) is a Python program too."""


def starts_a_program(executable: object, argv: object) -> bool:
    """Whether a child process is what the ``process`` mark is about: a Python interpreter
    (``nvplugin`` commands, pytest, pip) or ``nvplugin``, directly or as a shell's command."""
    command = [str(a) for a in argv] if isinstance(argv, (list, tuple)) else str(argv).split()
    program = str(executable) if executable else (command[0] if command else "")
    if os.path.basename(program) in SHELLS and "-c" in command[:-1]:
        script = command[command.index("-c") + 1].split()
        program = script[0] if script else ""
    name = os.path.basename(program)
    return (
        name.startswith("python")
        or name in ("nvplugin", "nvidia-device-plugin", MPS_CONTROL)
        or program == sys.executable
    )


@dataclass
class _Scratch:
    """The run directory, what was there before it, what was made outside it, and the
    programs each test started."""

    run: RunDirectory
    outside: dict[str, str] = field(default_factory=dict)  # path -> test that made it
    started: dict[str, list[str]] = field(default_factory=dict)  # test id -> commands

    def audit(self, event: str, args: tuple[object, ...]) -> None:
        if event == "subprocess.Popen" and len(args) >= 2:
            if starts_a_program(args[0], args[1]):
                test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
                command = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
                self.started.setdefault(test, []).append(" ".join(map(str, command))[:200])
            return
        if event not in ("tempfile.mkdtemp", "tempfile.mkstemp") or not args:
            return
        path = os.path.abspath(str(args[0]))
        if not path.startswith(self.run.root + os.sep):
            test = os.environ.get("PYTEST_CURRENT_TEST", "outside any test")
            self.outside.setdefault(path, test)


_STASH = pytest.StashKey[_Scratch]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    scratch = _Scratch(RunDirectory.enter(RUN_PREFIX))
    config.stash[_STASH] = scratch
    if config.option.basetemp is None:
        config.option.basetemp = os.path.join(scratch.run.root, "pytest")
    sys.addaudithook(scratch.audit)  # hooks cannot be removed: it stays, harmless, after the run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(here).parts if item.path.is_relative_to(here) else ()
        if parts and parts[0] in PROCESS_DIRECTORIES:
            item.add_marker(pytest.mark.process)


@pytest.fixture(autouse=True)
def _starts_programs_only_when_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test that started a program (:func:`starts_a_program`) without the ``process``
    mark, which would put a slow test into ``make test-fast``."""
    yield
    scratch = request.config.stash.get(_STASH, None)
    started = scratch.started.get(request.node.nodeid) if scratch is not None else None
    if started and request.node.get_closest_marker("process") is None:
        pytest.fail(
            f"starts {started[0]!r} but is not marked process: add @pytest.mark.process (or "
            "pytestmark = pytest.mark.process for a module) so that make test-fast leaves it out",
            pytrace=False,
        )


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
    problems += [
        f"MPS control daemon {pid} still running: {command}"
        for pid, command in _mps_daemons(scratch.run.root)
    ]
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


def _mps_daemons(root: str) -> list[tuple[int, str]]:
    """Running MPS control daemons (the simulated ones) whose pipe directory is under ``root``."""
    from nvplugin.plugin.mps import control_daemons  # late: only at the end of the run

    return [
        (pid, f"{MPS_CONTROL} -d (CUDA_MPS_PIPE_DIRECTORY={pipe})")
        for pid, pipe in control_daemons()
        if pipe.startswith(root + os.sep)
    ]


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
