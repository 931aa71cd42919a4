"""``nvplugin serve`` with resources by model and time-slicing, as a real subprocess against the
fake kubelet: two models on one simulated node -> two resources, two sockets, two registrations;
replicas listed and made Unhealthy together by a scripted Xid; strategies in the responses and
the effective-config log; config errors exit 2 naming the key; and the kubelet's admission
(topology, device and CPU managers, as ``nvplugin admit`` wires them) placing a pod that asks for
``nvidia.com/a100`` on A100s only."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from nvplugin.admit.admission import AdmitSettings, build_managers
from nvplugin.fakekubelet.devicemanager import DevicePluginError
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.fakekubelet.pods import load_pods
from nvplugin.nodesession import load_topology
from nvplugin.rm import replica_id
from tests.support.serve import (
    Serve,
    admit_json,
    kubelet_with,
    new_dir,
    node_file,
    pods_file,
    run_serve,
)
from tests.support.waiting import WAIT_S

NODE = "mixed-a100-t4"
TOPOLOGY = load_topology(NODE)
A100 = [g.uuid for g in TOPOLOGY.gpus if "A100" in g.name]  # GPUs 0, 1, 4, 5
T4 = [g.uuid for g in TOPOLOGY.gpus if "T4" in g.name]  # GPUs 2, 3, 6, 7

TWO_MODELS = """\
version: v1
flags:
  plugin:
    deviceListStrategy: [envvar, cdi-cri]
    deviceIDStrategy: index
resources:
  gpus:
    - {pattern: "*A100*", name: a100}
    - {pattern: "*T4*", name: t4}
    - {pattern: "*H100*", name: h100}
"""

T4_SHARED = """\
version: v1
resources:
  gpus:
    - {pattern: "*A100*", name: a100}
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
      - {name: gpu, replicas: 4, rename: t4-shared}
