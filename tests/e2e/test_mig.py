"""MIG as a user meets it: ``nvplugin serve --mig-strategy ...`` as a real subprocess on the
simulated dgx-a100-mig (MIG devices of several profiles, a GPU with MIG on but no instances, two
GPUs with MIG off) against the fake kubelet, over real sockets -- the resources each strategy
registers with their device counts and NUMA nodes, Allocate with MIG UUIDs and the caps device
nodes, GetPreferredAllocation on one parent, an Xid on a parent turning all of its MIG devices
Unhealthy on every stream; ``single`` refusing a mixed layout; and ``nvplugin admit`` placing MIG
pods under single-numa-node."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from nvplugin.node.mig import caps_device
from nvplugin.nodesession import load_topology
from tests.support.migplans import HOMOGENEOUS
from tests.support.serve import (
    admit_json,
    kubelet_with,
    new_dir,
    node_file,
    remove_dir,
    run_nvplugin,
    run_serve,
)

NODE = "dgx-a100-mig"
TOPOLOGY = load_topology(NODE)
MIXED = {  # resource -> (device count, {NUMA node: count})
    "nvidia.com/mig-1g.5gb": (16, {3: 14, 1: 2}),
    "nvidia.com/mig-3g.20gb": (3, {1: 3}),
    "nvidia.com/mig-2g.10gb": (3, {1: 1, 7: 2}),
    "nvidia.com/mig-1g.10gb": (1, {7: 1}),
    "nvidia.com/mig-1g.5gb.me": (1, {7: 1}),
    "nvidia.com/gpu": (2, {5: 2}),
}
GPU2 = {m.uuid for m in TOPOLOGY.gpus[2].mig_devices}  # 3g.20gb, 2g.10gb, 1g.5gb x2


def run(body: Callable[[], Awaitable[None]], timeout: float = 90) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


def test_mixed_registers_each_profile_allocates_prefers_and_follows_the_parents_health() -> None:
    async def body() -> None:
        directory, work = new_dir(), new_dir()
        dev_root = Path(work, "host")
        (dev_root / "dev").mkdir(parents=True)
        (dev_root / "dev" / "nvidiactl").touch()
        node = node_file(work, NODE, [{"after_s": 2.0, "gpu": 2, "xid": 48}])
        try:
            async with kubelet_with(
                directory,
                *("--simulate", node, "--mig-strategy", "mixed"),
                *("--device-list-strategy", "envvar,cdi-cri"),
                *("--pass-device-specs", "--nvidia-dev-root", str(dev_root)),
            ) as (kubelet, serve):
                devices = kubelet.devices
                obs = kubelet.observer
                await obs.wait_for(
                    lambda m: all(
                        m.is_registered(name) and len(m.devices(name)) == count
                        for name, (count, _) in MIXED.items()
                    ),
                    30,
                    "every MIG resource and nvidia.com/gpu",
                )
                for name, (_, numa) in MIXED.items():
                    seen: dict[int, int] = {}
                    for nodes in devices.device_numa(name).values():
                        seen[nodes[0]] = seen.get(nodes[0], 0) + 1
                    assert seen == numa, name
                sockets = sorted(n for n in os.listdir(directory) if n.startswith("nvplugin-"))
                assert "nvplugin-mig-1g.5gb.me.sock" in sockets and len(sockets) == 6
                assert set(devices.devices("nvidia.com/gpu")) == {
                    TOPOLOGY.gpus[6].uuid,
                    TOPOLOGY.gpus[7].uuid,
                }

                # Allocate: the MIG UUID, and the parent's node plus both caps nodes.
                medium = TOPOLOGY.gpus[3].mig_devices[1]  # 3:1, a 3g.20gb
                response = await devices.allocate("nvidia.com/mig-3g.20gb", [medium.uuid])
                assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": medium.uuid}
                assert [d.name for d in response.cdi_devices] == [
                    f"k8s.device-plugin.nvidia.com/gpu={medium.uuid}"
                ]
                assert medium.caps is not None
                assert [d.container_path for d in response.devices] == [
                    "/dev/nvidia3",
                    caps_device(medium.caps.gpu_instance),
                    caps_device(medium.caps.compute_instance),
                    "/dev/nvidiactl",
                ]
                assert response.devices[1].host_path == str(
                    dev_root / caps_device(medium.caps.gpu_instance).lstrip("/")
                )

                # GetPreferredAllocation of 2 among every 1g.5gb: two of one parent.
                small = sorted(devices.devices("nvidia.com/mig-1g.5gb"))
                chosen = await devices.get_preferred_allocation(
                    "nvidia.com/mig-1g.5gb", small, [], 2
                )
                assert chosen is not None and len(chosen) == 2
                parents = {TOPOLOGY.owner(i)[0].index for i in chosen}
                assert len(parents) == 1

                # The scripted Xid 48 on GPU 2: its four MIG devices, in three resources,
                # turn Unhealthy on each resource's stream; nothing else does.
                await obs.wait_for(
                    lambda m: {d for name in MIXED for d in m.unhealthy_devices(name)} == GPU2,
                    20,
                    "GPU 2's MIG devices Unhealthy",
                )
                for name in ("nvidia.com/mig-3g.20gb", "nvidia.com/mig-2g.10gb"):
                    assert len(devices.unhealthy_devices(name)) == 1
                assert len(devices.unhealthy_devices("nvidia.com/mig-1g.5gb")) == 2
                assert len(devices.healthy_devices("nvidia.com/mig-1g.5gb")) == 14
                changes = serve.events("device health changed")
                assert sorted(line["resource"] for line in changes) == [
                    "nvidia.com/mig-1g.5gb",
                    "nvidia.com/mig-2g.10gb",
                    "nvidia.com/mig-3g.20gb",
                ]
        finally:
            remove_dir(directory)
            shutil.rmtree(work, ignore_errors=True)

    run(body)


def test_single_serves_a_homogeneous_node_and_refuses_a_mixed_one_none_serves_whole() -> None:
    async def body() -> None:
        directory, work = new_dir(), new_dir()
        node = os.path.join(work, "a100-3g.yaml")
        Path(node).write_text(HOMOGENEOUS)
        try:
            single = ("--simulate", node, "--mig-strategy", "single")
            async with kubelet_with(directory, *single) as (kubelet, _):
                await kubelet.observer.wait_for(
                    lambda m: len(m.healthy_devices("nvidia.com/gpu")) == 4,
                    30,
                    "four 3g.20gb MIG devices as nvidia.com/gpu",
                )
                ids = kubelet.devices.healthy_devices("nvidia.com/gpu")
                assert all(i.startswith("MIG-") for i in ids)
                numa = kubelet.devices.device_numa("nvidia.com/gpu")
                assert sorted(nodes[0] for nodes in numa.values()) == [0, 0, 1, 1]
            none = ("--simulate", NODE, "--mig-strategy", "none")
            async with kubelet_with(directory, *none) as (kubelet, serve):
                await kubelet.observer.wait_for(
                    lambda m: len(m.healthy_devices("nvidia.com/gpu")) == 8,
                    30,
                    "eight whole GPUs",
                )
                assert kubelet.devices.healthy_devices("nvidia.com/gpu") == {
                    g.uuid for g in TOPOLOGY.gpus
                }
                warned = serve.events("config has no effect on this node")
                assert len(warned) == 6  # each MIG-enabled GPU
        finally:
            remove_dir(directory)
            shutil.rmtree(work, ignore_errors=True)

    run(body)
    directory = new_dir()
    try:
        result = run_serve(
            "--simulate", NODE, "--mig-strategy", "single", "--device-plugin-dir", directory
        )
        assert result.returncode == 2
        last = result.stderr.splitlines()[-1]  # after the effective config's log line
        assert last.startswith("error: migStrategy single needs every GPU in MIG mode")
        assert "GPU 5: MIG on, no MIG devices; GPU 6-7: MIG off" in last
        assert os.listdir(directory) == []
    finally:
        remove_dir(directory)


def test_nvplugin_admit_places_mig_pods_under_single_numa_node() -> None:
    samples = Path(__file__).resolve().parents[2] / "nvplugin" / "fakekubelet" / "samples"
    results = {
        r["pod"]: r
        for r in admit_json(
            *("--simulate", NODE, "--mig-strategy", "mixed"),
            *("--topology-manager-policy", "single-numa-node"),
            str(samples / "dgx-a100-mig.yaml"),
        )
    }
    assert {pod: r["admitted"] for pod, r in results.items()} == {
        "inference": True,
        "pair": True,
        "medium": True,
        "split": False,  # 2g.10gb x3 spans NUMA nodes 1 and 7
        "whole-gpu": True,
    }
    assert results["split"]["reason"] == "TopologyAffinityError"
    [pair] = results["pair"]["containers"]
    assert len(pair["mig_devices"]) == 2 and len(pair["gpu_indices"]) == 1  # one parent
    assert len(pair["numa_nodes"]) == 1
    [medium] = results["medium"]["containers"]
    assert medium["mig_devices"] == ["2:0", "3:0", "3:1"] and medium["numa_nodes"] == [1]
    uuids = [TOPOLOGY.owner(i)[1].label for i in medium["devices"]["nvidia.com/mig-3g.20gb"]]
    assert uuids == ["2:0", "3:0", "3:1"]
    [whole] = results["whole-gpu"]["containers"]
    assert whole["gpu_indices"] in ([6], [7]) and whole["mig_devices"] == []


def test_preferred_and_devices_answer_for_mig_resources() -> None:
    done = run_nvplugin(
        "preferred",
        *("--simulate", NODE, "--mig-strategy", "mixed", "--resource", "nvidia.com/mig-1g.5gb"),
        *("--size", "3", "--available", "0:0,0:1,1:0,1:1,1:2", "--output", "json"),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["mig_devices"] == ["1:0", "1:1", "1:2"]  # the parent that holds all three
    assert answer["gpus"] == [1] and answer["numa_nodes"] == [3] and answer["policy"] == "mig"
    assert answer["devices"] == [m.uuid for m in TOPOLOGY.gpus[1].mig_devices[:3]]
    done = run_nvplugin(
        "preferred", "--simulate", NODE, "--mig-strategy", "mixed", "--size", "1", timeout=60
    )
    assert done.returncode == 2
    assert "--resource is required on this node (MIG resources: nvidia.com/mig-1g.5gb" in (
        done.stderr
    )
    done = run_nvplugin(
        "devices", "--simulate", NODE, "--mig-strategy", "mixed", "--output", "json", timeout=60
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["gpus"][4]["mig"]["devices"][3]["resource"] == "nvidia.com/mig-1g.5gb.me"
    assert shown["gpus"][5]["resource"] == "(MIG, no MIG devices)"
    assert shown["resources"]["mig_strategy"] == "mixed"
    assert "has MIG enabled but no MIG devices" in done.stderr
