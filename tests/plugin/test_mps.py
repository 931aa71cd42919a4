"""The MPS control daemon's lifecycle (nvplugin/plugin/mps.py) against the simulated node's
``nvidia-cuda-mps-control`` and compute modes: start and set-up commands, compute modes claimed and
restored, a daemon that stops answering replaced, one left by a killed plugin taken over, a
program that cannot start retried, daemons kept across a re-serve while their spec stays."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from nvplugin.errors import NvpluginError
from nvplugin.nodesession import NodeSession, open_node
from nvplugin.plugin.mps import (
    DaemonSpec,
    MpsDaemon,
    MpsDaemons,
    Timing,
    daemon_pids,
    find_control,
    local_root,
)
from nvplugin.sim.mpscontrol import PROGRAM
from tests.support.waiting import WAIT_S, until

pytestmark = pytest.mark.process  # runs the simulated nvidia-cuda-mps-control (a Python program)

FAST = Timing(command_timeout_s=WAIT_S, check_s=0.2, backoff_s=0.05, backoff_max_s=0.4)


@pytest.fixture
def node() -> Iterator[NodeSession]:
    with open_node("dgx-1") as session:
        yield session


@pytest.fixture
def root() -> Iterator[str]:
    directory = tempfile.mkdtemp()
    yield directory
    shutil.rmtree(directory)


def spec_of(node: NodeSession, root: str, gpus: tuple[int, ...] = (0, 1, 2, 3)) -> DaemonSpec:
    assert node.driver_root is not None
    return DaemonSpec(
        "nvidia.com/gpu",
        tuple(node.topology.gpus[i] for i in gpus),
        4,
        root,
        os.path.join(node.driver_root, PROGRAM),
    )


@asynccontextmanager
async def running(daemon: MpsDaemon) -> AsyncIterator[list[str | None]]:
    """The daemon started (its states, as followed) and stopped however the block ends."""
    states: list[str | None] = []
    daemon.follow(states.append)
    daemon.start()
    try:
        yield states
    finally:
        await daemon.stop()


def modes(node: NodeSession) -> list[str]:
    return [node.nvml.compute_mode(gpu.index) for gpu in node.topology.gpus]


def commands(log: Path) -> list[str]:
    return [line.split("] Cmd:", 1)[1] for line in log.read_text().splitlines() if "] Cmd:" in line]


def test_start_sets_each_gpu_up_and_stop_restores_it_leaving_nothing(
    node: NodeSession, root: str
) -> None:
    spec = spec_of(node, root)

    async def body() -> None:
        daemon = MpsDaemon(spec, node.nvml, dict(os.environ), FAST)
        async with running(daemon) as states:
            await until(lambda: daemon.ready, "the daemon ready")
            assert states == ["starting", None]
            assert modes(node) == ["EXCLUSIVE_PROCESS"] * 4 + ["DEFAULT"] * 4
            recorded = sorted(os.listdir(os.path.join(root, "compute-modes")))
            assert recorded == sorted(gpu.uuid for gpu in spec.gpus)
            (pid,) = daemon_pids(spec.pipe_dir)
            assert pid == daemon.pid
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            visible = ",".join(gpu.uuid for gpu in spec.gpus)
            assert f"CUDA_VISIBLE_DEVICES={visible}".encode() in environ
            assert f"CUDA_MPS_LOG_DIRECTORY={spec.log_dir}".encode() in environ
            assert commands(Path(spec.log_dir, "control.log")) == [
                "get_server_list",  # answered: ready to be set up
                *(f"set_default_device_pinned_mem_limit {n} 4040M" for n in range(4)),
                "set_default_active_thread_percentage 25",
            ]
        assert daemon_pids(spec.pipe_dir) == []
        assert modes(node) == ["DEFAULT"] * 8
        assert os.listdir(os.path.join(root, "compute-modes")) == []
        assert commands(Path(spec.log_dir, "control.log"))[-1] == "quit"

    asyncio.run(asyncio.wait_for(body(), 4 * WAIT_S))


def test_a_daemon_that_stops_answering_is_replaced(node: NodeSession, root: str) -> None:
    spec = spec_of(node, root, (5,))
    timing = Timing(command_timeout_s=3.0, check_s=0.2, backoff_s=0.05, stop_timeout_s=1.0)

    async def body() -> None:
        daemon = MpsDaemon(spec, node.nvml, dict(os.environ), timing)
        async with running(daemon) as states:
            await until(lambda: daemon.ready, "the daemon ready")
            stuck = daemon.pid
            assert stuck is not None
            os.kill(stuck, signal.SIGSTOP)
            await until(lambda: not daemon.ready, "the daemon not ready")
            assert states[-1] is not None
            assert f"control daemon {stuck} does not answer" in states[-1]
            await until(lambda: daemon.ready, "a new daemon ready")
            assert daemon.pid != stuck
            assert not os.path.exists(f"/proc/{stuck}") or _zombie(stuck)  # killed
            assert daemon_pids(spec.pipe_dir) == [daemon.pid]
            assert node.nvml.compute_mode(5) == "EXCLUSIVE_PROCESS"
        assert daemon_pids(spec.pipe_dir) == []

    asyncio.run(asyncio.wait_for(body(), 4 * WAIT_S))


def test_what_a_killed_plugin_left_is_taken_over(node: NodeSession, root: str) -> None:
    """A daemon still running on the pipe directory and a GPU left in EXCLUSIVE_PROCESS with its
    mode before recorded: the daemon is quit and replaced, the recorded mode restored at stop."""
    spec = spec_of(node, root, (0,))

    async def body() -> None:
        os.makedirs(spec.pipe_dir)
        os.makedirs(os.path.join(root, "compute-modes"))
        env = spec.environment(dict(os.environ))
        started = subprocess.run([spec.control, "-d"], env=env, timeout=WAIT_S, check=False)
        assert started.returncode == 0
        (left,) = daemon_pids(spec.pipe_dir)
        node.nvml.set_compute_mode(0, "EXCLUSIVE_PROCESS")
        Path(root, "compute-modes", spec.gpus[0].uuid).write_text("PROHIBITED\n")
        daemon = MpsDaemon(spec, node.nvml, dict(os.environ), FAST)
        async with running(daemon):
            await until(lambda: daemon.ready, "the daemon ready")
            assert daemon.pid != left
            assert daemon_pids(spec.pipe_dir) == [daemon.pid]
        assert node.nvml.compute_mode(0) == "PROHIBITED"

    asyncio.run(asyncio.wait_for(body(), 4 * WAIT_S))


def test_a_program_that_cannot_start_is_retried_with_backoff(node: NodeSession, root: str) -> None:
    failing = os.path.join(root, "nvidia-cuda-mps-control")
    Path(failing).write_text("#!/bin/sh\necho 'no GPU for MPS' >&2\nexit 3\n")
    os.chmod(failing, 0o755)
    spec = DaemonSpec("nvidia.com/gpu", node.topology.gpus[:1], 2, root, failing)

    async def body() -> None:
        daemon = MpsDaemon(spec, node.nvml, dict(os.environ), FAST)
        async with running(daemon) as states:
            await until(lambda: daemon.starts >= 3, "three starts")
            assert not daemon.ready
            assert states[-1] == "'-d' failed (exit 3): no GPU for MPS"
        assert node.nvml.compute_mode(0) == "DEFAULT"  # restored, though it never ran

    asyncio.run(asyncio.wait_for(body(), 4 * WAIT_S))


def test_daemons_are_kept_across_a_reserve_while_their_spec_stays(
    node: NodeSession, root: str
) -> None:
    first = spec_of(node, root, (0, 1))

    async def body() -> None:
        daemons = MpsDaemons(node.nvml, timing=FAST)
        try:
            (kept,) = (await daemons.serve([first])).values()
            await until(lambda: kept.ready, "the daemon ready")
            (same,) = (await daemons.serve([first])).values()
            assert same is kept and kept.starts == 1
            moved = spec_of(node, root, (1, 2))  # GPU 1 moves: the old daemon goes first
            (new,) = (await daemons.serve([moved])).values()
            assert new is not kept
            await until(lambda: new.ready, "the new daemon ready")
            assert modes(node)[:4] == [
                "DEFAULT",
                "EXCLUSIVE_PROCESS",
                "EXCLUSIVE_PROCESS",
                "DEFAULT",
            ]
            assert await daemons.serve([]) == {}
            assert modes(node) == ["DEFAULT"] * 8
        finally:
            await daemons.stop()
        assert daemon_pids(first.pipe_dir) == []

    asyncio.run(asyncio.wait_for(body(), 4 * WAIT_S))


def test_the_control_program_is_found_under_the_driver_root(node: NodeSession, root: str) -> None:
    assert node.driver_root is not None
    assert find_control(node.driver_root) == os.path.join(node.driver_root, PROGRAM)
    if shutil.which("nvidia-cuda-mps-control") is None:
        with pytest.raises(NvpluginError) as caught:
            find_control(root)
        assert f"nvidia-cuda-mps-control is not under the driver root {root}" in str(caught.value)


def test_the_root_is_nvidias_container_root_when_mounted(root: str) -> None:
    assert local_root("/run/nvidia/mps", container_root=root) == root
    assert local_root("/run/nvidia/mps", container_root=os.path.join(root, "no")) == (
        "/run/nvidia/mps"
    )


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
