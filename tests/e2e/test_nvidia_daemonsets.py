"""NVIDIA's DaemonSets, as users have them, with nvplugin's image swapped in: NVIDIA's static
manifests (no command: the image's entrypoint) and DaemonSets rendered by NVIDIA's chart
(``command: [nvidia-device-plugin]``, ``MPS_ROOT`` always set). Each container's command, args
and environment run as they are against the fake kubelet -- plus what a test needs to serve a
simulated node in a scratch directory (``--simulate NODE``, ``NVPLUGIN_DEVICE_PLUGIN_DIR``).
And what goes wrong on a node: the plugin run as a user that may not use the kubelet's
directory exits 2 naming the user and the fix; Xids chosen NVIDIA's documented way."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from nvplugin.config.model import DEFAULT_MPS_ROOT
from nvplugin.nodesession import load_topology
from tests.support.configmap import ConfigMapVolume
from tests.support.kubeapi import KubeApiServer
from tests.support.nvidia import FIXTURES, plugin_container
from tests.support.serve import kubelet_with, new_dir, node_file, plugin_environment
from tests.support.waiting import WAIT_S, until

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GPU = "nvidia.com/gpu"
MOUNT_ROOT = "/var/run/nvidia-container-devices"


def _image_command() -> tuple[list[str], list[str]]:
    """The image's ENTRYPOINT and CMD, from the Dockerfile."""
    found: dict[str, list[str]] = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        word, _, rest = line.partition(" ")
        if word in ("ENTRYPOINT", "CMD"):
            found[word] = json.loads(rest)
    return found["ENTRYPOINT"], found["CMD"]


def container_argv(container: dict[str, Any]) -> list[str]:
    """What the container runs, as Kubernetes decides it: ``command`` replaces the image's
    ENTRYPOINT (and drops its CMD), ``args`` replace the CMD; programs from this virtualenv (the
    image's PATH)."""
    entrypoint, cmd = _image_command()
    if "command" in container:
        argv = [*container["command"], *container.get("args", [])]
    else:
        argv = [*entrypoint, *container.get("args", cmd)]
    program = BIN / argv[0]
    assert program.exists(), f"{argv[0]} is not installed by the package (the image's PATH)"
    return [str(program), *argv[1:]]


def container_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def run(body: Callable[[], Awaitable[None]], timeout: float = 90) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


DAEMONSETS = {
    "static-nvidia-device-plugin-v0.17.1.yml": "dgx-1",
    "static-compat-with-cpumanager-v0.20.1.yml": "dgx-1",
    "chart-v0.20.0-defaults.yaml": "dgx-a100",
    "chart-v0.20.0-mig-mixed.yaml": "dgx-a100-mig",
}


def test_the_fixtures_are_nvidias_shapes() -> None:
    static = plugin_container("static-nvidia-device-plugin-v0.17.1.yml")
    assert "command" not in static and "args" not in static
    assert "runAsUser" not in static["securityContext"]
    chart = plugin_container("chart-v0.20.0-defaults.yaml")
    assert chart["command"] == ["nvidia-device-plugin"]
    assert container_env(chart)["MPS_ROOT"] == "/run/nvidia/mps"
    assert container_argv(static)[-2:] == ["nvplugin", "serve"]  # the image's entrypoint serves


