"""MIG devices served: the resource plan under each ``migStrategy`` (resources per profile,
``resources.mig`` renames, exclusions, time-slicing, collisions, warnings), then a MIG resource's
DevicePlugin service over real gRPC -- ListAndWatch (MIG UUIDs, the parent's NUMA node and
health), Allocate per device-list strategy with the caps device nodes, GetPreferredAllocation
keeping a pod on one parent, time-sliced MIG replicas."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import grpc
import pytest

from nvplugin.allocator.mig import MigPolicy
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.config import Config, load_config
from nvplugin.errors import InputError, NvpluginError
from nvplugin.node import load_topology
from nvplugin.node.mig import caps_minor
from nvplugin.plugin.resources import ResourcePlan, ServedResource, plan_for
from nvplugin.plugin.responses import check_caps, make_responder
from nvplugin.plugin.server import DevicePluginService, PluginSocket
from nvplugin.plugin.sharing import Replicas, base_devices, replica_id
from tests.plugin.test_responses import write_config
from tests.support.service import run

NODE = load_topology("dgx-a100-mig")
# GPUs 0-1: 1g.5gb x7 (NUMA 3); GPU2: 3g.20gb, 2g.10gb, 1g.5gb x2 (NUMA 1); GPU3: 3g.20gb x2
# (NUMA 1); GPU4: 2g.10gb x2, 1g.10gb, 1g.5gb+me (NUMA 7); GPU5: MIG on, no devices (NUMA 7);
# GPUs 6-7: MIG off (NUMA 5).
MIXED_COUNTS = {
    "nvidia.com/mig-1g.5gb": 16,
    "nvidia.com/mig-3g.20gb": 3,
    "nvidia.com/mig-2g.10gb": 3,
    "nvidia.com/mig-1g.10gb": 1,
    "nvidia.com/mig-1g.5gb.me": 1,
    "nvidia.com/gpu": 2,
}
HOMOGENEOUS = """\
version: v1
name: a100-3g
gpus:
  - {name: NVIDIA A100-SXM4-40GB, numa_node: 0, mig: [3g.20gb, 3g.20gb]}
  - {name: NVIDIA A100-SXM4-40GB, numa_node: 1, mig: [3g.20gb, 3g.20gb]}
links: |2
        GPU0     GPU1
  GPU0  X        SYS
  GPU1  SYS      X
