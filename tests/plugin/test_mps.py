"""The MPS control daemon's lifecycle (nvplugin/plugin/mps.py) against the simulated node's
``nvidia-cuda-mps-control`` and compute modes: start and set-up commands, compute modes claimed and
restored, a daemon that stops answering replaced, one left by a killed plugin taken over, a
program that cannot start retried, daemons kept across a re-serve while their spec stays; a
released daemon adopted with its clients (and the mode before MPS still the one restored), one set
up otherwise replaced, and what no spec wants any more ended (leftover daemons, recorded modes)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nvplugin.errors import NvpluginError
from nvplugin.nodesession import NodeSession, open_node
from nvplugin.plugin.mps import (
    DaemonSpec,
    MpsDaemon,
    MpsDaemons,
    MpsRoot,
    Timing,
    daemon_pids,
    daemons_outlive_us,
    find_control,
    local_root,
)
from nvplugin.plugin.mpscontrol import memory_mib
from nvplugin.sim.fakempscontrol import PROGRAM
from tests.support.mpsclient import mps_client
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


def client_of(spec: DaemonSpec) -> contextlib.AbstractAsyncContextManager[subprocess.Popen[str]]:
    """A simulated MPS client of the daemon on ``spec``'s pipe directory."""
    return mps_client(spec.control, spec.environment(dict(os.environ)))


def test_a_released_daemon_is_adopted_with_its_clients(node: NodeSession, root: str) -> None:
    """Released (the plugin exits), the daemon runs on, its client served, its GPUs claimed and
    recorded; the next daemon of the same spec adopts it -- same process, set up by nobody --
    and, stopped, restores the mode the GPUs had before MPS, not EXCLUSIVE_PROCESS."""
    spec = spec_of(node, root, (2, 3))
    node.nvml.set_compute_mode(3, "PROHIBITED")

    async def body() -> None:
        first = MpsDaemon(spec, node.nvml, dict(os.environ), FAST)
        first.start()
        try:
            await until(lambda: first.ready, "the first daemon ready")
        finally:
            await first.release()
        (pid,) = daemon_pids(spec.pipe_dir)
        assert pid == first.pid
        assert modes(node)[2:4] == ["EXCLUSIVE_PROCESS"] * 2
        assert sorted(os.listdir(os.path.join(root, "compute-modes"))) == sorted(
            gpu.uuid for gpu in spec.gpus
        )
        async with client_of(spec) as client:
            log = Path(spec.log_dir, "control.log")
            before = len(commands(log))
            second = MpsDaemon(spec, node.nvml, dict(os.environ), FAST)
            with capture_logs() as logs:
                async with running(second):
                    await until(lambda: second.ready, "the second daemon ready")
                    assert (second.pid, second.starts, second.adopted) == (pid, 0, 1)
                    assert commands(log)[before : before + 4] == [
                        "get_server_list",
                        "get_default_active_thread_percentage",
                        "get_default_device_pinned_mem_limit 0",
                        "get_default_device_pinned_mem_limit 1",
                    ]
                    assert not any(c.startswith("set_") for c in commands(log)[before:])
                    assert client.poll() is None
            assert [e["pid"] for e in logs if e["event"] == "MPS control daemon adopted"] == [pid]
            assert await asyncio.to_thread(client.wait, WAIT_S) == 1  # stopped: server lost
        assert daemon_pids(spec.pipe_dir) == []
        assert modes(node)[2:4] == ["DEFAULT", "PROHIBITED"]
        assert os.listdir(os.path.join(root, "compute-modes")) == []

    asyncio.run(asyncio.wait_for(body(), 4 * WAIT_S))


@pytest.mark.parametrize(
    ("other", "reason"),
    [
        (
            lambda spec: replace(spec, replicas=2),
            "its default active thread percentage is '50.0', not 25",
        ),
        (lambda spec: replace(spec, gpus=spec.gpus[:1]), "its CUDA_VISIBLE_DEVICES is "),
        (lambda spec: None, "not started by nvplugin (MPS_CONTROL_OWNER is not nvplugin"),
    ],
    ids=["other-shares", "other-gpus", "not-nvplugins"],
)
def test_a_daemon_set_up_otherwise_is_replaced(
    node: NodeSession, root: str, other: object, reason: str
) -> None:
    spec = spec_of(node, root, (0, 1))

    async def body() -> None:
        assert callable(other)
        first_spec = other(spec)
        if first_spec is None:  # another's daemon: started without nvplugin's mark
            env = spec.environment(dict(os.environ))
            del env["MPS_CONTROL_OWNER"]
            os.makedirs(spec.pipe_dir)
            started = subprocess.run([spec.control, "-d"], env=env, timeout=WAIT_S, check=False)
            assert started.returncode == 0
        else:
            first = MpsDaemon(first_spec, node.nvml, dict(os.environ), FAST)
            first.start()
            await until(lambda: first.ready, "the first daemon ready")
            await first.release()
        (left,) = daemon_pids(spec.pipe_dir)
        daemon = MpsDaemon(spec, node.nvml, dict(os.environ), FAST)
        with capture_logs() as logs:
            async with running(daemon):
                await until(lambda: daemon.ready, "the daemon ready")
                assert (daemon.starts, daemon.adopted) == (1, 0)
                assert daemon_pids(spec.pipe_dir) == [daemon.pid] != [left]
        (replaced,) = [e for e in logs if e["event"] == "MPS control daemon replaced"]
        assert replaced["pids"] == [left]
        assert replaced["reason"].startswith(reason), replaced["reason"]

    asyncio.run(asyncio.wait_for(body(), 4 * WAIT_S))


