"""The run's scratch directory, the leak guard and the ``process`` mark's guard
(tests/conftest.py), in a pytest run of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.waiting import WAIT_S

LEAKY = """
import subprocess, sys, tempfile

import pytest

@pytest.mark.process
def test_leaks(tmp_path):
    assert str(tmp_path).startswith(tempfile.gettempdir() + "/")
    print("RUN", tempfile.gettempdir())
    tempfile.mkdtemp()  # in the run's directory: removed at the end
    print("LEAKED", tempfile.mkdtemp(dir="{outside}", prefix="leak-"))
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])

def test_starts_python_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.process
def test_starts_python_marked():
    subprocess.run(["bash", "-c", "python3 -c pass"], check=True)

def test_starts_another_program_unmarked():
    subprocess.run(["true"], check=True)
"""


@pytest.mark.process
def test_a_leaking_test_fails_the_run_and_the_run_directory_goes() -> None:
    work = Path(tempfile.mkdtemp())
    outside = tempfile.mkdtemp(dir="/tmp", prefix="nvpt-guard-")  # stands for /tmp itself
    try:
        shutil.copy(Path(__file__).with_name("conftest.py"), work / "conftest.py")
        (work / "test_leaky.py").write_text(LEAKY.replace("{outside}", outside))
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(work)],
            capture_output=True,
            text=True,
            timeout=4 * WAIT_S,
            cwd=work,
            env=env,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert "4 passed, 1 error" in done.stdout
        # A test that starts a Python program must say so (make test-fast leaves it out).
        assert "ERROR at teardown of test_starts_python_unmarked" in done.stdout
        assert "-c pass' but is not marked process" in done.stdout
        leaked = done.stdout.split("LEAKED ", 1)[1].split()[0]
        run_dir = done.stdout.split("RUN ", 1)[1].split()[0]
        assert run_dir.startswith("/tmp/nvpt-") and not os.path.exists(run_dir)
        assert "tests left these behind" in done.stdout
        assert f"{leaked} (made by test_leaky.py::test_leaks (call))" in done.stdout
        assert "still running: " in done.stdout and "time.sleep(3)" in done.stdout
    finally:
        shutil.rmtree(outside, ignore_errors=True)


NEEDS_REAL_API = """
def test_uses_it(real_api):
    assert real_api.server.startswith("https://127.0.0.1:")
"""


@pytest.mark.process
def test_the_real_api_tier_is_skipped_and_said_so_without_assets_and_fails_when_required() -> None:
    work = Path(tempfile.mkdtemp())
    shutil.copy(Path(__file__).with_name("conftest.py"), work / "conftest.py")
    (work / "realapi").mkdir()
    (work / "realapi" / "test_needs.py").write_text(NEEDS_REAL_API)
    report = work / "report"
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "NVPLUGIN_REAL_API_REPORT": str(report),
    }
    for name in ("KUBEBUILDER_ASSETS", "NVPLUGIN_REQUIRE_REAL_API"):
        env.pop(name, None)

    def pytest_run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(work)],
            capture_output=True,
            text=True,
            timeout=4 * WAIT_S,
            cwd=work,
            env={**env, **extra},
        )

    # Marked realapi and process wherever it lives: make test-fast leaves it out.
    done = pytest_run("-m", "not realapi")
    assert done.returncode == 5, done.stdout + done.stderr
    done = pytest_run("-m", "not process")
    assert done.returncode == 5, done.stdout + done.stderr

    # No assets: skipped, and the summary and the report say why and how to get them.
    done = pytest_run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout
    assert "real-API tier not run: KUBEBUILDER_ASSETS is not set" in done.stdout
    assert "../shared/k8s/kube-1.36.2-linux-amd64.tar.xz" in done.stdout
    assert "real-API tier not run: KUBEBUILDER_ASSETS is not set" in report.read_text()

    # Required (make test with the assets unpacked; CI): a tier that cannot start fails.
    done = pytest_run(KUBEBUILDER_ASSETS=str(work), NVPLUGIN_REQUIRE_REAL_API="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 error" in done.stdout
    assert f"KUBEBUILDER_ASSETS={work} has no executable etcd, kube-apiserver" in done.stdout
