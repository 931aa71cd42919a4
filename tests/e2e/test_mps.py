"""MPS end to end: a real ``nvplugin serve`` with NVIDIA's ``sharing.mps`` on a simulated node,
beside the fake kubelet -- replicas advertised once the control daemon it started is set up,
Allocate over gRPC as NVIDIA's plus the container's shares, the daemon's commands in its
control.log, a killed daemon making the replicas Unhealthy and coming back, SIGHUP turning MPS on
and off; the daemon left running at SIGTERM and adopted by the next plugin with its client served
throughout, stopped by the next plugin without MPS or by ``nvplugin mps stop`` (an uninstall),
and stopped at SIGTERM by a plugin that is its PID namespace's init (as in its container)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nvplugin.config.model import DEFAULT_MPS_ROOT
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.nodesession import load_topology
from nvplugin.plugin.mps import daemon_pids
from nvplugin.rm import replica_id
from nvplugin.sim import fakempscontrol
from tests.support.mpsclient import mps_client
from tests.support.serve import (
    Serve,
    admit_json,
    kubelet_with,
    new_dir,
    pods_file,
    run_nvplugin,
)
from tests.support.waiting import WAIT_S, until

NODE = "dgx-1"  # 8 x V100 16 GB (16160 MiB)
TOPOLOGY = load_topology(NODE)
GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"

MPS = """\
version: v1
sharing:
  mps:
    renameByDefault: true
    failRequestsGreaterThanOne: false
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def run(body: Callable[[], Awaitable[None]], timeout: float = 180) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


def control_commands(root: str, resource: str) -> list[str]:
    log = Path(root, resource, "log", "control.log")
    return [line.split("] Cmd:", 1)[1] for line in log.read_text().splitlines() if "] Cmd:" in line]