def test_what_no_spec_wants_is_ended_and_nothing_else(node: NodeSession, root: str) -> None:
    """A serve with the MPS root ends nvplugin's leftover daemons on the node's GPUs that no spec
    wants and restores the modes recorded for GPUs no spec serves; another node's daemon, one
    not nvplugin's and the wanted spec's GPUs' records are left alone."""
    gone = spec_of(node, root, (0, 1))
    kept = replace(spec_of(node, root, (4,)), resource="example.com/kept")
    foreign = replace(gone, resource="example.com/other-node")  # GPUs of another node
    strange = replace(gone, resource="example.com/not-ours")
    mps_root = MpsRoot(root, node.topology.gpus, gone.control)

    async def body() -> None:
        first = MpsDaemon(gone, node.nvml, dict(os.environ), FAST)
        first.start()
        await until(lambda: first.ready, "the leftover daemon ready")
        await first.release()
        for spec in (foreign, strange):
            env = spec.environment(dict(os.environ))
            if spec is foreign:
                env["CUDA_VISIBLE_DEVICES"] = "GPU-of-another-node"
            else:
                del env["MPS_CONTROL_OWNER"]
            os.makedirs(spec.pipe_dir)
            started = subprocess.run([spec.control, "-d"], env=env, timeout=WAIT_S, check=False)
            assert started.returncode == 0
        Path(root, "compute-modes", node.topology.gpus[4].uuid).write_text("PROHIBITED\n")
        Path(root, "compute-modes", "GPU-of-another-node").write_text("DEFAULT\n")
        daemons = MpsDaemons(node.nvml, timing=FAST)
        try:
            with capture_logs() as logs:
                (daemon,) = (await daemons.serve([kept], mps_root)).values()
                await until(lambda: daemon.ready, "the wanted daemon ready")
            assert daemon_pids(gone.pipe_dir) == []
            assert modes(node)[:2] == ["DEFAULT", "DEFAULT"]
            assert modes(node)[4] == "EXCLUSIVE_PROCESS"
            assert sorted(os.listdir(os.path.join(root, "compute-modes"))) == sorted(
                ["GPU-of-another-node", node.topology.gpus[4].uuid]
            )
            (ended,) = [e for e in logs if "no served resource wants" in e["event"]]
            assert ended["pipe_dir"] == gone.pipe_dir
            assert len(daemon_pids(foreign.pipe_dir)) == len(daemon_pids(strange.pipe_dir)) == 1
        finally:
            await daemons.stop()
            for spec in (foreign, strange):
                for pid in daemon_pids(spec.pipe_dir):
                    os.kill(pid, signal.SIGKILL)
        assert modes(node)[4] == "PROHIBITED"

    asyncio.run(asyncio.wait_for(body(), 4 * WAIT_S))


HOST_PID_NAMESPACE = 0xEFFFFFFC


@pytest.mark.parametrize(
    ("pid", "ppid", "namespace", "outlive"),
    [
        (1, 0, 4026532512, False),  # a container's main process (the chart's)
        (7, 1, 4026532512, False),  # under a container's init (tini): it ends with the plugin
        (7, 1, HOST_PID_NAMESPACE, True),  # a host service, its parent the host's init
        (7, 5, 4026532512, True),  # a child of another process in a container
        (7, 5, HOST_PID_NAMESPACE, True),  # run from a shell on the host
    ],
)
def test_where_the_daemons_outlive_the_plugin(
    pid: int, ppid: int, namespace: int, outlive: bool
) -> None:
    assert daemons_outlive_us(pid, ppid, namespace) is outlive


def test_memory_limits_are_read_as_the_daemon_prints_them() -> None:
    assert memory_mib("4040M") == 4040
    assert memory_mib("3G\n") == 3072
    assert memory_mib("1.5G") == 1536
    assert memory_mib("512K") == 0.5
    assert memory_mib("0") == 0
    assert memory_mib("4040") is None  # no unit: not readable as a limit
    assert memory_mib("N/A") is None


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
