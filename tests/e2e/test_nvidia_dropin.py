"""A DaemonSet written for NVIDIA's plugin runs nvplugin unchanged: NVIDIA's environment variables
and flag forms, NVIDIA's config file, and containers get what NVIDIA's plugin would give them --
checked over gRPC through the fake kubelet against a real ``nvplugin serve``."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from nvplugin.nodesession import load_topology
from nvplugin.rm import replica_id
from tests.support.serve import kubelet_with, new_dir, run_serve
from tests.support.waiting import WAIT_S

NODE = "dgx-1"
TOPOLOGY = load_topology(NODE)
GPU = "nvidia.com/gpu"
MOUNT_ROOT = "/var/run/nvidia-container-devices"

# NVIDIA's README example plus the GPU Operator's time-slicing block, renamed by default.
CONFIG = """\
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 2
"""


def run(body: Callable[[], Awaitable[None]], timeout: float = 90) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


def test_nvidia_environment_gives_containers_what_nvidia_would() -> None:
    """PASS_DEVICE_SPECS, DEVICE_LIST_STRATEGY, DEVICE_ID_STRATEGY and CONFIG_FILE as NVIDIA's
    compat-with-CPU-manager DaemonSet sets them; the variables win over the file."""

    async def body() -> None:
        directory, config_dir = new_dir(), new_dir()
        config = Path(config_dir) / "config.yaml"
        config.write_text(CONFIG)
        env = {
            "PASS_DEVICE_SPECS": "true",
            "DEVICE_LIST_STRATEGY": "volume-mounts",
            "DEVICE_ID_STRATEGY": "index",
            "CONFIG_FILE": str(config),
        }
        try:
            async with kubelet_with(directory, "--simulate", NODE, env=env) as (kubelet, serve):
                shared = f"{GPU}.shared"
                await kubelet.wait_registered(shared, WAIT_S)
                devices = kubelet.devices
                obs = kubelet.observer
                await obs.wait_for(
                    lambda m: len(m.healthy_devices(shared)) == 2 * len(TOPOLOGY.gpus),
                    WAIT_S,
                    "two replicas per GPU",
                )
                ids = [replica_id(TOPOLOGY.gpus[3].uuid, 1)]
                response = await devices.allocate(shared, ids)
                # volume-mounts with index IDs: the env names the mount root, one mount per GPU.
                assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": MOUNT_ROOT}
                assert [(m.container_path, m.host_path) for m in response.mounts] == [
                    (f"{MOUNT_ROOT}/3", "/dev/null")
                ]
                # PASS_DEVICE_SPECS: the GPU's device node (control nodes only where present).
                minor = TOPOLOGY.gpus[3].minor
                specs = [(d.container_path, d.host_path, d.permissions) for d in response.devices]
                assert (f"/dev/nvidia{minor}", f"/dev/nvidia{minor}", "rw") in specs
                (effective,) = serve.events("effective config")
                plugin = effective["config"]["flags"]["plugin"]
                assert plugin["passDeviceSpecs"] is True
                assert plugin["deviceListStrategy"] == ["volume-mounts"]
                assert effective["config"]["source"] == str(config)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            shutil.rmtree(config_dir, ignore_errors=True)

    run(body)


def test_nvidia_flag_forms() -> None:
    """``--config-file``, ``--flag=true|false``, and a list flag repeated and comma-separated."""

    async def body() -> None:
        directory, config_dir = new_dir(), new_dir()
        config = Path(config_dir) / "config.yaml"
        config.write_text("version: v1\nflags:\n  plugin:\n    passDeviceSpecs: true\n")
        args = [
            "--simulate",
            NODE,
            f"--config-file={config}",
            "--fail-on-init-error=false",
            "--pass-device-specs=false",
            "--device-list-strategy=envvar",
            "--device-list-strategy",
            "cdi-annotations,cdi-cri",
            "--device-id-strategy=index",
        ]
        try:
            async with kubelet_with(directory, *args) as (kubelet, serve):
                await kubelet.wait_registered(GPU, WAIT_S)
                response = await kubelet.devices.allocate(GPU, [TOPOLOGY.gpus[1].uuid])
                assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "1"}
                assert [d.name for d in response.cdi_devices] == [
                    "k8s.device-plugin.nvidia.com/gpu=1"
                ]
                assert list(response.annotations.values()) == ["k8s.device-plugin.nvidia.com/gpu=1"]
                assert list(response.devices) == []  # --pass-device-specs=false won
                (effective,) = serve.events("effective config")
                flags = effective["config"]["flags"]
                assert flags["failOnInitError"] is False
                assert flags["plugin"]["deviceListStrategy"] == [
                    "envvar",
                    "cdi-annotations",
                    "cdi-cri",
                ]
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            shutil.rmtree(config_dir, ignore_errors=True)

    run(body)


def test_unsupported_nvidia_settings_exit_2_naming_them() -> None:
    config_dir = new_dir()
    try:
        imex = Path(config_dir) / "imex.yaml"
        imex.write_text("version: v1\nimex:\n  channelIDs: [0]\n  required: true\n")
        for path, key in ((imex, "imex.channelIDs"),):
            done = run_serve("--simulate", NODE, "--config-file", str(path))
            assert done.returncode == 2, done.stderr
            assert f'key "{key}": nvplugin does not support' in done.stderr
            assert "Traceback" not in done.stderr
        done = run_serve("--simulate", NODE, "--gds-enabled")
        assert done.returncode == 2
        assert 'flag --gds-enabled (config key "flags.gdsEnabled")' in done.stderr
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)


def test_several_resources_with_envvar_alone_warn_once() -> None:
    async def body() -> None:
        directory, config_dir = new_dir(), new_dir()
        config = Path(config_dir) / "config.yaml"
        config.write_text(
            "resources:\n  gpus:\n  - {pattern: '*V100*', name: v100}\n"
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: v100, replicas: 2, "
            "rename: v100-shared}\n"
        )
        args = ("--simulate", "mixed-a100-t4", "--config", str(config))
        warning = "several resources served with deviceListStrategy envvar alone"
        try:
            async with kubelet_with(directory, *args) as (kubelet, serve):
                await kubelet.wait_registered(GPU, WAIT_S)
                await serve.wait_log("serving")
            assert serve.events(warning) == []  # one resource only: no V100 on this node
            config.write_text("resources:\n  gpus:\n  - {pattern: '*A100*', name: a100}\n")
            async with kubelet_with(directory, *args) as (kubelet, serve):
                await kubelet.wait_registered("nvidia.com/a100", WAIT_S)
                line = await serve.wait_log(warning)
                assert line["resources"] == ["nvidia.com/a100", GPU]
                for strategy in ("volume-mounts", "cdi-annotations", "cdi-cri"):
                    assert strategy in line["reason"]
            assert len(serve.events(warning)) == 1
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            shutil.rmtree(config_dir, ignore_errors=True)

    run(body)