@pytest.mark.parametrize("name", sorted(DAEMONSETS))
def test_nvidias_daemonset_serves_with_nvplugins_image(name: str) -> None:
    container = plugin_container(name)
    node = DAEMONSETS[name]
    topology = load_topology(node)
    env = container_env(container)

    async def body() -> None:
        directory = new_dir()
        command = container_argv(container)
        test_env = {
            **env,
            "NVPLUGIN_DEVICE_PLUGIN_DIR": directory,
            "NVPLUGIN_LOG_FORMAT": "json",
            "PATH": f"{BIN}:{os.environ['PATH']}",  # the image's PATH: its entrypoint runs env
        }
        try:
            async with kubelet_with(
                directory, "--simulate", node, env=test_env, command=command
            ) as (kubelet, serve):
                (effective,) = [await serve.wait_log("effective config")]
                flags = effective["config"]["flags"]
                if env.get("MIG_STRATEGY") == "mixed":
                    resource = "nvidia.com/mig-1g.5gb"
                    await kubelet.wait_registered(resource, WAIT_S)
                    await kubelet.wait_registered(GPU, WAIT_S)
                    mig = [m for g in topology.gpus for m in g.mig_devices if m.profile == "1g.5gb"]
                    response = await kubelet.devices.allocate(resource, [mig[0].uuid])
                else:
                    await kubelet.wait_registered(GPU, WAIT_S)
                    await kubelet.observer.wait_for(
                        lambda m: len(m.healthy_devices(GPU)) == len(topology.gpus),
                        WAIT_S,
                        "every GPU healthy",
                    )
                    response = await kubelet.devices.allocate(GPU, [topology.gpus[1].uuid])
                # NVIDIA's environment, with NVIDIA's meaning
                assert flags["failOnInitError"] is (env.get("FAIL_ON_INIT_ERROR") != "false")
                assert flags["mpsRoot"] == env.get("MPS_ROOT", DEFAULT_MPS_ROOT)
                specs = [d.host_path for d in response.devices]
                if env.get("PASS_DEVICE_SPECS") == "true":
                    root = env.get("NVIDIA_DRIVER_ROOT", "/").rstrip("/")
                    assert specs and all(p.startswith(f"{root}/dev/nvidia") for p in specs)
                else:
                    assert specs == []
                if env.get("DEVICE_LIST_STRATEGY") == "volume-mounts":
                    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": MOUNT_ROOT}
                    (mount,) = response.mounts
                    assert mount.container_path == f"{MOUNT_ROOT}/{mig[0].parent}:{mig[0].index}"
                else:
                    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": topology.gpus[1].uuid}
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    run(body)