"""


def run(body: Callable[[], Awaitable[None]], timeout: float = 90) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


def config_file(text: str) -> str:
    path = os.path.join(new_dir(), "nvplugin.yaml")
    Path(path).write_text(text)
    return path


def test_two_models_two_resources_two_sockets_two_registrations() -> None:
    async def body() -> None:
        directory = new_dir()
        async with FakeKubelet(directory) as kubelet:
            serve = Serve(directory, "--simulate", NODE, "--config", config_file(TWO_MODELS))
            try:
                a100 = await kubelet.wait_registered("nvidia.com/a100", WAIT_S)
                t4 = await kubelet.wait_registered("nvidia.com/t4", WAIT_S)
                assert a100 is not t4
                records = sorted(
                    (r.resource_name, r.endpoint) for r in kubelet.observer.registrations
                )
                assert records == [
                    ("nvidia.com/a100", "nvplugin-a100.sock"),
                    ("nvidia.com/t4", "nvplugin-t4.sock"),
                ]
                assert all(r.error is None for r in kubelet.observer.registrations)
                sockets = sorted(n for n in os.listdir(directory) if n.startswith("nvplugin-"))
                assert sockets == ["nvplugin-a100.sock", "nvplugin-t4.sock"]
                devices = kubelet.devices
                obs = kubelet.observer
                await obs.wait_for(
                    lambda m: (
                        len(m.healthy_devices("nvidia.com/t4")) == 4
                        and len(m.healthy_devices("nvidia.com/a100")) == 4
                    ),
                    WAIT_S,
                    "4 T4s and 4 A100s",
                )
                assert devices.healthy_devices("nvidia.com/a100") == frozenset(A100)
                assert devices.healthy_devices("nvidia.com/t4") == frozenset(T4)
                assert not devices.is_registered("nvidia.com/gpu")  # empty: not registered
                assert not devices.is_registered("nvidia.com/h100")
                numa = devices.device_numa("nvidia.com/a100")
                assert {numa[u] for u in A100[:2]} == {(0,)} and numa[A100[2]] == (1,)
                # Preferred allocation inside one resource: the NVLink-bridged A100 pair.
                chosen = await devices.get_preferred_allocation("nvidia.com/a100", A100, [], 2)
                assert chosen is not None and sorted(chosen) == sorted(A100[:2])
                # Allocate answers with the configured strategies and index IDs.
                response = await devices.allocate("nvidia.com/t4", [T4[3], T4[0]])
                assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "2,7"}
                assert [d.name for d in response.cdi_devices] == [
                    "k8s.device-plugin.nvidia.com/gpu=2",
                    "k8s.device-plugin.nvidia.com/gpu=7",
                ]
                # The effective config shows the strategies; the unused pattern warned once.
                (effective,) = serve.events("effective config")
                shown = effective["config"]
                assert shown["flags"]["plugin"]["deviceListStrategy"] == ["envvar", "cdi-cri"]
                assert shown["flags"]["plugin"]["deviceIDStrategy"] == "index"
                assert shown["resources"]["gpus"][0] == {
                    "pattern": "*A100*",
                    "name": "nvidia.com/a100",
                }
                warnings = serve.events("config has no effect on this node")
                assert [w["reason"] for w in warnings] == [
                    "resources.gpus[2].pattern '*H100*' matches no GPU on this node "
                    "(models: NVIDIA A100 80GB PCIe, Tesla T4)"
                ]
                serving = {line["resource"]: line["socket"] for line in serve.events("serving")}
                assert sorted(serving) == ["nvidia.com/a100", "nvidia.com/t4"]
            finally:
                assert serve.stop() == 0
            assert not any(n.startswith("nvplugin-") for n in os.listdir(directory))

    run(body)


def test_time_sliced_replicas_go_unhealthy_together_on_an_xid() -> None:
    async def body() -> None:
        directory = new_dir()
        node = node_file(new_dir(), NODE, [{"after_s": 1.5, "gpu": 6, "xid": 48}])
        plugin_args = ("--simulate", node, "--config", config_file(T4_SHARED))
        async with kubelet_with(directory, *plugin_args) as (kubelet, _):
            await kubelet.wait_registered("nvidia.com/t4-shared", WAIT_S)
            await kubelet.wait_registered("nvidia.com/a100", WAIT_S)
            devices = kubelet.devices
            obs = kubelet.observer
            replicas = [replica_id(u, n) for u in T4 for n in range(4)]
            await obs.wait_for(
                lambda m: len(m.devices("nvidia.com/t4-shared")) == 16, WAIT_S, "16 replicas"
            )
            assert sorted(devices.devices("nvidia.com/t4-shared")) == sorted(replicas)
            numa = devices.device_numa("nvidia.com/t4-shared")
            assert numa[replica_id(T4[2], 3)] == (1,) and numa[replica_id(T4[0], 0)] == (0,)
            # GPU 6 is the third T4: its four replicas, and nothing else, go Unhealthy.
            gpu6 = TOPOLOGY.gpus[6].uuid
            await obs.wait_for(
                lambda m: len(m.unhealthy_devices("nvidia.com/t4-shared")) == 4,
                WAIT_S,
                "the Xid on GPU 6",
            )
            assert devices.unhealthy_devices("nvidia.com/t4-shared") == frozenset(
                replica_id(gpu6, n) for n in range(4)
            )
            assert devices.unhealthy_devices("nvidia.com/a100") == frozenset()
            # Allocate: one replica is fine; two fail with the reason (kubelet's wording).
            response = await devices.allocate("nvidia.com/t4-shared", [replica_id(T4[1], 2)])
            assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": T4[1]}
            with pytest.raises(DevicePluginError) as caught:
                await devices.allocate(
                    "nvidia.com/t4-shared", [replica_id(T4[0], 0), replica_id(T4[1], 0)]
                )
            assert "InvalidArgument" in str(caught.value)
            assert "failRequestsGreaterThanOne" in str(caught.value)

    run(body)


def test_bad_resource_configs_exit_2_naming_the_key() -> None:
    directory = new_dir()
    collision = config_file(
        "version: v1\nresources:\n  gpus:\n    - {pattern: '*T4*', name: t4}\n"
        "sharing:\n  timeSlicing:\n    resources:\n      - {name: gpu, replicas: 2, rename: t4}\n"
    )
    result = run_serve("--simulate", NODE, "--device-plugin-dir", directory, "--config", collision)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f'error: config file {collision}: key "sharing.timeSlicing.resources[0].rename": '
        "nvidia.com/t4 collides with the resource from resources.gpus[0].name"
    )
    result = run_serve(
        "--simulate", NODE, "--device-plugin-dir", directory, "--device-list-strategy", "env"
    )
    assert result.returncode == 2
    assert "--device-list-strategy" in result.stderr and "'env'" in result.stderr
    assert os.listdir(directory) == []


PODS = """\
apiVersion: v1
kind: Pod
metadata: {name: trainer}
spec:
  containers:
    - name: main
      image: example/train
      resources:
        limits: {nvidia.com/a100: 2}
---
apiVersion: v1
kind: Pod
metadata: {name: inference}
spec:
  containers:
    - name: main
      image: example/infer
      resources:
        limits: {nvidia.com/t4: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: greedy}
spec:
  containers:
    - name: main
      image: example/train
      resources:
        limits: {nvidia.com/a100: 3}
