"""Per-node configs as a cluster runs them: ``nvplugin serve`` as a real subprocess beside the
fake kubelet, reading its Node's ``nvidia.com/device-plugin.config`` label from a real HTTP API
server (tests/support/kubeapi.py, through the client library) and its configs from a ConfigMap
volume written the kubelet's way (tests/support/configmap.py).

The configs are the GPU Operator's time-slicing recipe: one ConfigMap, a key per GPU type, the
label choosing among them; the A100 key also turns MIG mixed on, so a label change re-serves
different resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from nvplugin.config.select import RECORD_NAME
from nvplugin.fakekubelet.devicemanager import DeviceManager
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.plugin.mps import daemon_pids
from tests.support.configmap import ConfigMapVolume
from tests.support.kubeapi import KubeApiServer
from tests.support.serve import (
    Serve,
    admit,
    kubelet_with,
    new_dir,
    pods_file,
    run_nvplugin,
    run_serve,
    scrape,
)
from tests.support.waiting import WAIT_S, until

NODE = "dgx-a100-7"
LABEL = "nvidia.com/device-plugin.config"
GPU = "nvidia.com/gpu"
MIG_SMALL = "nvidia.com/mig-1g.5gb"
FAILING = "kubernetes api failing (unreachable or refusing); still serving, retrying"

DEFAULT = "version: v1\nflags:\n  migStrategy: none\n"
A100 = "version: v1\nflags:\n  migStrategy: mixed\n"


def t4(replicas: int) -> str:
    return (
        "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


CONFIGS = {"default": DEFAULT, "a100-40gb": A100, "tesla-t4": t4(4)}


def run(body: Callable[[], Awaitable[None]], timeout: float = 150) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


def gpus(count: int) -> Callable[[DeviceManager], bool]:
    """nvidia.com/gpu advertises ``count`` devices (8 GPUs: 8 whole, 32 or 16 replicas; under
    MIG mixed, the 2 GPUs without MIG)."""
    return lambda m: m.is_registered(GPU) and len(m.devices(GPU)) == count


def mig_mixed(m: DeviceManager) -> bool:
    return m.is_registered(MIG_SMALL) and len(m.devices(MIG_SMALL)) == 16 and gpus(2)(m)


def selected(config: str | None, why: str) -> Callable[[dict[str, Any]], bool]:
    return lambda line: line.get("config") == config and line.get("why") == why


@contextlib.asynccontextmanager
async def plugin(
    api: KubeApiServer,
    volume: ConfigMapVolume,
    *extra: str,
    node: str = NODE,
    directory: str | None = None,
) -> AsyncIterator[tuple[FakeKubelet, Serve]]:
    directory = directory or new_dir()
    env = {
        "CONFIG_FILE_SRCDIR": volume.path,
        "NODE_NAME": node,
        "KUBECONFIG": api.kubeconfig(),
        "NVPLUGIN_METRICS_ADDRESS": "127.0.0.1:0",
    }
    args = ("--simulate", "dgx-a100-mig", "--api-backoff-s", "0.05", "0.5", *extra)
    async with kubelet_with(directory, *args, env=env) as (kubelet, serve):
        yield kubelet, serve


def test_follows_the_label_and_the_configmap_and_keeps_the_running_config_on_a_bad_choice() -> None:
    async def body() -> None:
        volume = ConfigMapVolume(CONFIGS)
        async with KubeApiServer() as api:
            api.add_node(NODE, {LABEL: "a100-40gb"})
            async with plugin(api, volume) as (kubelet, serve):
                # The label at start: MIG mixed.
                await kubelet.observer.wait_for(mig_mixed, WAIT_S, "MIG mixed")
                await serve.wait_log("config selected", where=selected("a100-40gb", "label"))
                metrics = await scrape(serve)
                assert 'nvplugin_config_selected{config="a100-40gb",why="label"} 1.0' in metrics

                # The label changes: re-served, MIG resources gone, time-slicing replicas.
                api.label(NODE, LABEL, "tesla-t4")
                await kubelet.observer.wait_for(gpus(32), WAIT_S, "4 replicas per GPU")
                await kubelet.observer.wait_for(
                    lambda m: not m.is_registered(MIG_SMALL), WAIT_S, "MIG unregistered"
                )

                # The ConfigMap's content changes (the kubelet's ..data swap): applied.
                volume.update({**CONFIGS, "tesla-t4": t4(2)})
                await kubelet.observer.wait_for(gpus(16), WAIT_S, "2 replicas per GPU")

                # A label naming no config: rejected, the running config kept.
                api.label(NODE, LABEL, "h100-80gb")
                line = await serve.wait_log(
                    "config choice rejected; keeping the running config",
                    where=lambda line: line.get("reason") == "unknown",
                )
                assert "h100-80gb" in line["error"] and line["running"] == "tesla-t4"

                # The chosen config turns bad: rejected with the file's error, kept.
                volume.update({**CONFIGS, "tesla-t4": t4(0)})
                api.label(NODE, LABEL, "tesla-t4")
                line = await serve.wait_log(
                    "config choice rejected; keeping the running config",
                    where=lambda line: line.get("reason") == "invalid",
                )
                assert "replicas" in line["error"] and "tesla-t4" in line["error"]
                assert gpus(16)(kubelet.devices)
                metrics = await scrape(serve)
                assert 'nvplugin_config_rejected_total{reason="unknown"} 1.0' in metrics
                assert 'nvplugin_config_rejected_total{reason="invalid"} 1.0' in metrics

                # The label removed: the fallback (the config named "default").
                api.label(NODE, LABEL, None)
                await kubelet.observer.wait_for(gpus(8), WAIT_S, "the default config")
                await serve.wait_log("config selected", where=selected("default", "fallback-named"))
                assert serve.process.poll() is None
                assert "Traceback" not in serve.text()

    run(body)


def test_a_first_start_while_the_api_is_down_waits_for_the_label_and_follows_it() -> None:
    async def body() -> None:
        volume = ConfigMapVolume(CONFIGS)
        async with KubeApiServer() as api:
            api.add_node(NODE, {LABEL: "a100-40gb"})
            await api.down()
            async with plugin(api, volume, "--default-config", "tesla-t4") as (kubelet, serve):
                # Down at start, nothing recorded on the node: no config is served until the
                # label is known (DEFAULT_CONFIG would be the wrong one), the outage said.
                await serve.wait_log("waiting for the node's label before serving")
                await serve.wait_log(FAILING)
                assert not kubelet.devices.is_registered(GPU)

                await api.up()
                await kubelet.observer.wait_for(mig_mixed, WAIT_S, "the label's config")
                await serve.wait_log("kubernetes api answering again")
                # The default config (32 replicas) was never advertised.
                assert all(len(s.devices) == 2 for s in kubelet.observer.snapshots(GPU))

                # A dropped watch is resumed (quietly: no outage): the next change arrives.
                await api.wait_for(lambda: api.open_watches == 1)
                outages = len(serve.events(FAILING))
                api.drop_watches()
                api.label(NODE, LABEL, "tesla-t4")
                await kubelet.observer.wait_for(gpus(32), WAIT_S, "the new label's config")
                assert len(serve.events(FAILING)) == outages

                # Down later: serving goes on; the change made meanwhile is seen after.
                outages = len(serve.events(FAILING))
                await api.down()
                api.label(NODE, LABEL, "a100-40gb")
                await until(lambda: len(serve.events(FAILING)) > outages, "the outage")
                assert gpus(32)(kubelet.devices) and serve.process.poll() is None
                await api.up()
                await kubelet.observer.wait_for(mig_mixed, WAIT_S, "the label set meanwhile")

                # History compacted while the watch was away: 410, listed again, followed.
                await api.wait_for(lambda: api.open_watches == 1)
                api.compact()
                api.drop_watches()
                api.label(NODE, LABEL, None)
                await kubelet.observer.wait_for(gpus(32), WAIT_S, "back to the default")
                assert "410" in serve.text() or "listing the node again" in serve.text()
                assert "Traceback" not in serve.text()

    run(body)


def test_a_restart_while_the_api_is_down_serves_the_config_the_label_last_chose() -> None:
    async def body() -> None:
        volume = ConfigMapVolume(CONFIGS)
        directory = new_dir()
        async with KubeApiServer() as api:
            api.add_node(NODE, {LABEL: "tesla-t4"})
            async with plugin(api, volume, directory=directory) as (kubelet, serve):
                await kubelet.observer.wait_for(gpus(32), WAIT_S, "the label's config")
                await serve.wait_log("config selected", where=selected("tesla-t4", "label"))
            record = os.path.join(directory, RECORD_NAME)
            with open(record) as f:
                assert json.load(f) == {"config": "tesla-t4", "why": "label", "label": "tesla-t4"}

            # Restarted while the API is away: the recorded choice at once, not the fallback.
            await api.down()
            async with plugin(api, volume, directory=directory) as (kubelet, serve):
                await kubelet.observer.wait_for(gpus(32), WAIT_S, "the recorded config")
                await serve.wait_log("config selected", where=selected("tesla-t4", "last-chosen"))
                await serve.wait_log(FAILING)
                api.label(NODE, LABEL, "a100-40gb")  # changed meanwhile
                await api.up()
                await kubelet.observer.wait_for(mig_mixed, WAIT_S, "the new label's config")
                assert all(len(s.devices) != 8 for s in kubelet.observer.snapshots(GPU))
            with open(record) as f:
                assert json.load(f)["config"] == "a100-40gb"

            # A record that is not one (here a directory) is ignored: the start waits.
            os.unlink(record)
            os.mkdir(record)
            await api.down()
            async with plugin(api, volume, directory=directory) as (kubelet, serve):
                await serve.wait_log("waiting for the node's label before serving")
                await api.up()
                await kubelet.observer.wait_for(mig_mixed, WAIT_S, "the label's config")
                assert "Traceback" not in serve.text()

    run(body)


def test_no_node_name_turns_the_label_off_once_and_serves_the_default() -> None:
    async def body() -> None:
        volume = ConfigMapVolume(CONFIGS)
        async with KubeApiServer() as api:
            api.add_node(NODE, {LABEL: "a100-40gb"})
            async with plugin(api, volume, node="") as (kubelet, serve):
                await kubelet.observer.wait_for(gpus(8), WAIT_S, "the default config")
                line = await serve.wait_log("per-node config by node label off")
                assert "NODE_NAME" in line["reason"]
                # The directory is still followed.
                volume.update({**CONFIGS, "default": t4(2)})
                await kubelet.observer.wait_for(gpus(16), WAIT_S, "the edited default")
                assert len(serve.events("per-node config by node label off")) == 1
                assert api.requests == []
                # SIGHUP re-reads the chosen file (not a --config-file there is none of).
                serve.send(signal.SIGHUP)
                line = await serve.wait_log("config reloaded")
                assert line["config"]["source"] == f"{volume.path}/default"
                assert gpus(16)(kubelet.devices)

    run(body)


def test_config_file_and_srcdir_together_exit_2() -> None:
    volume = ConfigMapVolume(CONFIGS)
    done = run_serve(
        "--simulate",
        "dgx-a100-mig",
        "--config-file",
        f"{volume.path}/default",
        "--config-file-srcdir",
        volume.path,
    )
    assert done.returncode == 2
    assert "give one" in done.stderr


MIG_POD = """apiVersion: v1
kind: Pod
metadata: {name: inference}
spec:
  containers:
    - name: triton
      image: nvcr.io/nvidia/tritonserver:24.05-py3
      resources:
        limits: {nvidia.com/mig-1g.5gb: 1}