"""


def config_of(text: str = "", strategy: str = "mixed") -> Config:
    path = write_config(f"version: v1\nflags:\n  migStrategy: {strategy}\n" + text)
    try:
        return load_config(path)
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def plan_of(config: Config, gpus: Any = NODE.gpus) -> ResourcePlan:
    return plan_for(config, gpus)


def counts(plan: ResourcePlan) -> dict[str, int]:
    return {r.name: r.device_count for r in plan.resources}


def labels(resource: ServedResource) -> list[str]:
    return [m.mig.label for m in resource.migs]


# --- the plan ----------------------------------------------------------------------------------


def test_mixed_serves_one_resource_per_profile_beside_the_gpus_with_mig_off() -> None:
    plan = plan_of(config_of())
    assert counts(plan) == MIXED_COUNTS
    # ordered by first device: GPU0's 1g.5gb, GPU2's 3g.20gb and 2g.10gb, GPU4's, then GPU6
    assert [r.name for r in plan.resources] == [
        "nvidia.com/mig-1g.5gb",
        "nvidia.com/mig-3g.20gb",
        "nvidia.com/mig-2g.10gb",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.5gb.me",
        "nvidia.com/gpu",
    ]
    small = plan.resource("nvidia.com/mig-1g.5gb")
    assert small is not None and small.socket == "nvplugin-mig-1g.5gb.sock"
    assert [g.index for g in small.gpus] == [0, 1, 2]  # the parents, whose health it follows
    assert labels(small)[-3:] == ["1:6", "2:2", "2:3"]
    medium = plan.resource("nvidia.com/mig-3g.20gb")
    assert medium is not None and labels(medium) == ["2:0", "3:0", "3:1"]
    assert {m.numa_node for m in medium.migs} == {1}
    gpu = plan.resource("nvidia.com/gpu")
    assert gpu is not None and [g.index for g in gpu.gpus] == [6, 7] and not gpu.migs
    assert plan.warnings == (
        "GPU 5 (NVIDIA A100-SXM4-40GB) has MIG enabled but no MIG devices: it serves nothing "
        "until MIG devices are created on it",
    )
    shown = plan.labels()
    assert shown[0] == "(as 7 MIG devices)" and shown[5] == "(MIG, no MIG devices)"
    assert shown[6] == "nvidia.com/gpu"
    assert plan.mig_labels()["4:3"] == "nvidia.com/mig-1g.5gb.me"
    data = plan.as_dict()
    assert data["mig_strategy"] == "mixed"
    entry = next(r for r in data["resources"] if r["name"] == "nvidia.com/mig-3g.20gb")
    assert entry == {
        "name": "nvidia.com/mig-3g.20gb",
        "socket": "nvplugin-mig-3g.20gb.sock",
        "gpus": [2, 3],
        "mig_devices": ["2:0", "3:0", "3:1"],
        "replicas": 1,
        "devices": 3,
        "renamed_from": None,
    }


def test_resources_mig_renames_by_whole_profile_name_first_match_wins() -> None:
    config = config_of(
        "resources:\n  mig:\n"
        "    - {pattern: '1g.5gb', name: mig-small}\n"  # not 1g.5gb+me: the whole name
        "    - {pattern: '?g.*', name: mig-other}\n"
        "    - {pattern: '7g.*', name: mig-whole}\n"
    )
    plan = plan_of(config)
    assert counts(plan) == {
        "nvidia.com/mig-small": 16,
        "nvidia.com/mig-other": 8,  # 3g.20gb x3, 2g.10gb x3, 1g.10gb, 1g.5gb+me
        "nvidia.com/gpu": 2,
    }
    other = plan.resource("nvidia.com/mig-other")
    assert other is not None and labels(other)[:3] == ["2:0", "2:1", "3:0"]
    assert plan.warnings[1:] == (
        "resources.mig[2].pattern '7g.*' matches no MIG device on this node (profiles: "
        "1g.10gb, 1g.5gb, 1g.5gb+me, 2g.10gb, 3g.20gb)",
    )
    assert config.as_dict()["resources"]["mig"][0] == {
        "pattern": "1g.5gb",
        "name": "nvidia.com/mig-small",
    }


def test_exclusions_hide_gpus_with_their_mig_devices_and_single_mig_devices() -> None:
    hidden = NODE.gpus[3].mig_devices[0].uuid
    config = config_of(f"resources:\n  exclude:\n    uuids: [{NODE.gpus[0].uuid}, {hidden}]\n")
    plan = plan_of(config)
    assert counts(plan)["nvidia.com/mig-1g.5gb"] == 9
    medium = plan.resource("nvidia.com/mig-3g.20gb")
    assert medium is not None and labels(medium) == ["2:0", "3:1"]
    assert plan.as_dict()["excluded"] == [0]
    assert plan.as_dict()["excluded_mig_devices"] == ["3:0"]
    assert plan.labels()[0] == "(excluded)" and plan.mig_labels()["3:0"] == "(excluded)"


def test_time_slicing_replicates_mig_devices() -> None:
    config = config_of(
        "sharing:\n  timeSlicing:\n    resources:\n"
        "      - {name: mig-1g.5gb, replicas: 4}\n"
        "      - {name: nvidia.com/mig-3g.20gb, replicas: 2, rename: mig-medium-shared}\n"
        "      - {name: mig-7g.40gb, replicas: 2}\n"
    )
    plan = plan_of(config)
    assert counts(plan)["nvidia.com/mig-1g.5gb"] == 64
    shared = plan.resource("nvidia.com/mig-medium-shared")
    assert shared is not None and shared.device_count == 6
    assert shared.base == "nvidia.com/mig-3g.20gb"
    assert plan.mig_labels()["3:1"] == "nvidia.com/mig-medium-shared x2 (<uuid>::0..1)"
    assert plan.warnings[-1] == (
        "sharing.timeSlicing.resources[2].name nvidia.com/mig-7g.40gb is no resource of this "
        "node (no MIG device is served as it)"
    )


def test_too_many_mig_replicas_for_the_kubelet_name_the_key() -> None:
    config = config_of(
        "sharing:\n  timeSlicing:\n    resources:\n      - {name: mig-1g.5gb, replicas: 100000}\n"
    )
    with pytest.raises(InputError) as caught:
        plan_of(config)
    message = str(caught.value)
    assert 'config key "sharing.timeSlicing.resources[0].replicas"' in message
    assert "16 MIG device(s) of nvidia.com/mig-1g.5gb" in message and "at most" in message


def test_a_mig_resource_cannot_take_a_name_already_served() -> None:
    # resources.gpus names a resource as a MIG profile's would be: only the node can tell.
    config = config_of("resources:\n  gpus:\n    - {pattern: '*A100*', name: mig-1g.5gb}\n")
    with pytest.raises(InputError) as caught:
        plan_of(config)
    assert str(caught.value) == (
        'config key "MIG profile 1g.5gb (migStrategy mixed)": nvidia.com/mig-1g.5gb collides '
        "with the resource from resources.gpus[0].name"
    )
    # resources.mig naming the GPU resource: the config alone tells.
    with pytest.raises(InputError) as caught:
        config_of("resources:\n  mig:\n    - {pattern: '*', name: gpu}\n")
    assert 'key "resources.mig[0].name": nvidia.com/gpu is already the resource of whole' in str(
        caught.value
    )
    # time-slicing a MIG resource needs migStrategy mixed
    with pytest.raises(InputError) as caught:
        config_of(
            "sharing:\n  timeSlicing:\n    resources:\n      - {name: mig-1g.5gb, replicas: 2}\n",
            strategy="none",
        )
    assert "nvidia.com/mig-1g.5gb is not a resource this plugin serves" in str(caught.value)


def test_single_serves_every_mig_device_as_the_gpu_resource() -> None:
    from nvplugin.node.nodefile import parse_node

    homogeneous = parse_node(HOMOGENEOUS, "test").topology()
    plan = plan_of(config_of(strategy="single"), homogeneous.gpus)
    assert counts(plan) == {"nvidia.com/gpu": 4}
    (resource,) = plan.resources
    assert labels(resource) == ["0:0", "0:1", "1:0", "1:1"]
    assert [m.numa_node for m in resource.migs] == [0, 0, 1, 1]
    assert plan.labels() == {0: "(as 2 MIG devices)", 1: "(as 2 MIG devices)"}
    # resources.mig does nothing under single: said, not silently ignored
    renamed = config_of("resources:\n  mig:\n    - {pattern: '*', name: x}\n", "single")
    assert plan_of(renamed, homogeneous.gpus).warnings == (
        "resources.mig applies under migStrategy mixed only; migStrategy is single",
    )
    with pytest.raises(InputError) as caught:
        plan_of(config_of(strategy="single"))
    assert str(caught.value).startswith("migStrategy single needs every GPU in MIG mode")
    # Hiding the GPUs that break single's rule leaves a node it fits.
    hide = [g.uuid for g in NODE.gpus if g.index not in (0, 1)]
    config = config_of(f"resources:\n  exclude:\n    uuids: [{', '.join(hide)}]\n", "single")
    assert counts(plan_of(config)) == {"nvidia.com/gpu": 14}


def test_none_serves_whole_gpus_mig_or_not() -> None:
    plan = plan_of(config_of(strategy="none"))
    assert counts(plan) == {"nvidia.com/gpu": 8}
    assert len(plan.warnings) == 6  # each MIG-enabled GPU: no container can use it whole
    assert plan.mig_labels() == {}


# --- the service -------------------------------------------------------------------------------


@asynccontextmanager
async def mig_service(
    resource: ServedResource, **options: Any
) -> AsyncIterator[tuple[DevicePluginService, api_pb2_grpc.DevicePluginStub]]:
    """A MIG resource's service as the daemon makes it, on a fresh socket."""
    directory = tempfile.mkdtemp()
    service = DevicePluginService(
        resource.name,
        resource.gpus,
        MigPolicy(NODE, [m.mig for m in resource.migs]),
        migs=resource.migs,
        replicas=resource.replicas,
        **options,
    )
    sock = PluginSocket(os.path.join(directory, resource.socket), service)
    await sock.start()
    channel = grpc.aio.insecure_channel(f"unix:{sock.path}")
    try:
        yield service, api_pb2_grpc.DevicePluginStub(channel)
    finally:
        await channel.close()
        service.close()
        await sock.stop()
        shutil.rmtree(directory, ignore_errors=True)


