"""The simulated node's MPS side: compute modes in the simulated NVML, and the stand-in
``nvidia-cuda-mps-control`` in the simulated driver root, run as the real program is run (daemon
mode, the client reading commands on its standard input, control.log, quit)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from nvplugin.errors import NvpluginError
from nvplugin.node import nvml as nvml_module
from nvplugin.node.nvml import Nvml
from nvplugin.nodefile.reader import load_node
from nvplugin.nodefile.spec import EventSpec
from nvplugin.nodesession import open_node
from nvplugin.sim.fakempscontrol import PROGRAM
from nvplugin.sim.fakenvml import SimulatedNvml

pynvml = nvml_module.bindings()


def test_compute_modes_start_default_and_can_be_set() -> None:
    with open_node("dgx-1") as node:
        assert node.nvml.compute_mode(3) == "DEFAULT"
        node.nvml.set_compute_mode(3, "EXCLUSIVE_PROCESS")
        assert node.nvml.compute_mode(3) == "EXCLUSIVE_PROCESS"
        assert node.nvml.compute_mode(2) == "DEFAULT"
        assert node.sim is not None
        assert node.sim.compute_modes[3] == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
        node.nvml.set_compute_mode(3, "DEFAULT")
        assert node.sim.compute_modes == [pynvml.NVML_COMPUTEMODE_DEFAULT] * 8


def test_a_lost_gpus_compute_mode_cannot_be_read_or_set() -> None:
    spec = load_node("dgx-1")
    spec = replace(spec, events=(EventSpec(after_s=10, gpu=1, lost=True),))
    now = [0.0]
    with SimulatedNvml(spec, clock=lambda: now[0]) as sim, Nvml(sim.sysfs_root) as nvml:
        nvml.scan("dgx-1")
        nvml.set_compute_mode(1, "EXCLUSIVE_PROCESS")
        now[0] = 11.0  # GPU 1 falls off the bus
        with pytest.raises(NvpluginError, match=r"GPU 1.*lost"):
            nvml.set_compute_mode(1, "DEFAULT")
        with pytest.raises(NvpluginError, match="lost"):
            nvml.compute_mode(1)
        assert nvml.compute_mode(0) == "DEFAULT"


def test_the_driver_root_holds_an_executable_mps_control() -> None:
    with open_node("dgx-1") as node:
        assert node.driver_root is not None
        control = Path(node.driver_root, PROGRAM)
        assert control.name == "nvidia-cuda-mps-control"
        assert os.access(control, os.X_OK)
        assert control.read_text().startswith("#!")


# --- the stand-in, as a program ------------------------------------------------------------------


@pytest.fixture
def mps() -> Iterator[tuple[str, dict[str, str]]]:
    """The stand-in's path and an environment with its pipe and log directories (removed after,
    with whatever daemon is left: none should be)."""
    directory = tempfile.mkdtemp()
    with open_node("dgx-1") as node:
        assert node.driver_root is not None
        control = os.path.join(directory, "nvidia-cuda-mps-control")
        shutil.copy(os.path.join(node.driver_root, PROGRAM), control)
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": os.path.join(directory, "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": os.path.join(directory, "log"),
        "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
    }
    try:
        yield control, env
    finally:
        left = Path(env["CUDA_MPS_PIPE_DIRECTORY"], "nvidia-cuda-mps-control.pid")
        if left.exists():  # a test that failed half-way: no daemon may outlive it
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(left.read_text()), signal.SIGKILL)
        shutil.rmtree(directory)


def daemon_pid(env: dict[str, str]) -> int | None:
    """The daemon's pid, from the pid file it writes in its pipe directory."""
    path = Path(env["CUDA_MPS_PIPE_DIRECTORY"], "nvidia-cuda-mps-control.pid")
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # -d returns once the socket listens; the pid file follows at once
    return int(path.read_text()) if path.exists() else None


def run(
    control: str, env: dict[str, str], *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [control, *args], input=stdin, env=env, capture_output=True, text=True, timeout=30
    )


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                return
        time.sleep(0.01)
    assert not os.path.exists(f"/proc/{pid}"), f"{pid} still runs"


