"""The chart's output runs a real plugin: the rendered args, environment and ConfigMap file start
``nvplugin serve`` (a real process on a simulated node), which registers with the fake kubelet, and
the rendered probes (the kubelet's httpGet) pass against the health endpoint the chart asks for.

Only the host paths change: the kubelet's directory becomes a temporary one, and the ConfigMap's
file is written where the args point at.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.plugin.mps import daemon_pids
from tests.support.configmap import ConfigMapVolume
from tests.support.helm import Rendered, render
from tests.support.kubeapi import KubeApiServer
from tests.support.labelcases import read_fixture
from tests.support.waiting import until

pytestmark = pytest.mark.process  # runs nvplugin commands as processes

POD_DIR = "/var/lib/kubelet/device-plugins"
POD_CONFIGS = "/etc/nvplugin"
RESOURCE = "example.com/a100"
VALUES = {
    "simulate": "dgx-a100",
    "resourceName": RESOURCE,
    "allocationPolicy": "simple",
    "log": {"format": "json", "level": "debug"},
    "failOnInitError": True,
    "deviceIDStrategy": "index",
    "config": {
        "map": {
            "default": (
                "version: v1\nnvplugin:\n  preStartRequired: true\n  health:\n"
                "    xids: {ignore: [79]}\n    recovery: {quietPeriod: 30s}\n"
            )
        }
    },
    "metrics": {"enabled": True, "port": 9400},
}


@pytest.fixture
def dirs() -> Iterator[tuple[str, Path]]:
    plugin_dir = tempfile.mkdtemp(prefix="nvp-dp-")
    work = Path(tempfile.mkdtemp(prefix="nvp-chart-"))
    yield plugin_dir, work
    shutil.rmtree(plugin_dir, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


@contextlib.asynccontextmanager
async def _plugin(args: list[str], env: dict[str, str], log_path: Path) -> AsyncIterator[None]:
    """``nvplugin ARGS`` running with its output in ``log_path``; on leaving, SIGTERM, and it
    must exit 0 (within 20 s, else it is killed and the test fails)."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nvplugin", *args], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(proc.wait, 20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    assert code == 0, log_path.read_text()


def _on_host(words: list[str], plugin_dir: str) -> list[str]:
    """The pod's paths replaced by this test's."""
    return [word.replace(POD_DIR, plugin_dir) for word in words]


def _on_this_host(
    rendered: Rendered, plugin_dir: str, work: Path
) -> tuple[list[str], dict[str, str], Path]:
    """The rendered pod's plugin as this test runs it: its ConfigMap as the kubelet mounts it
    (every key a file, ``work/configs``); the pod's paths replaced by the test's (args, the
    config directory); the node name the downward API gives; nothing but what the chart sets
    reaching the plugin's NVPLUGIN_ reader, and the health endpoint on loopback (env); where its
    output goes (``work/serve.log``). No API server here: the plugin runs the default config
    (tests/e2e/test_pernode.py follows labels)."""
    volume = ConfigMapVolume(rendered.one("ConfigMap")["data"], str(work / "configs"))
    args = _on_host(rendered.container["args"], plugin_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")} | rendered.env
    assert env["CONFIG_FILE_SRCDIR"] == POD_CONFIGS
    env["CONFIG_FILE_SRCDIR"] = volume.path
    assert rendered.env_fields == {"NODE_NAME": "spec.nodeName"}
    env["NODE_NAME"] = "gpu-node-1"
    _on_loopback(rendered, env)
    return args, env, work / "serve.log"


def test_rendered_chart_starts_a_plugin_that_registers_and_passes_its_probe(
    dirs: tuple[str, Path],
) -> None:
    plugin_dir, work = dirs
    rendered = render(VALUES)
    args, env, log_path = _on_this_host(rendered, plugin_dir, work)
    assert args[:1] == ["serve"] and args[-2:] == ["--simulate", "dgx-a100"]
    # The pod's 0.0.0.0:9400 is its own network namespace; here: loopback, a port the OS picks.
    assert env["NVPLUGIN_METRICS_ADDRESS"] == "0.0.0.0:9400"
    env["NVPLUGIN_METRICS_ADDRESS"] = "127.0.0.1:0"
    asyncio.run(_scenario(rendered, args, env, plugin_dir, work / "configs" / "default", log_path))


async def _scenario(
    rendered: Rendered,
    args: list[str],
    env: dict[str, str],
    plugin_dir: str,
    config: Path,
    log_path: Path,
) -> None:
    async with FakeKubelet(plugin_dir) as kubelet:
        async with _plugin(args, env, log_path):
            try:
                await kubelet.wait_registered(RESOURCE, timeout=60)
                await kubelet.observer.wait_for(
                    lambda m: len(m.healthy_devices(RESOURCE)) == 8, 30, "8 healthy GPUs"
                )
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\nplugin output:\n{log_path.read_text()}") from None
            await _plugin_registered(log_path, 1)
            record = kubelet.observer.registrations[-1]
            assert record.error is None
            assert record.endpoint == "nvplugin-a100.sock"
            # preStartRequired came from values.config.map, through the ConfigMap file.
            options = kubelet.devices.options(RESOURCE)
            assert options is not None and options.pre_start_required is True

            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                status, body = await _kubelet_probe(rendered, kind, log_path)
                assert status == 200, body
                assert (
                    f"{RESOURCE}: SERVING: registered with the kubelet, 8 of 8 GPUs healthy" in body
                )
            assert _metric_lines(
                log_path, 'nvplugin_registrations_total{resource="example.com/a100"}'
            )
        assert not os.path.exists(os.path.join(plugin_dir, "nvplugin-a100.sock"))
    # The plugin's own account of what it was told (one JSON line: log.format came from the env).
    effective = _effective_config(log_path)
    assert effective["source"] == str(config)
    ours = effective["nvplugin"]
    assert ours["resourceName"] == RESOURCE
    assert ours["allocationPolicy"] == "simple"
    assert ours["devicePluginDir"] == plugin_dir
    assert ours["log"] == {"format": "json", "level": "debug"}
    assert ours["health"]["xids"]["ignore"] == [79]
    assert ours["health"]["recovery"]["quietPeriod"] == "30s"
    assert effective["flags"]["plugin"]["deviceIDStrategy"] == "index"  # NVIDIA's value, env


def _on_loopback(rendered: Rendered, env: dict[str, str]) -> None:
    """The health endpoint on loopback, a port the OS picks (the pod's 0.0.0.0:<port> is its own
    network namespace), after checking that the env and the container port agree."""
    ports = {p["name"]: p["containerPort"] for p in rendered.container["ports"]}
    assert env["NVPLUGIN_HEALTH_PROBE_ADDRESS"] == f"0.0.0.0:{ports['health']}"
    env["NVPLUGIN_HEALTH_PROBE_ADDRESS"] = "127.0.0.1:0"


async def _kubelet_probe(rendered: Rendered, kind: str, log_path: Path) -> tuple[int, str]:
    """What the kubelet's httpGet probe ``kind`` gets: status and body of the rendered path on
    the rendered port (here: the port the plugin bound, from its log)."""
    spec = rendered.container[kind]
    assert spec["httpGet"]["port"] == "health"
    port = _logged_port(log_path, "serving health probes")
    url = f"http://127.0.0.1:{port}{spec['httpGet']['path']}"

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=spec["timeoutSeconds"]) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    return await asyncio.to_thread(get)


def _stale_socket(path: str) -> None:
    """A socket file nobody listens on, as a killed plugin leaves behind."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()


SPLIT_VALUES = {
    "simulate": "mixed-a100-t4",
    "log": {"format": "json"},
    "config": {
        "map": {
            "split": {
                "resources": {"gpus": [{"pattern": "*A100*", "name": "a100"}]},
                "sharing": {
                    "timeSlicing": {
                        "renameByDefault": True,
                        "resources": [{"name": "gpu", "replicas": 2}],
                    }
                },
            }
        }
    },
}


def test_probes_pass_when_the_config_renames_the_plugin_sockets(
    dirs: tuple[str, Path],
) -> None:
    """Resources by model and time-slicing change the socket names (here nvplugin-a100.sock and
    nvplugin-gpu.shared.sock; no nvplugin-gpu.sock): the probes ask the plugin, not a socket,
    so they pass, and /readyz names both resources."""
    plugin_dir, work = dirs
    rendered = render(SPLIT_VALUES)
    args, env, log_path = _on_this_host(rendered, plugin_dir, work)

    async def scenario() -> None:
        async with FakeKubelet(plugin_dir) as kubelet, _plugin(args, env, log_path):
            try:
                for resource in ("nvidia.com/a100", "nvidia.com/gpu.shared"):
                    await kubelet.wait_registered(resource, timeout=60)
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{log_path.read_text()}") from None
            await _plugin_registered(log_path, 2)
            sockets = sorted(n for n in os.listdir(plugin_dir) if n.startswith("nvplugin-"))
            assert sockets == ["nvplugin-a100.sock", "nvplugin-gpu.shared.sock"]
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                status, body = await _kubelet_probe(rendered, kind, log_path)
                assert status == 200, body
                assert "nvidia.com/a100: SERVING" in body
                assert "nvidia.com/gpu.shared: SERVING" in body

    asyncio.run(scenario())


def test_the_rendered_mps_pod_serves_mps_shares(dirs: tuple[str, Path]) -> None:
    """The GPU Operator's MPS config through the chart: the rendered pod's plugin starts its MPS
    control daemon under the rendered MPS_ROOT (here a scratch directory, the pod's /mps being
    absent on this host) and advertises the shares once it answers. Stopped, it leaves the daemon
    running (here it is not its PID namespace's init, as it is in the pod:
    tests/e2e/test_mps.py shows that case), and ``nvplugin mps stop`` with the pod's environment
    stops it."""
    plugin_dir, work = dirs
    mps_root = str(work / "mps")
    values = {
        "simulate": "dgx-a100",
        "log": {"format": "json"},
        "mps": {"root": mps_root},
        "config": {
            "map": {
                "any": "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n"
                "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
            }
        },
    }
    rendered = render(values)
    args, env, log_path = _on_this_host(rendered, plugin_dir, work)
    assert env["MPS_ROOT"] == mps_root

    async def scenario() -> None:
        async with FakeKubelet(plugin_dir) as kubelet, _plugin(args, env, log_path):
            try:
                await kubelet.wait_registered("nvidia.com/gpu.shared", timeout=60)
                await kubelet.observer.wait_for(
                    lambda m: len(m.healthy_devices("nvidia.com/gpu.shared")) == 32, 30, "32"
                )
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{log_path.read_text()}") from None
            (ready,) = _logged(log_path, "MPS control daemon ready")
            assert ready["pipe_dir"] == f"{mps_root}/nvidia.com/gpu.shared/pipe"
        pipe = f"{mps_root}/nvidia.com/gpu.shared/pipe"
        try:
            (left,) = _logged(log_path, "MPS control daemon left running")
            assert daemon_pids(pipe) == [left["pid"]]
            stop = [sys.executable, "-m", "nvplugin", "mps", "stop", "--simulate", "dgx-a100"]
            done = subprocess.run(stop, env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert done.stdout == (
                f"MPS root {mps_root}: 1 control daemon(s) stopped, compute mode restored on 8 "
                "GPU(s)\n"
            )
            assert daemon_pids(pipe) == []
        finally:
            for pid in daemon_pids(pipe):
                os.kill(pid, signal.SIGKILL)

    asyncio.run(scenario())


def _logged(log_path: Path, event: str) -> list[dict[str, Any]]:
    """The plugin's JSON log lines ``event`` so far."""
    found = []
    for line in log_path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("event") == event:
                found.append(record)
    return found


async def _plugin_registered(log_path: Path, endpoints: int) -> None:
    """Wait until the plugin says each of its ``endpoints`` is registered. The fake kubelet
    records a registration when the Register RPC arrives; the plugin counts itself registered
    (and its readiness probe says SERVING) once the reply is back, a moment later."""
    await until(
        lambda: (
            len({r["endpoint"] for r in _logged(log_path, "registered with kubelet")}) >= endpoints
        ),
        f"{endpoints} 'registered with kubelet' log lines",
    )


def _logged_port(log_path: Path, event: str) -> int:
    """The port in the plugin's log line ``event`` (``serving metrics``, ...)."""
    for record in _logged(log_path, event):
        return int(record["port"])
    raise AssertionError(f"no {event!r} line in:\n{log_path.read_text()}")


def _metric_lines(log_path: Path, prefix: str) -> list[str]:
    """Lines of the plugin's /metrics starting with ``prefix`` (the port is in its log)."""
    port = _logged_port(log_path, "serving metrics")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [line for line in text.splitlines() if line.startswith(prefix)]


def _effective_config(log_path: Path) -> dict[str, Any]:
    for record in _logged(log_path, "effective config"):
        config: dict[str, Any] = record["config"]
        return config
    raise AssertionError(f"no 'effective config' log line in:\n{log_path.read_text()}")


MIG_VALUES = {
    "simulate": "dgx-a100-mig",
    "log": {"format": "json"},
    "migStrategy": "mixed",
    "config": {
        "map": {
            "mig": {
                "resources": {"mig": [{"pattern": "1g.5gb", "name": "mig-small"}]},
                "sharing": {"timeSlicing": {"resources": [{"name": "mig-2g.10gb", "replicas": 2}]}},
            }
        }
    },
}


def test_the_charts_mig_strategy_reaches_the_plugin(dirs: tuple[str, Path]) -> None:
    """``migStrategy: mixed`` (NVIDIA's value, MIG_STRATEGY) with ``resources.mig`` and time-
    slicing of a MIG resource in ``config.map``: the plugin serves one resource per profile."""
    plugin_dir, work = dirs
    rendered = render(MIG_VALUES)
    assert rendered.env["MIG_STRATEGY"] == "mixed"
    args, env, log_path = _on_this_host(rendered, plugin_dir, work)
    counts = {
        "nvidia.com/mig-small": 16,  # renamed 1g.5gb (not 1g.5gb+me: patterns match whole names)
        "nvidia.com/mig-2g.10gb": 6,  # 3 devices x 2 replicas
        "nvidia.com/mig-3g.20gb": 3,
        "nvidia.com/mig-1g.10gb": 1,
        "nvidia.com/mig-1g.5gb.me": 1,
        "nvidia.com/gpu": 2,
    }

    async def scenario() -> None:
        async with FakeKubelet(plugin_dir) as kubelet, _plugin(args, env, log_path):
            try:
                await kubelet.observer.wait_for(
                    lambda m: all(
                        m.is_registered(name) and len(m.devices(name)) == count
                        for name, count in counts.items()
                    ),
                    60,
                    "the MIG resources",
                )
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{log_path.read_text()}") from None
            await _plugin_registered(log_path, len(counts))
            status, body = await _kubelet_probe(rendered, "readinessProbe", log_path)
            assert status == 200, body
            assert all(f"{name}: SERVING" in body for name in counts)

    asyncio.run(scenario())
    assert _effective_config(log_path)["flags"]["migStrategy"] == "mixed"


def test_gfd_enabled_makes_the_plugin_pod_label_its_node(dirs: tuple[str, Path]) -> None:
    """NVIDIA's ``gfd.enabled``: the rendered pod's plugin writes GPU Feature Discovery's labels
    into the host directory the chart mounts (here: a temporary one), the same labels
    ``nvplugin labels`` prints, and removes them when it stops."""
    plugin_dir, work = dirs
    rendered = render({"simulate": "dgx-a100", "gfd": {"enabled": True, "noTimestamp": True}})
    mount = next(m for m in rendered.container["volumeMounts"] if m["name"] == "node-features")
    host = work / "features.d"
    host.mkdir()
    args = _on_host(rendered.container["args"], plugin_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")} | rendered.env
    _on_loopback(rendered, env)
    log_path = work / "serve.log"
    pod_file = env["GFD_OUTPUT_FILE"]
    assert os.path.dirname(pod_file) == mount["mountPath"]
    env["GFD_OUTPUT_FILE"] = str(host / os.path.basename(pod_file))
    labels_file = Path(env["GFD_OUTPUT_FILE"])

    async def scenario() -> None:
        async with FakeKubelet(plugin_dir) as kubelet, _plugin(args, env, log_path):
            try:
                await kubelet.wait_registered("nvidia.com/gpu", timeout=60)
                await until(labels_file.exists, "the feature file")
            except (TimeoutError, AssertionError) as exc:
                raise AssertionError(f"{exc}\n{log_path.read_text()}") from None
            text = labels_file.read_text()
            assert dict(line.split("=", 1) for line in text.splitlines()) == read_fixture(
                "dgx-a100"
            )
        assert not labels_file.exists()

    asyncio.run(scenario())


def test_gfd_with_the_nodefeature_api_makes_the_pod_publish_its_nodes_object(
    dirs: tuple[str, Path],
) -> None:
    """gfd.enabled with nfd.enableNodeFeatureApi: the rendered pod's plugin, with the downward
    API's values the kubelet would give (node, namespace, pod name) and a kubeconfig for the test
    API server in place of the service account's token, publishes the node's NodeFeature object,
    owned by the pod, with the labels ``nvplugin labels`` prints."""
    plugin_dir, work = dirs
    values = {"simulate": "dgx-a100", "gfd": {"enabled": True, "noTimestamp": True}}
    rendered = render({**values, "nfd": {"enableNodeFeatureApi": True}})
    args = _on_host(rendered.container["args"], plugin_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")} | rendered.env
    _on_loopback(rendered, env)
    downward = {"spec.nodeName": "gpu-node-1", "metadata.namespace": "kube-system"}
    downward["metadata.name"] = "nvplugin-x7k2p"
    for name, field in rendered.env_fields.items():
        env[name] = downward[field]
    log_path = work / "serve.log"

    async def scenario() -> None:
        async with KubeApiServer() as api:
            uid = api.add_pod("kube-system", "nvplugin-x7k2p")
            env["KUBECONFIG"] = api.kubeconfig(str(work))
            key = ("kube-system", "nvidia-features-for-gpu-node-1")
            async with FakeKubelet(plugin_dir) as kubelet, _plugin(args, env, log_path):
                try:
                    await kubelet.wait_registered("nvidia.com/gpu", timeout=60)
                    await api.wait_for(lambda: key in api.nodefeatures)
                except (TimeoutError, AssertionError) as exc:
                    raise AssertionError(f"{exc}\n{log_path.read_text()}") from None
                obj = api.nodefeatures[key]
                assert obj["spec"]["labels"] == read_fixture("dgx-a100")
                assert obj["metadata"]["ownerReferences"][0]["uid"] == uid

    asyncio.run(scenario())