def resource_of(name: str, text: str = "") -> ServedResource:
    found = plan_of(config_of(text)).resource(name)
    assert found is not None
    return found


def allocate_request(*ids: str) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]
    )


def test_list_and_watch_gives_mig_uuids_with_the_parents_numa_node_and_health() -> None:
    resource = resource_of("nvidia.com/mig-1g.5gb")

    async def body() -> None:
        async with mig_service(resource) as (service, stub):
            streams = [stub.ListAndWatch(api_pb2.Empty()), stub.ListAndWatch(api_pb2.Empty())]
            first = [await stream.read() for stream in streams]
            for listing in first:
                assert [d.ID for d in listing.devices] == [m.mig.uuid for m in resource.migs]
                assert {d.ID: d.topology.nodes[0].ID for d in listing.devices} == {
                    m.mig.uuid: m.gpu.numa_node for m in resource.migs
                }
                assert {d.health for d in listing.devices} == {"Healthy"}
            # An Xid on GPU 2 (the monitor's per-GPU map): both of its 1g.5gb devices, on
            # every stream; GPUs 0-1's fourteen stay Healthy.
            service.set_health({2: False})
            gpu2 = {m.mig.uuid for m in resource.migs if m.gpu.index == 2}
            for stream in streams:
                update = await stream.read()
                unhealthy = {d.ID for d in update.devices if d.health == "Unhealthy"}
                assert unhealthy == gpu2 and len(update.devices) == 16
            assert service.unhealthy_uuids() == [m.mig.uuid for m in resource.migs][-2:]
            service.set_health({2: True})  # recovery, per parent
            for stream in streams:
                update = await stream.read()
                assert {d.health for d in update.devices} == {"Healthy"}
            for stream in streams:
                stream.cancel()

    run(body)