@pytest.mark.process
def test_daemon_mode_answers_logs_and_quits(mps: tuple[str, dict[str, str]]) -> None:
    control, env = mps
    pipe, log = env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"]
    started = run(control, env, "-d")
    assert started.returncode == 0, started.stderr
    pid = daemon_pid(env)
    assert pid is not None
    # What an operator sees with ps, and what nvplugin looks for.
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert any(arg.endswith(b"/nvidia-cuda-mps-control") for arg in cmdline)
    assert b"-d" in cmdline
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode() in environ
    # A second daemon on the same pipe directory is refused.
    again = run(control, env, "-d")
    assert again.returncode == 1
    assert "already running" in again.stderr

    commands = (
        "set_default_device_pinned_mem_limit 0 40960M\n"
        "set_default_device_pinned_mem_limit 1 2G\n"
        "set_default_active_thread_percentage 25\n"
        "get_default_active_thread_percentage\n"
        "get_default_device_pinned_mem_limit 1\n"
        "get_server_list\n"
    )
    answered = run(control, env, stdin=commands)
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.splitlines() == ["25.0", "25.0", "2G"]
    bad = run(control, env, stdin="set_default_device_pinned_mem_limit 2 1G\nnonsense\n")
    assert bad.stdout.splitlines() == ["Invalid device 2", "Unrecognized command nonsense"]

    assert run(control, env, stdin="quit\n").returncode == 0
    wait_gone(pid)
    assert not os.path.exists(os.path.join(pipe, "control"))
    assert not os.path.exists(os.path.join(pipe, "nvidia-cuda-mps-control.pid"))
    text = Path(log, "control.log").read_text()
    line = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} Control (\d+)\] (.*)$")
    entries = [line.match(entry) for entry in text.splitlines()]
    assert all(entries), text
    assert {int(m.group(1)) for m in entries if m} == {pid}
    said = [m.group(2) for m in entries if m]
    assert said[0] == f"Starting control daemon using socket {pipe}/control"
    assert [s for s in said if s.startswith("Cmd:")] == [
        "Cmd:get_server_list",  # the second -d asking whether one runs
        *(f"Cmd:{c}" for c in commands.splitlines()),
        "Cmd:set_default_device_pinned_mem_limit 2 1G",
        "Cmd:nonsense",
        "Cmd:quit",
    ]
    assert said[-1] == "Exit"


@pytest.mark.process
def test_the_client_fails_without_a_daemon(mps: tuple[str, dict[str, str]]) -> None:
    control, env = mps
    done = run(control, env, stdin="get_server_list\n")
    assert done.returncode == 1
    assert "Cannot find MPS control daemon" in done.stderr
    assert run(control, env, "-x").returncode == 1


@pytest.mark.process
def test_the_daemon_goes_with_its_pipe_directory(mps: tuple[str, dict[str, str]]) -> None:
    """Beyond the real program: a simulation's tree removed, its daemon cannot linger."""
    control, env = mps
    assert run(control, env, "-d").returncode == 0
    pid = daemon_pid(env)
    assert pid is not None
    shutil.rmtree(env["CUDA_MPS_PIPE_DIRECTORY"])
    wait_gone(pid)


@pytest.mark.process
def test_sigterm_ends_the_daemon_cleanly(mps: tuple[str, dict[str, str]]) -> None:
    control, env = mps
    assert run(control, env, "-d").returncode == 0
    pid = daemon_pid(env)
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    wait_gone(pid)
    assert not os.path.exists(os.path.join(env["CUDA_MPS_PIPE_DIRECTORY"], "control"))


@pytest.mark.process
def test_a_simulated_client_is_served_until_the_daemon_goes(
    mps: tuple[str, dict[str, str]],
) -> None:
    """Beyond the real program: ``--simulated-client`` stands in for a CUDA program, served by
    the daemon (get_server_list, get_client_list) until the daemon ends."""
    control, env = mps
    assert run(control, env, "-d").returncode == 0
    pid = daemon_pid(env)
    assert pid is not None
    assert run(control, env, stdin="get_server_list\n").stdout == ""  # no client: no server
    client = subprocess.Popen(
        [control, "--simulated-client"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert client.stdout is not None
        assert client.stdout.readline() == f"served by {pid}\n"
        listed = run(control, env, stdin=f"get_server_list\nget_client_list {pid}\n")
        assert listed.stdout.splitlines() == [str(pid), str(client.pid)]
        assert client.poll() is None
        assert run(control, env, stdin="quit\n").returncode == 0
        assert client.wait(timeout=30) == 1
        assert client.stdout.read() == "server lost\n"
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    wait_gone(pid)
    said = Path(env["CUDA_MPS_LOG_DIRECTORY"], "control.log").read_text()
    assert f"NEW CLIENT {client.pid} from user {os.getuid()}: Server {pid}" in said


@pytest.mark.process
def test_a_simulated_client_that_goes_is_forgotten(mps: tuple[str, dict[str, str]]) -> None:
    control, env = mps
    assert run(control, env, "-d").returncode == 0
    pid = daemon_pid(env)
    assert pid is not None
    client = subprocess.Popen(
        [control, "--simulated-client"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert client.stdout is not None
    assert client.stdout.readline().startswith("served by")
    client.terminate()
    assert client.wait(timeout=30) == 0
    client.stdout.close()
    deadline = time.monotonic() + 30
    while run(control, env, stdin="get_server_list\n").stdout and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run(control, env, stdin="get_server_list\n").stdout == ""
    assert run(control, env, stdin="quit\n").returncode == 0
    wait_gone(pid)
