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

The real-API tier (``realapi``: tests/realapi/ and every test using ``real_api`` or
``real_scheduler``, all also ``process``): etcd, kube-apiserver and kube-scheduler from
``$KUBEBUILDER_ASSETS`` (tests/support/realapi.py), started at most once per session and only when
a selected test asks for it. Without the assets those tests are skipped and the summary says the
tier was not run and how to get it; with ``NVPLUGIN_REQUIRE_REAL_API=1`` (``make test`` sets it
when it has the assets) they fail instead. ``NVPLUGIN_REAL_API_REPORT`` names a file the
session writes the tier's outcome to (.ci/run checks it).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.rundir import RunDirectory

if TYPE_CHECKING:
    from tests.support.realapi import RealAPI, RealScheduler

RUN_PREFIX = "nvpt-"

MARKERS = {
    "process": "starts nvplugin or another Python program as a child process (not in make "
    "test-fast)",
    "slow": "a long in-process check, e.g. against a reference search (not in make test-fast)",
    "realapi": "runs against a real kube-apiserver (and kube-scheduler) from KUBEBUILDER_ASSETS "
    "(not in make test-fast)",
}
PROCESS_DIRECTORIES = ("e2e", "reliability", "realapi")
"""Directories of process-level tests (real ``nvplugin serve``, real signals): all ``process``."""
REAL_API_DIRECTORY = "realapi"
REAL_API_FIXTURES = ("real_api", "real_scheduler")
REQUIRE_REAL_API = "NVPLUGIN_REQUIRE_REAL_API"
REAL_API_REPORT = "NVPLUGIN_REAL_API_REPORT"
HOW_TO_GET_ASSETS = (
    "`make test` unpacks ../shared/k8s/kube-1.36.2-linux-amd64.tar.xz and sets it when that "
    "archive is there; or point KUBEBUILDER_ASSETS at envtest assets holding etcd, "
    "kube-apiserver and kube-scheduler (e.g. `setup-envtest use 1.36.x -p path`)"
)


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
    real_api: _RealApiTier = field(default_factory=lambda: _RealApiTier())

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


@dataclass(eq=False)  # a pytest plugin: hashed by identity
class _RealApiTier:
    """What the real-API tier did this session, for the summary and the report."""

    selected: int = 0
    started_s: float | None = None  # server start, when it started
    not_run: str | None = None  # why not, when it could not
    outcomes: dict[str, int] = field(default_factory=dict)  # "passed"/"failed"/"skipped" -> n
    seconds: float = 0.0  # setup, call and teardown of the tier's tests

    def summary(self) -> str | None:
        if self.started_s is not None:
            counts = ", ".join(f"{n} {what}" for what, n in sorted(self.outcomes.items()))
            return (
                f"real-API tier ran: {counts} in {self.seconds:.1f} s "
                f"(etcd + kube-apiserver up in {self.started_s:.1f} s)"
            )
        if self.not_run is not None:
            return f"real-API tier not run: {self.not_run}"
        return None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "realapi" not in report.keywords:
            return
        self.seconds += report.duration
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes[report.outcome] = self.outcomes.get(report.outcome, 0) + 1


_STASH = pytest.StashKey[_Scratch]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    scratch = _Scratch(RunDirectory.enter(RUN_PREFIX))
    config.stash[_STASH] = scratch
    config.pluginmanager.register(scratch.real_api, "nvplugin-real-api-tier")
    if config.option.basetemp is None:
        config.option.basetemp = os.path.join(scratch.run.root, "pytest")
    sys.addaudithook(scratch.audit)  # hooks cannot be removed: it stays, harmless, after the run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(here).parts if item.path.is_relative_to(here) else ()
        if parts and parts[0] in PROCESS_DIRECTORIES:
            item.add_marker(pytest.mark.process)
        fixtures = getattr(item, "fixturenames", ())
        if (parts and parts[0] == REAL_API_DIRECTORY) or any(
            f in fixtures for f in REAL_API_FIXTURES
        ):
            item.add_marker(pytest.mark.realapi)
            item.add_marker(pytest.mark.process)


def pytest_collection_finish(session: pytest.Session) -> None:
    scratch = session.config.stash.get(_STASH, None)
    if scratch is not None:
        scratch.real_api.selected = sum(
            1 for item in session.items if item.get_closest_marker("realapi") is not None
        )


@pytest.fixture(scope="session")
def real_api(request: pytest.FixtureRequest) -> Iterator[RealAPI]:
    """The session's real kube-apiserver (tests/support/realapi.py), started on first use.
    Skipped without ``$KUBEBUILDER_ASSETS`` -- failed instead under
    ``NVPLUGIN_REQUIRE_REAL_API=1``."""
    from tests.support.realapi import AssetsMissing, RealAPI, assets_dir

    tier = request.config.stash[_STASH].real_api
    try:
        assets_dir()
    except AssetsMissing as exc:
        tier.not_run = f"{exc}. {HOW_TO_GET_ASSETS}"
        if os.environ.get(REQUIRE_REAL_API) == "1":
            pytest.fail(f"{REQUIRE_REAL_API}=1 but the {tier.summary()}", pytrace=False)
        pytest.skip(str(tier.summary()))
    try:
        api = RealAPI.start_from_env()
    except Exception as exc:
        tier.not_run = f"it did not start: {exc}"
        raise
    tier.started_s = api.started_s
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture
def real_scheduler(real_api: RealAPI) -> Iterator[Callable[[str], RealScheduler]]:
    """``real_scheduler(config_yaml)``: kube-scheduler against :func:`real_api` with that
    KubeSchedulerConfiguration, started and healthy; stopped at the end of the test."""
    started: list[RealScheduler] = []

    def start(config_yaml: str) -> RealScheduler:
        scheduler = real_api.scheduler(config_yaml)
        started.append(scheduler)
        return scheduler

    try:
        yield start
    finally:
        for scheduler in started:
            scheduler.stop()


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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    scratch = terminalreporter.config.stash.get(_STASH, None)
    line = scratch.real_api.summary() if scratch is not None else None
    if scratch is not None and line is not None:
        terminalreporter.write_sep("-", "real-API tier")
        terminalreporter.write_line(line, yellow=scratch.real_api.started_s is None)


def _write_real_api_report(tier: _RealApiTier) -> None:
    """The tier's outcome, one line, to ``$NVPLUGIN_REAL_API_REPORT`` when set and the session
    selected any of its tests: ``ran ...`` or ``not run: ...``."""
    where = os.environ.get(REAL_API_REPORT)
    line = tier.summary()
    if not where or not tier.selected or line is None:
        return
    with open(where, "a") as report:
        report.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    scratch = session.config.stash.get(_STASH, None)
    if scratch is None:
        return
    _write_real_api_report(scratch.real_api)
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