def test_allocate_per_device_list_strategy_with_the_caps_device_nodes() -> None:
    resource = resource_of("nvidia.com/mig-3g.20gb")
    a, b, c = resource.migs  # 2:0, 3:0, 3:1
    dev_root = tempfile.mkdtemp()
    os.makedirs(os.path.join(dev_root, "dev"))
    open(os.path.join(dev_root, "dev", "nvidiactl"), "w").close()

    async def allocate(strategies: list[str], ids_strategy: str, *ids: str) -> Any:
        responder = make_responder(
            strategies, ids_strategy, pass_device_specs=True, dev_root=dev_root
        )
        async with mig_service(resource, responder=responder) as (_, stub):
            reply = await stub.Allocate(allocate_request(*ids))
            (response,) = reply.container_responses
            return response

    async def body() -> None:
        response = await allocate(["envvar", "cdi-cri"], "uuid", c.mig.uuid, a.mig.uuid)
        assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{a.mig.uuid},{c.mig.uuid}"}
        assert [d.name for d in response.cdi_devices] == [
            f"nvidia.com/gpu={a.mig.uuid}",
            f"nvidia.com/gpu={c.mig.uuid}",
        ]
        caps = [
            caps_minor(2, a.mig.gpu_instance),
            caps_minor(2, a.mig.gpu_instance, a.mig.compute_instance),
            caps_minor(3, c.mig.gpu_instance),
            caps_minor(3, c.mig.gpu_instance, c.mig.compute_instance),
        ]
        assert caps == [
            a.mig.caps.gpu_instance,
            a.mig.caps.compute_instance,
            c.mig.caps.gpu_instance,
            c.mig.caps.compute_instance,
        ]
        assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
            ("/dev/nvidia2", f"{dev_root}/dev/nvidia2", "rw"),
            (
                f"/dev/nvidia-caps/nvidia-cap{caps[0]}",
                f"{dev_root}/dev/nvidia-caps/nvidia-cap{caps[0]}",
                "rw",
            ),
            (
                f"/dev/nvidia-caps/nvidia-cap{caps[1]}",
                f"{dev_root}/dev/nvidia-caps/nvidia-cap{caps[1]}",
                "rw",
            ),
            ("/dev/nvidia3", f"{dev_root}/dev/nvidia3", "rw"),
            (
                f"/dev/nvidia-caps/nvidia-cap{caps[2]}",
                f"{dev_root}/dev/nvidia-caps/nvidia-cap{caps[2]}",
                "rw",
            ),
            (
                f"/dev/nvidia-caps/nvidia-cap{caps[3]}",
                f"{dev_root}/dev/nvidia-caps/nvidia-cap{caps[3]}",
                "rw",
            ),
            ("/dev/nvidiactl", f"{dev_root}/dev/nvidiactl", "rw"),
        ]
        # deviceIDStrategy index: NVIDIA's <gpu>:<mig index>; volume mounts and CDI alike
        response = await allocate(
            ["volume-mounts", "cdi-annotations"], "index", b.mig.uuid, c.mig.uuid
        )
        assert dict(response.envs) == {
            "NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"
        }
        assert [(m.container_path, m.host_path) for m in response.mounts] == [
            ("/var/run/nvidia-container-devices/3:0", "/dev/null"),
            ("/var/run/nvidia-container-devices/3:1", "/dev/null"),
        ]
        assert list(response.annotations.values()) == ["nvidia.com/gpu=3:0,nvidia.com/gpu=3:1"]

    try:
        run(body)
    finally:
        shutil.rmtree(dev_root, ignore_errors=True)