"""


def test_admit_and_devices_answer_for_a_label_before_it_is_set() -> None:
    volume = ConfigMapVolume(CONFIGS)
    srcdir = ("--config-file-srcdir", volume.path)
    pods = pods_file(MIG_POD)
    # The A100 label: MIG mixed, the pod is admitted on a 1g.5gb device.
    a100 = admit(
        "--output",
        "json",
        "--simulate",
        "dgx-a100-mig",
        *srcdir,
        "--node-label-value",
        "a100-40gb",
        pods,
    )
    assert a100.returncode == 0, a100.stderr
    assert "config: a100-40gb (label)" in a100.stderr
    [result] = json.loads(a100.stdout)
    assert result["admitted"], result
    assert len(result["containers"][0]["devices"][MIG_SMALL]) == 1
    # No label: the default (MIG none): no plugin serves the resource, no device given.
    plain = admit("--output", "json", "--simulate", "dgx-a100-mig", *srcdir, pods)
    assert "config: default (fallback-named)" in plain.stderr
    assert json.loads(plain.stdout)[0]["containers"][0]["devices"] == {}
    # devices: which resource each GPU would be; a label naming no config exits 2.
    t4 = run_nvplugin(
        "devices",
        "--simulate",
        "workstation-4gpu",
        *srcdir,
        "--node-label-value",
        "tesla-t4",
        timeout=WAIT_S,
    )
    assert t4.returncode == 0 and "nvidia.com/gpu x4" in t4.stdout
    assert "config: tesla-t4 (label)" in t4.stderr
    bad = run_nvplugin(
        "devices",
        "--simulate",
        "workstation-4gpu",
        *srcdir,
        "--node-label-value",
        "h100",
        timeout=WAIT_S,
    )
    assert bad.returncode == 2
    assert "names no config" in bad.stderr and "tesla-t4" in bad.stderr


def test_an_unlabelled_node_no_config_finds_serves_the_defaults_the_offline_check_predicts() -> (
    None
):
    """The GPU Operator's time-slicing-config-fine shape: a config per GPU model, no default,
    the default fallbacks (named, single) finding none, and a node without the label. The
    offline check says what serve then serves, and serve's log claims no running config."""
    configs = {"a100-40gb": A100, "tesla-t4": t4(4)}
    volume = ConfigMapVolume(configs)
    offline = run_nvplugin(
        "devices", "--simulate", "dgx-a100-mig", "--config-file-srcdir", volume.path, timeout=WAIT_S
    )
    assert offline.returncode == 0, offline.stderr
    assert "config: (no config file) (none)" in offline.stderr
    assert "found none among the configs" in offline.stderr
    assert "serve runs no config file on such a node" in offline.stderr
    predicted = [line for line in offline.stdout.splitlines() if "nvidia.com/" in line]
    assert any("nvidia.com/gpu" in line for line in predicted), offline.stdout

    async def body() -> None:
        async with KubeApiServer() as api:
            api.add_node(NODE, {})
            async with plugin(api, volume) as (kubelet, serve):
                # What devices predicted: the built-in defaults (8 whole GPUs, MIG none).
                await kubelet.observer.wait_for(gpus(8), WAIT_S, "the built-in defaults")
                await serve.wait_log("config selected", where=selected(None, "none"))
                line = await serve.wait_log(
                    "config choice rejected; serving the built-in defaults (no config file)",
                    where=lambda line: line.get("reason") == "no-fallback",
                )
                assert line["running"] is None
                assert "keeping the running config" not in serve.text()
                # A label naming a config later: that config runs.
                api.label(NODE, LABEL, "tesla-t4")
                await kubelet.observer.wait_for(gpus(32), WAIT_S, "the label's config")
                assert serve.process.poll() is None