"""


def test_kubelet_admission_places_an_a100_pod_on_a100s_only() -> None:
    """The admission pipeline of ``nvplugin admit`` (its managers, the fake kubelet and the real
    plugin process), with the plugin serving two resources by model."""

    async def body() -> None:
        directory = new_dir()
        settings = AdmitSettings(simulate=NODE, topology_manager_policy="single-numa-node")
        manager, devices, _ = build_managers(settings, TOPOLOGY, directory)
        active: set[str] = set()
        devices.active_pods = lambda: set(active)
        async with FakeKubelet(directory, devices=devices) as kubelet:
            serve = Serve(directory, "--simulate", NODE, "--config", config_file(TWO_MODELS))
            try:
                await kubelet.wait_registered("nvidia.com/a100", WAIT_S)
                await kubelet.wait_registered("nvidia.com/t4", WAIT_S)
                await kubelet.observer.wait_for(
                    lambda m: (
                        len(m.healthy_devices("nvidia.com/t4")) == 4
                        and len(m.healthy_devices("nvidia.com/a100")) == 4
                    ),
                    WAIT_S,
                    "4 T4s and 4 A100s",
                )
                trainer, inference, greedy = load_pods(PODS)
                results = {}
                for pod in (trainer, inference, greedy):
                    active.add(pod.uid)
                    results[pod.name] = await asyncio.to_thread(manager.admit, pod)
                    if not results[pod.name].admit:
                        active.discard(pod.uid)
                assert results["trainer"].admit and results["inference"].admit
                got = devices.pod_devices(trainer.uid, "nvidia.com/a100")
                assert len(got) == 2 and got <= frozenset(A100)
                # One NUMA node (single-numa-node), and there the NVLink-bridged pair.
                assert sorted(got) in (sorted(A100[:2]), sorted(A100[2:]))
                assert devices.pod_devices(trainer.uid, "nvidia.com/t4") == frozenset()
                assert len(devices.pod_devices(inference.uid, "nvidia.com/t4")) == 1
                assert devices.pod_devices(inference.uid, "nvidia.com/t4") <= frozenset(T4)
                # Three A100s fit on no NUMA node (two per node): rejected, not put on T4s.
                assert not results["greedy"].admit
                assert devices.pod_devices(greedy.uid, "nvidia.com/a100") == frozenset()
            finally:
                assert serve.stop() == 0

    run(body)


def test_sighup_splits_and_joins_resources() -> None:
    async def body() -> None:
        directory = new_dir()
        config = config_file("version: v1\n")
        plugin_args = ("--simulate", NODE, "--config", config)
        async with kubelet_with(directory, *plugin_args) as (kubelet, serve):
            await kubelet.wait_registered("nvidia.com/gpu", WAIT_S)
            Path(config).write_text(T4_SHARED)
            serve.send(signal.SIGHUP)
            await kubelet.observer.wait_for(
                lambda m: (
                    len(m.healthy_devices("nvidia.com/a100")) == 4
                    and len(m.healthy_devices("nvidia.com/t4-shared")) == 16
                ),
                WAIT_S,
                "a100 and t4-shared after SIGHUP",
            )
            sockets = sorted(n for n in os.listdir(directory) if n.startswith("nvplugin-"))
            assert sockets == ["nvplugin-a100.sock", "nvplugin-t4-shared.sock"]
            Path(config).write_text("version: v1\n")
            serve.send(signal.SIGHUP)
            await kubelet.observer.wait_for(
                lambda m: (
                    m.healthy_devices("nvidia.com/gpu") == frozenset(A100 + T4)
                    and not os.path.exists(os.path.join(directory, "nvplugin-a100.sock"))
                ),
                WAIT_S,
                "one resource again",
            )
            sockets = sorted(n for n in os.listdir(directory) if n.startswith("nvplugin-"))
            assert sockets == ["nvplugin-gpu.sock"]

    run(body)


def test_nvplugin_admit_places_an_a100_pod_on_a100s_only() -> None:
    """The same story through the command users run: ``nvplugin admit --config``."""
    flags = ("--simulate", NODE, "--config", config_file(TWO_MODELS))
    policy = ("--topology-manager-policy", "single-numa-node")
    results = {r["pod"]: r for r in admit_json(*flags, *policy, pods_file(PODS))}
    a100_indices = {g.index for g in TOPOLOGY.gpus if "A100" in g.name}
    t4_indices = {g.index for g in TOPOLOGY.gpus if "T4" in g.name}
    [trainer] = results["trainer"]["containers"]
    assert results["trainer"]["admitted"] is True
    assert set(trainer["devices"]) == {"nvidia.com/a100"}
    assert trainer["gpu_indices"] in ([0, 1], [4, 5])  # one NUMA node, NVLink-bridged pair
    assert set(trainer["gpu_indices"]) <= a100_indices
    uuids = [TOPOLOGY.gpus[i].uuid for i in trainer["gpu_indices"]]
    assert trainer["devices"]["nvidia.com/a100"] == uuids
    [inference] = results["inference"]["containers"]
    assert results["inference"]["admitted"] is True
    assert set(inference["gpu_indices"]) <= t4_indices and len(inference["gpu_indices"]) == 1
    assert results["greedy"]["admitted"] is False
    assert results["greedy"]["reason"] == "TopologyAffinityError"


def test_nvplugin_admit_with_time_sliced_replicas() -> None:
    pod = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: share}\nspec:\n  containers:\n"
        "    - name: main\n      resources:\n        limits: {nvidia.com/t4-shared: 1}\n"
    )
    [result] = admit_json("--simulate", NODE, "--config", config_file(T4_SHARED), pods_file(pod))
    [container] = result["containers"]
    assert result["admitted"] is True
    [replica] = container["devices"]["nvidia.com/t4-shared"]
    uuid, _, number = replica.partition("::")
    gpu = TOPOLOGY.gpu_by_uuid(uuid)
    assert gpu is not None and "T4" in gpu.name and number.isdigit()
    assert container["gpu_indices"] == [gpu.index]