def test_unknown_caps_minors_refuse_pass_device_specs_naming_the_file() -> None:
    resource = resource_of("nvidia.com/mig-3g.20gb")
    migs = tuple(replace(m, mig=replace(m.mig, caps=None)) for m in resource.migs)
    blind = replace(resource, migs=migs)
    with pytest.raises(NvpluginError) as caught:
        check_caps(blind.bases)
    message = str(caught.value)
    assert message.startswith("passDeviceSpecs: MIG devices 2:0, 3:0, 3:1:")
    assert "proc/driver/nvidia-caps/mig-minors" in message and "passDeviceSpecs off" in message
    check_caps(resource.bases)  # known: fine


def test_preferred_allocation_keeps_a_pod_on_one_parent() -> None:
    resource = resource_of("nvidia.com/mig-1g.5gb")
    ids = [m.mig.uuid for m in resource.migs]
    parent = {m.mig.uuid: m.gpu.index for m in resource.migs}

    async def prefer(available: list[str], must: list[str], size: int) -> list[str]:
        async with mig_service(resource) as (_, stub):
            request = api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available,
                        must_include_deviceIDs=must,
                        allocation_size=size,
                    )
                ]
            )
            reply = await stub.GetPreferredAllocation(request)
            return list(reply.container_responses[0].deviceIDs)

    async def body() -> None:
        chosen = await prefer(ids, [], 2)
        assert len(chosen) == 2 and len({parent[i] for i in chosen}) == 1
        # GPU 2's two devices fit exactly: whole 7-device parents stay untouched
        assert {parent[i] for i in chosen} == {2}
        # One of GPU 0's taken already: the pod goes to GPU 0's rest, not a fresh parent
        rest = [i for i in ids if i != ids[0] and parent[i] != 2]
        chosen = await prefer(rest, [], 3)
        assert {parent[i] for i in chosen} == {0}
        # must-include on GPU 1: the rest of the answer on GPU 1 too
        chosen = await prefer(ids, [ids[8]], 4)
        assert ids[8] in chosen and {parent[i] for i in chosen} == {1}

    run(body)


def test_time_sliced_mig_replicas_allocate_their_mig_device_once() -> None:
    resource = resource_of(
        "nvidia.com/mig-3g.20gb",
        "sharing:\n  timeSlicing:\n    resources:\n      - {name: mig-3g.20gb, replicas: 2}\n",
    )
    assert resource.replicas == Replicas(2)
    a = resource.migs[0].mig.uuid

    async def body() -> None:
        async with mig_service(resource) as (service, stub):
            listing = await stub.ListAndWatch(api_pb2.Empty()).read()
            assert [d.ID for d in listing.devices][:2] == [replica_id(a, 0), replica_id(a, 1)]
            assert len(service.devices) == 6 and service.uuids()[0] == a
            reply = await stub.Allocate(allocate_request(replica_id(a, 1), replica_id(a, 0)))
            assert dict(reply.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": a}

    run(body)
    assert [d.unit for d in base_devices((), resource.migs)] == [0, 1, 2]


def test_nvidias_mig_settings_load_from_file_env_and_flags() -> None:
    assert config_of().mig_strategy == "mixed"
    assert load_config(None, env={"MIG_STRATEGY": "single"}).mig_strategy == "single"
    flags = {"flags.migStrategy": "none"}
    assert load_config(None, env={"MIG_STRATEGY": "mixed"}, flags=flags).mig_strategy == "none"
    with pytest.raises(InputError) as caught:
        load_config(None, env={"MIG_STRATEGY": "Mixed"})
    assert str(caught.value).startswith("environment variable MIG_STRATEGY")
    assert "none, single, mixed" in str(caught.value)