def test_nvidia_device_plugin_help_shows_nvidias_flags() -> None:
    done = subprocess.run(
        [str(BIN / "nvidia-device-plugin"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    for flag, env in (
        ("--mig-strategy", "MIG_STRATEGY"),
        ("--fail-on-init-error", "FAIL_ON_INIT_ERROR"),
        ("--pass-device-specs", "PASS_DEVICE_SPECS"),
        ("--device-list-strategy", "DEVICE_LIST_STRATEGY"),
        ("--device-id-strategy", "DEVICE_ID_STRATEGY"),
        ("--nvidia-driver-root", "NVIDIA_DRIVER_ROOT"),
        ("--config-file", "CONFIG_FILE"),
        ("--mps-root", "MPS_ROOT"),
        ("--kubelet-socket", "KUBELET_SOCKET"),
    ):
        assert flag in text and f"[${env}]" in text, flag
    assert "--resource-name" not in text  # nvplugin's own settings are not NVIDIA's flags


@pytest.mark.parametrize("flag", ["--cdi-disable-hooks", "-cdi-disable-hooks=true"])
def test_cdi_disable_hooks_flag_is_refused_by_name(flag: str) -> None:
    done = subprocess.run(
        [str(BIN / "nvidia-device-plugin"), flag, "--simulate", "dgx-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "error: flag --cdi-disable-hooks='true': " in done.stderr
    assert "does not support generating CDI specs yet" in done.stderr
    assert "No such option" not in done.stderr


def test_go_style_single_dash_flags() -> None:
    """NVIDIA's command reads flags as Go does: ``-fail-on-init-error=false`` and
    ``--fail-on-init-error=false`` are one flag (a DaemonSet's args may use either)."""

    async def body() -> None:
        directory = new_dir()
        command = [str(BIN / "nvidia-device-plugin"), "-device-id-strategy=index"]
        env = {"NVPLUGIN_DEVICE_PLUGIN_DIR": directory}
        try:
            async with kubelet_with(
                directory,
                "-fail-on-init-error=false",
                "--simulate",
                "dgx-1",
                env=env,
                command=command,
            ) as (kubelet, serve):
                await kubelet.wait_registered(GPU, WAIT_S)
                (effective,) = [await serve.wait_log("effective config")]
                flags = effective["config"]["flags"]
                assert flags["failOnInitError"] is False
                assert flags["plugin"]["deviceIDStrategy"] == "index"
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    run(body)


def _may_not_write(directory: str) -> list[str]:
    """A command prefix that runs a program which may not create files in ``directory``, as the
    plugin run as a non-root ``runAsUser`` may not in the kubelet's root-owned directory: as a
    user other than root, the directory made read-only; as root, the directory given to another
    user and the program run without root's capability to write there anyway (setpriv)."""
    if os.geteuid() != 0:
        os.chmod(directory, 0o555)
        return []
    os.chown(directory, 10001, 10001)
    os.chmod(directory, 0o755)
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) drops root's capabilities for this test"
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"]


def test_a_user_that_may_not_use_the_kubelets_directory_exits_2_naming_it() -> None:
    directory = new_dir()
    try:
        prefix = _may_not_write(directory)
        done = subprocess.run(
            [*prefix, str(BIN / "nvidia-device-plugin"), "--simulate", "dgx-1"],
            capture_output=True,
            text=True,
            timeout=60,
            env=plugin_environment({"NVPLUGIN_DEVICE_PLUGIN_DIR": directory}),
        )
        assert done.returncode == 2, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        uid = os.geteuid()
        assert last.startswith(f"error: the plugin runs as uid {uid}"), last
        assert f"which may not create its socket in {directory}" in last
        assert "mode 0755" in last or "mode 0555" in last
        if uid != 0:
            assert "run the plugin as root (the image's default user" in last
        assert "Failed to bind" not in done.stderr and "Traceback" not in done.stderr
    finally:
        os.chmod(directory, 0o755)
        shutil.rmtree(directory, ignore_errors=True)


def test_only_the_xids_chosen_nvidias_way_make_gpus_unhealthy() -> None:
    """NVIDIA's documented DP_DISABLE_HEALTHCHECKS=all + DP_ENABLE_HEALTHCHECKS=<Xids>, against
    scripted Xids on a simulated node: GPU 0 gets Xid 48 (listed), GPU 1 Xid 63 (not listed),
    GPU 2 Xid 13 (listed; ignored by default), GPU 3 Xid 31 (not listed) -- only 0 and 2 turn
    Unhealthy."""
    topology = load_topology("dgx-1")
    uuids = [gpu.uuid for gpu in topology.gpus]
    events = [
        {"after_s": 0.5, "gpu": 1, "xid": 63},
        {"after_s": 0.5, "gpu": 3, "xid": 31},
        {"after_s": 0.6, "gpu": 0, "xid": 48},
        {"after_s": 0.6, "gpu": 2, "xid": 13},
    ]

    async def body() -> None:
        directory, files = new_dir(), new_dir()
        node = node_file(files, "dgx-1", events)
        env = {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "48,13"}
        try:
            async with kubelet_with(directory, "--simulate", node, env=env) as (kubelet, serve):
                await kubelet.wait_registered(GPU, WAIT_S)
                await kubelet.observer.wait_for(
                    lambda m: m.unhealthy_devices(GPU) == {uuids[0], uuids[2]},
                    WAIT_S,
                    "GPUs 0 and 2 Unhealthy",
                )
                await serve.wait_log("gpu unhealthy", where=lambda line: line.get("gpu") == 2)
                xids = [line["xid"] for line in serve.events("gpu unhealthy")]
                assert sorted(xids) == [13, 48]
                assert kubelet.devices.healthy_devices(GPU) == set(uuids) - {uuids[0], uuids[2]}
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            shutil.rmtree(files, ignore_errors=True)

    run(body)


# --- NVIDIA's chart with per-node configs, GFD and MPS, migrated and run as printed ---------------

PER_NODE = "chart-v0.20.0-config-map-gfd-mps.yaml"
NODE = "dgx-a100-9"
LABEL = "nvidia.com/device-plugin.config"


def _printed_migration() -> list[dict[str, Any]]:
    """`nvplugin migrate --daemonset -` on NVIDIA's manifest, fed on standard input: the
    objects it prints (exit 0: nothing refused)."""
    done = subprocess.run(
        [str(BIN / "nvplugin"), "migrate", "--daemonset", "-"],
        input=(FIXTURES / PER_NODE).read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_nvidias_per_node_chart_output_migrated_serves_each_nodes_config() -> None:
    objects = _printed_migration()
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "ServiceAccount",
    ]
    for obj in objects:  # what the API server would take (strict: no unknown field)
        kubernetes_validate.validate(obj, "1.31", strict=True)
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap"]
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    env = {e["name"]: e for e in container["env"]}
    # The pod as printed: the ConfigMap mounted where CONFIG_FILE_SRCDIR says, the node's name
    # from the downward API, the labels' file in a hostPath directory.
    srcdir = env["CONFIG_FILE_SRCDIR"]["value"]
    assert volumes[mounts[srcdir]]["configMap"]["name"] == configmap["metadata"]["name"]
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    output = env["GFD_OUTPUT_FILE"]["value"]
    assert "hostPath" in volumes[mounts[os.path.dirname(output)]]
    assert "CONFIG_FILE" not in env and "shareProcessNamespace" not in pod
    volume = ConfigMapVolume({k: str(v) for k, v in configmap["data"].items()})
    features = new_dir()

    async def body() -> None:
        directory = new_dir()
        async with KubeApiServer() as api:
            api.add_node(NODE, {})
            # Each path of the pod's spec stands for what the kubelet mounts there.
            run_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
            run_env |= {
                "CONFIG_FILE_SRCDIR": volume.path,
                "NODE_NAME": NODE,
                "KUBECONFIG": api.kubeconfig(),
                "GFD_OUTPUT_FILE": os.path.join(features, "gfd"),
                "MPS_ROOT": new_dir(),
                "NVPLUGIN_DEVICE_PLUGIN_DIR": directory,
                "NVPLUGIN_LOG_FORMAT": "json",
                "PATH": f"{BIN}:{os.environ['PATH']}",
            }
            command = container_argv(container)
            args = ("--simulate", "dgx-a100-mig")
            async with kubelet_with(directory, *args, env=run_env, command=command) as (
                kubelet,
                serve,
            ):
                gpus = lambda n: lambda m: m.is_registered(GPU) and len(m.devices(GPU)) == n  # noqa: E731
                # No label: the config named "default" (NVIDIA's named fallback), 8 GPUs.
                await kubelet.observer.wait_for(gpus(8), WAIT_S, "the default config")
                await until(
                    lambda: os.path.exists(run_env["GFD_OUTPUT_FILE"]), "GFD's labels written"
                )
                assert "nvidia.com/gpu.count=8" in Path(run_env["GFD_OUTPUT_FILE"]).read_text()
                # The label names tesla-t4: 4 replicas a GPU.
                api.label(NODE, LABEL, "tesla-t4")
                await kubelet.observer.wait_for(gpus(32), WAIT_S, "tesla-t4's replicas")
                # a100-40gb: MIG mixed.
                api.label(NODE, LABEL, "a100-40gb")
                await kubelet.wait_registered("nvidia.com/mig-1g.5gb", WAIT_S)
                assert serve.process.poll() is None
                assert "Traceback" not in serve.text()

    try:
        run(body, timeout=150)
    finally:
        shutil.rmtree(features, ignore_errors=True)
