"""MPS end to end: a real ``nvplugin serve`` with NVIDIA's ``sharing.mps`` on a simulated node,
beside the fake kubelet -- replicas advertised once the control daemon it started is set up,
Allocate over gRPC as NVIDIA's plus the container's shares, the daemon's commands in its
control.log, a killed daemon making the replicas Unhealthy and coming back, SIGHUP turning MPS on
and off, and no daemon left after stop."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from nvplugin.kubelet.kubelet import FakeKubelet
from nvplugin.node import load_topology
from nvplugin.plugin.mps import daemon_pids
from nvplugin.rm import replica_id
from tests import WAIT_S
from tests.support.serve import Serve, admit_json, kubelet_with, new_dir, pods_file

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

    def remove(self) -> None:
        for path in (self.directory, self.root, self.config_dir):
            shutil.rmtree(path, ignore_errors=True)


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
            # Stopped (exit 0, checked by kubelet_with): the daemon quit, compute modes restored.
            assert daemon_pids(pipe) == []
            assert control_commands(root, SHARED)[-1] == "quit"
            restored = serve.events("compute mode restored")
            assert [(line["gpu"], line["mode"]) for line in restored] == [
                (n, "DEFAULT") for n in range(8)
            ]
            assert os.listdir(os.path.join(root, "compute-modes")) == []
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
        directory, root, pipe = scene.directory, scene.root, scene.pipe
        args = scene.args
        async with FakeKubelet(directory) as kubelet:
            killed = Serve(directory, *args)
            try:
                await kubelet.wait_registered(SHARED, WAIT_S)
                await killed.wait_log("MPS control daemon ready")
                (left,) = daemon_pids(pipe)
            finally:
                killed.stop(signal.SIGKILL)
        assert daemon_pids(pipe) == [left]  # nothing can stop it on SIGKILL
        assert len(os.listdir(os.path.join(root, "compute-modes"))) == 8
        try:
            async with kubelet_with(directory, *args) as (kubelet, serve):
                await kubelet.wait_registered(SHARED, WAIT_S)
                adopted = await serve.wait_log("MPS control daemon adopted")
                assert adopted["pid"] == left
                assert daemon_pids(pipe) == [left]
                assert serve.events("MPS control daemon ready") == []
            assert daemon_pids(pipe) == []
            assert os.listdir(os.path.join(root, "compute-modes")) == []
            assert len(serve.events("compute mode restored")) == 8
        finally:
            scene.remove()

    run(body)


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


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