@dataclass
class Scene:
    """A plugin directory, an MPS root and a config file (all removed by :meth:`remove`)."""

    resource: str
    text: str
    directory: str = field(default_factory=new_dir)
    root: str = field(default_factory=new_dir)
    config_dir: str = field(default_factory=new_dir)

    def __post_init__(self) -> None:
        self.config.write_text(self.text)

    @property
    def config(self) -> Path:
        return Path(self.config_dir, "config.yaml")

    @property
    def pipe(self) -> str:
        return os.path.join(self.root, self.resource, "pipe")

    @property
    def args(self) -> tuple[str, ...]:
        return ("--simulate", NODE, "--config", str(self.config), "--mps-root", self.root)

    @property
    def records(self) -> list[str]:
        """The compute modes recorded under the MPS root (GPU UUIDs)."""
        with contextlib.suppress(FileNotFoundError):
            return sorted(os.listdir(os.path.join(self.root, "compute-modes")))
        return []

    def mps_stop(self) -> list[dict[str, Any]]:
        """``nvplugin mps stop`` on this scene's node and root (it must succeed); its JSON log."""
        done = run_nvplugin(
            "mps",
            "stop",
            "--simulate",
            NODE,
            "--mps-root",
            self.root,
            "--log-format",
            "json",
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"MPS root {self.root}: "), done.stdout
        return [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]

    def remove(self) -> None:
        """Whatever a failed test left running on the root ended, and the directories gone."""
        for pid, _ in control_daemons_under(self.root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for path in (self.directory, self.root, self.config_dir):
            shutil.rmtree(path, ignore_errors=True)


def control_daemons_under(root: str) -> list[tuple[int, str]]:
    from nvplugin.plugin.mps import control_daemons

    return [(pid, pipe) for pid, pipe in control_daemons() if pipe.startswith(root + os.sep)]


def restored_modes(lines: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [
        (line["gpu"], line["mode"]) for line in lines if line["event"] == "compute mode restored"
    ]


def client_of(scene: Scene) -> contextlib.AbstractAsyncContextManager[subprocess.Popen[str]]:
    """A simulated MPS client of the daemon on the scene's pipe directory. Its program is written
    outside any plugin's simulated tree, which goes with its plugin."""
    program = fakempscontrol.write_program(scene.config_dir)
    return mps_client(program, {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": scene.pipe})


def clients_of(scene: Scene, daemon: int) -> list[int]:
    """What the daemon says of its clients (``get_client_list``)."""
    program = os.path.join(scene.config_dir, fakempscontrol.PROGRAM)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": scene.pipe}
    done = subprocess.run(
        [program],
        input=f"get_client_list {daemon}\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=True,
    )
    return [int(line) for line in done.stdout.split()]


def test_mps_served_allocated_watched_and_stopped() -> None:
    async def body() -> None:
        scene = Scene(SHARED, MPS)
        directory, root, pipe = scene.directory, scene.root, scene.pipe
        args = scene.args
        try:
            async with kubelet_with(directory, *args) as (kubelet, serve):
                await kubelet.wait_registered(SHARED, WAIT_S)
                observer = kubelet.observer
                await observer.wait_for(
                    lambda m: len(m.healthy_devices(SHARED)) == 32, WAIT_S, "4 MPS replicas per GPU"
                )
                # Registered only once the daemon was set up: one share of each GPU.
                ready = serve.events("MPS control daemon ready")
                assert len(ready) == 1 and ready[0]["gpus"] == list(range(8))
                assert control_commands(root, SHARED) == [
                    "get_server_list",
                    *(f"set_default_device_pinned_mem_limit {n} 4040M" for n in range(8)),
                    "set_default_active_thread_percentage 25",
                ]
                (daemon,) = daemon_pids(pipe)

                # Allocate as NVIDIA's, with the container's share.
                one = await kubelet.devices.allocate(SHARED, [replica_id(TOPOLOGY.gpus[3].uuid, 2)])
                assert dict(one.envs) == {
                    "NVIDIA_VISIBLE_DEVICES": TOPOLOGY.gpus[3].uuid,
                    "CUDA_MPS_PIPE_DIRECTORY": f"/mps/{SHARED}/pipe",
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4040M",
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                }
                assert [(m.container_path, m.host_path) for m in one.mounts] == [
                    (f"/mps/{SHARED}/pipe", pipe),
                    ("/dev/shm", os.path.join(root, "shm")),
                ]
                # Two replicas of one GPU: two shares (failRequestsGreaterThanOne is false).
                two = await kubelet.devices.allocate(
                    SHARED, [replica_id(TOPOLOGY.gpus[5].uuid, n) for n in (0, 3)]
                )
                assert two.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8080M"
                assert two.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"

                # The daemon killed: every replica Unhealthy at once, then back with a new one.
                os.kill(daemon, signal.SIGKILL)
                await observer.wait_for(
                    lambda m: len(m.unhealthy_devices(SHARED)) == 32, WAIT_S, "all Unhealthy"
                )
                await observer.wait_for(
                    lambda m: len(m.healthy_devices(SHARED)) == 32, WAIT_S, "all Healthy again"
                )
                (again,) = daemon_pids(pipe)
                assert again != daemon
                lost = await serve.wait_log("MPS control daemon lost")
                assert lost["reason"] == f"control daemon {daemon} exited"
                assert (
                    control_commands(root, SHARED)[-1] == "set_default_active_thread_percentage 25"
                )
            # Stopped (exit 0, checked by kubelet_with): the daemon left running for the next
            # plugin, its GPUs claimed, their modes before still recorded.
            assert daemon_pids(pipe) == [again]
            (left,) = serve.events("MPS control daemon left running")
            assert left["pid"] == again
            assert serve.events("compute mode restored") == []
            assert len(scene.records) == 8
            # An uninstall's nvplugin mps stop: the daemon quit, compute modes restored.
            stopped = scene.mps_stop()
            assert daemon_pids(pipe) == []
            assert control_commands(root, SHARED)[-1] == "quit"
            assert restored_modes(stopped) == [(n, "DEFAULT") for n in range(8)]
            assert scene.records == []
        finally:
            scene.remove()

    run(body)


def test_sighup_turns_mps_on_and_off() -> None:
    async def body() -> None:
        scene = Scene(GPU, "version: v1\n")
        directory, config, pipe = scene.directory, scene.config, scene.pipe
        args = scene.args
        try:
            async with kubelet_with(directory, *args) as (kubelet, serve):
                observer = kubelet.observer
                await kubelet.wait_registered(GPU, WAIT_S)
                await observer.wait_for(lambda m: len(m.healthy_devices(GPU)) == 8, WAIT_S, "8")
                assert daemon_pids(pipe) == []
                # On: the same resource, now 4 MPS replicas per GPU.
                config.write_text(MPS.replace("renameByDefault: true", "renameByDefault: false"))
                serve.send(signal.SIGHUP)
                await observer.wait_for(
                    lambda m: len(m.healthy_devices(GPU)) == 32, WAIT_S, "32 MPS replicas"
                )
                assert len(daemon_pids(pipe)) == 1
                # A reload that changes nothing MPS depends on keeps the daemon (and its clients).
                (daemon,) = daemon_pids(pipe)
                config.write_text(
                    MPS.replace("renameByDefault: true", "renameByDefault: false")
                    + "nvplugin:\n  allocationPolicy: simple\n"
                )
                serve.send(signal.SIGHUP)
                await serve.wait_log(
                    "serving", where=lambda line: len(serve.events("serving")) >= 3
                )
                assert daemon_pids(pipe) == [daemon]
                assert len(serve.events("MPS control daemon ready")) == 1
                # Off: whole GPUs again, the daemon gone and the compute modes back.
                config.write_text("version: v1\n")
                serve.send(signal.SIGHUP)
                await observer.wait_for(
                    lambda m: (
                        set(m.devices(GPU)) == {gpu.uuid for gpu in TOPOLOGY.gpus}
                        and len(m.healthy_devices(GPU)) == 8
                    ),
                    WAIT_S,
                    "8 whole GPUs again",
                )
                assert daemon_pids(pipe) == []
                assert len(serve.events("compute mode restored")) == 8
            assert daemon_pids(pipe) == []
        finally:
            scene.remove()

    run(body)


def test_nvidias_chart_environment_serves_without_mps() -> None:
    """NVIDIA's chart sets MPS_ROOT (and NVIDIA_VISIBLE_DEVICES, ...) on every plugin container,
    MPS or not: served as usual, nothing of MPS started."""

    async def body() -> None:
        directory = new_dir()
        env = {
            "MPS_ROOT": "/run/nvidia/mps",
            "NVIDIA_VISIBLE_DEVICES": "all",
            "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
            "MIG_STRATEGY": "none",
            "FAIL_ON_INIT_ERROR": "true",
            "DEVICE_LIST_STRATEGY": "envvar",
            "DEVICE_ID_STRATEGY": "uuid",
        }
        try:
            async with kubelet_with(directory, "--simulate", NODE, env=env) as (kubelet, serve):
                await kubelet.wait_registered(GPU, WAIT_S)
                await kubelet.observer.wait_for(
                    lambda m: len(m.healthy_devices(GPU)) == 8, WAIT_S, "8 GPUs"
                )
                (effective,) = serve.events("effective config")
                assert effective["config"]["flags"]["mpsRoot"] == "/run/nvidia/mps"
                assert serve.events("MPS root") == []
                response = await kubelet.devices.allocate(GPU, [TOPOLOGY.gpus[0].uuid])
                assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": TOPOLOGY.gpus[0].uuid}
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    run(body)


def test_a_plugin_killed_with_sigkill_is_taken_over_by_the_next() -> None:
    """SIGKILL leaves the daemon and EXCLUSIVE_PROCESS behind (nothing can stop that); the next
    plugin adopts that daemon (set up as it would set it up) and restores the mode recorded
    before."""

    async def body() -> None:
        scene = Scene(SHARED, MPS)
        directory, pipe, args = scene.directory, scene.pipe, scene.args
        async with FakeKubelet(directory) as kubelet:
            killed = Serve(directory, *args)
            try:
                await kubelet.wait_registered(SHARED, WAIT_S)
                await killed.wait_log("MPS control daemon ready")
                (left,) = daemon_pids(pipe)
            finally:
                killed.stop(signal.SIGKILL)
        assert daemon_pids(pipe) == [left]  # nothing can stop it on SIGKILL
        assert len(scene.records) == 8
        try:
            async with kubelet_with(directory, *args) as (kubelet, serve):
                await kubelet.wait_registered(SHARED, WAIT_S)
                adopted = await serve.wait_log("MPS control daemon adopted")
                assert adopted["pid"] == left
                assert daemon_pids(pipe) == [left]
                assert serve.events("MPS control daemon ready") == []
            assert daemon_pids(pipe) == [left]  # left running again, records kept
            assert len(scene.records) == 8
            assert len(restored_modes(scene.mps_stop())) == 8
            assert daemon_pids(pipe) == []
            assert scene.records == []
        finally:
            scene.remove()

    run(body)


def test_a_plugin_restart_keeps_the_daemon_serving_its_client() -> None:
    """SIGTERM leaves the daemon running; a client it serves keeps its server while the plugin
    is gone and once the next plugin adopted that daemon (same process, not set up again) and
    registered the replicas Healthy again. An uninstall's ``nvplugin mps stop`` ends it."""

    async def body() -> None:
        scene = Scene(SHARED, MPS)
        directory, root, pipe, args = scene.directory, scene.root, scene.pipe, scene.args
        try:
            async with FakeKubelet(directory) as kubelet:
                observer = kubelet.observer
                first = Serve(directory, *args)
                try:
                    await observer.wait_for(
                        lambda m: len(m.healthy_devices(SHARED)) == 32, WAIT_S, "32 replicas"
                    )
                    (daemon,) = daemon_pids(pipe)
                    async with client_of(scene) as client:
                        assert clients_of(scene, daemon) == [client.pid]
                        assert first.stop() == 0
                        (left,) = first.events("MPS control daemon left running")
                        assert left["pid"] == daemon
                        await observer.wait_for(
                            lambda m: not m.is_registered(SHARED), WAIT_S, "the plugin gone"
                        )
                        assert daemon_pids(pipe) == [daemon]
                        assert client.poll() is None
                        assert len(scene.records) == 8

                        second = Serve(directory, *args)
                        try:
                            await kubelet.wait_registered(SHARED, WAIT_S)
                            await observer.wait_for(
                                lambda m: len(m.healthy_devices(SHARED)) == 32, WAIT_S, "32 again"
                            )
                            (adopted,) = second.events("MPS control daemon adopted")
                            assert adopted["pid"] == daemon
                            assert second.events("MPS control daemon ready") == []
                            assert second.events("MPS control daemon replaced") == []
                            assert daemon_pids(pipe) == [daemon]
                            assert client.poll() is None  # never lost its server
                            assert clients_of(scene, daemon) == [client.pid]
                            said = control_commands(root, SHARED)
                            assert said.count("set_default_active_thread_percentage 25") == 1
                            assert f"get_client_list {daemon}" in said
                        finally:
                            assert second.stop() == 0
                        assert daemon_pids(pipe) == [daemon]
                        assert client.poll() is None
                        # Uninstall: the daemon quit; its client loses its server only now.
                        assert len(restored_modes(scene.mps_stop())) == 8
                        assert await asyncio.to_thread(client.wait, WAIT_S) == 1
                        assert client.stdout is not None and client.stdout.read() == "server lost\n"
                finally:
                    first.terminate()
            assert daemon_pids(pipe) == []
            assert scene.records == []
        finally:
            scene.remove()

    run(body)


def test_a_restart_without_mps_stops_the_daemon_and_restores_compute_modes() -> None:
    """MPS turned off while no plugin ran: the next plugin, with no MPS resource, stops the
    daemon the last one left and restores the compute modes it recorded."""

    async def body() -> None:
        scene = Scene(GPU, MPS.replace("renameByDefault: true", "renameByDefault: false"))
        directory, pipe, args = scene.directory, scene.pipe, scene.args
        try:
            async with kubelet_with(directory, *args) as (kubelet, first):
                await kubelet.observer.wait_for(
                    lambda m: len(m.healthy_devices(GPU)) == 32, WAIT_S, "32 MPS replicas"
                )
                (daemon,) = daemon_pids(pipe)
            assert [line["pid"] for line in first.events("MPS control daemon left running")] == [
                daemon
            ]
            assert daemon_pids(pipe) == [daemon] and len(scene.records) == 8
            scene.config.write_text("version: v1\n")
            async with kubelet_with(directory, *args) as (kubelet, second):
                await kubelet.observer.wait_for(
                    lambda m: (
                        set(m.devices(GPU)) == {gpu.uuid for gpu in TOPOLOGY.gpus}
                        and len(m.healthy_devices(GPU)) == 8
                    ),
                    WAIT_S,
                    "8 whole GPUs",
                )
                (stopping,) = second.events(
                    "stopping an MPS control daemon no served resource wants"
                )
                assert (stopping["pipe_dir"], stopping["pids"]) == (pipe, [daemon])
                assert daemon_pids(pipe) == []
                assert control_commands(scene.root, GPU)[-1] == "quit"
                assert restored_modes(second.lines()) == [(n, "DEFAULT") for n in range(8)]
                assert scene.records == []
            assert second.events("MPS control daemon left running") == []
        finally:
            scene.remove()

    run(body)


def _pid_namespaces() -> bool:
    """Whether this machine lets an unprivileged process make a PID namespace (unshare)."""
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--pid",
            "--mount",
            "--fork",
            "--mount-proc",
            "true",
        ],
        capture_output=True,
        timeout=WAIT_S,
        check=False,
    )
    return done.returncode == 0


def test_as_its_pid_namespaces_init_the_plugin_stops_its_daemons_at_sigterm() -> None:
    """In its container (the chart's), the plugin is PID 1 of the container's PID namespace:
    whatever it leaves running dies with it. So there SIGTERM quits the daemon and restores the
    compute modes, as an uninstall needs. Run here as PID 1 of a new PID namespace."""
    if not _pid_namespaces():
        pytest.skip("unshare cannot make a PID namespace on this machine")

    async def body() -> None:
        scene = Scene(SHARED, MPS)
        directory, root, pipe = scene.directory, scene.root, scene.pipe
        unshare = ["unshare", "--user", "--map-root-user", "--pid", "--mount", "--fork"]
        unshare += ["--mount-proc", "--kill-child"]
        command = [*unshare, sys.executable, "-m", "nvplugin", "serve"]
        command += ["--device-plugin-dir", directory, "--log-format", "json"]
        try:
            async with FakeKubelet(directory) as kubelet:
                serve = Serve(directory, *scene.args, command=command)
                try:
                    await kubelet.observer.wait_for(
                        lambda m: len(m.healthy_devices(SHARED)) == 32, WAIT_S, "32 replicas"
                    )
                    (daemon,) = daemon_pids(pipe)
                    # unshare passes no signal on: SIGTERM goes to the plugin, its child.
                    (plugin,) = _children(serve.pid)
                    assert _namespace_pid(plugin) == 1
                    # As PID 1 it reaps the orphans the daemon's start leaves (nvplugin.pid1).
                    await until(lambda: _zombies_under(plugin) == [], "no zombie under PID 1")
                    os.kill(plugin, signal.SIGTERM)
                    assert serve.wait(WAIT_S) == 0, serve.text()
                finally:
                    serve.terminate()
            await until(lambda: daemon_pids(pipe) == [], "the daemon gone")
            assert control_commands(root, SHARED)[-1] == "quit"
            assert serve.events("MPS control daemon left running") == []
            assert restored_modes(serve.lines()) == [(n, "DEFAULT") for n in range(8)]
            assert scene.records == []
            assert daemon not in [pid for pid, _ in control_daemons_under(root)]
        finally:
            scene.remove()

    run(body)


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children


def _zombies_under(pid: int) -> list[int]:
    """The processes below ``pid`` that ended and were not reaped."""
    zombies, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    zombies.append(child)
                    continue
                todo.append(child)
    return zombies


def _namespace_pid(pid: int) -> int:
    """``pid``'s pid in its own (innermost) PID namespace."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise AssertionError(f"no NSpid for {pid}")


def test_admit_shows_each_containers_mps_shares() -> None:
    """``nvplugin admit`` runs the plugin with its own MPS root and reads each container's shares
    from its Allocate response, as the container would get them."""
    config_dir = new_dir()
    pods = pods_file(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: one}\nspec:\n  containers:\n"
        "  - {name: a, image: x, resources: {limits: {nvidia.com/gpu.shared: 1}}}\n"
        "---\napiVersion: v1\nkind: Pod\nmetadata: {name: three}\nspec:\n  containers:\n"
        "  - {name: b, image: x, resources: {limits: {nvidia.com/gpu.shared: 3}}}\n"
    )
    try:
        config = Path(config_dir, "mps.yaml")
        config.write_text(MPS + "flags:\n  plugin:\n    sharedDevicesAllocationPolicy: packed\n")
        results = admit_json("--simulate", NODE, "--config", str(config), pods)
        (one,) = results[0]["containers"]
        assert one["mps"] == {"memory_limits": {"0": "4040M"}, "active_thread_percentage": 25}
        (three,) = results[1]["containers"]
        assert three["gpu_indices"] == [0]  # packed: the rest of GPU 0
        assert three["mps"] == {"memory_limits": {"0": "12120M"}, "active_thread_percentage": 75}
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)
        os.unlink(pods)


def test_a_simulated_node_uses_a_scratch_mps_root_it_removes_at_stop() -> None:
    """``serve --simulate`` with MPS and no MPS root of its own must not create the host's
    (/run/nvidia/mps) or leave anything behind: it serves from a scratch root under /tmp, stops
    its daemon at SIGTERM (nothing else could use it) and removes the root."""

    async def body() -> None:
        scene = Scene(SHARED, MPS)
        args = ("--simulate", NODE, "--config", str(scene.config))
        try:
            async with kubelet_with(scene.directory, *args) as (kubelet, serve):
                await kubelet.wait_registered(SHARED, WAIT_S)
                (line,) = serve.events("MPS root")
                root = line["host"]
                assert root != DEFAULT_MPS_ROOT and root.startswith("/tmp/nvplugin-mps-")
                pipe = os.path.join(root, SHARED, "pipe")
                assert len(daemon_pids(pipe)) == 1
                one = await kubelet.devices.allocate(SHARED, [replica_id(TOPOLOGY.gpus[0].uuid, 0)])
                assert (f"/mps/{SHARED}/pipe", pipe) in [
                    (m.container_path, m.host_path) for m in one.mounts
                ]
            assert daemon_pids(pipe) == []
            assert not os.path.exists(root)
            assert serve.events("MPS control daemon left running") == []
        finally:
            scene.remove()

    run(body)