MPS_SHARED = (
    "version: v1\nflags:\n  migStrategy: none\nsharing:\n  mps:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 2\n"
)


def test_sigterm_during_a_switch_that_stops_an_mps_daemon_is_a_clean_stop() -> None:
    """Before: SIGTERM while a per-node switch stopped an MPS daemon cancelled the
    switch halfway (1 run in 10): exit 1, the daemon left running, compute modes not restored.
    Here the window is held open: the daemon is stopped (SIGSTOP), so its ``quit`` waits for
    its timeout, and SIGTERM comes once the switch has begun. The switch ends, then the plugin."""

    async def body() -> None:
        root = new_dir()
        volume = ConfigMapVolume({"default": DEFAULT, "mps": MPS_SHARED})
        pipe = os.path.join(root, GPU, "pipe")
        async with KubeApiServer() as api:
            api.add_node(NODE, {LABEL: "mps"})
            env = {"CONFIG_FILE_SRCDIR": volume.path, "NODE_NAME": NODE}
            env["KUBECONFIG"] = api.kubeconfig()
            args = ("--simulate", "dgx-1", "--mps-root", root, "--api-backoff-s", "0.05", "0.5")
            directory = new_dir()
            async with FakeKubelet(directory) as kubelet:
                serve = Serve(directory, *args, env=env)
                try:
                    await kubelet.observer.wait_for(gpus(16), WAIT_S, "16 MPS shares")
                    (daemon,) = daemon_pids(pipe)
                    os.kill(daemon, signal.SIGSTOP)  # its quit now waits for the timeout
                    api.label(NODE, LABEL, "default")
                    await serve.wait_log(
                        "config reloaded",
                        where=lambda line: line["config"]["source"].endswith("/default"),
                    )
                    code = serve.stop()
                    assert code == 0, serve.text()
                    assert daemon_pids(pipe) == [], serve.text()
                    restored = serve.events("compute mode restored")
                    assert sorted(line["gpu"] for line in restored) == list(range(8))
                    assert os.listdir(os.path.join(root, "compute-modes")) == []
                finally:
                    for pid in daemon_pids(pipe):
                        os.kill(pid, signal.SIGKILL)
                    serve.stop()

    run(body)


def test_a_flood_of_label_flips_is_logged_a_line_a_second_its_value_shortened() -> None:
    """Before: one log line per label change (about 1,000 a second in a flip flood), each
    with the whole value."""

    async def body() -> None:
        volume = ConfigMapVolume(CONFIGS)
        async with KubeApiServer() as api:
            api.add_node(NODE, {LABEL: "a100-40gb"})
            async with plugin(api, volume) as (kubelet, serve):
                await serve.wait_log("config selected", where=selected("a100-40gb", "label"))
                for flip in range(100):
                    api.label(NODE, LABEL, f"flip-{flip}-" + "x" * 300)
                api.label(NODE, LABEL, "tesla-t4")
                await kubelet.observer.wait_for(gpus(32), WAIT_S, "4 replicas per GPU")
                lines = serve.events("node label")
                assert len(lines) < 50, len(lines)
                assert all(len(line["value"] or "") < 200 for line in lines)

    run(body)
