"""A MIG resource's DevicePlugin service over real gRPC, as the daemon makes it from the plan:
ListAndWatch (MIG UUIDs, the parent's NUMA node and health), Allocate per device-list strategy
with the caps device nodes, GetPreferredAllocation keeping a pod on one parent, time-sliced MIG
replicas."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import grpc
import pytest

from nvplugin.allocator import DEFAULT_BUDGET_S
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.config import load_config
from nvplugin.errors import NvpluginError
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.node.mig import caps_minor
from nvplugin.plugin.daemon import Daemon
from nvplugin.plugin.server import DevicePluginService, PluginSocket
from nvplugin.rm import (
    Replicas,
    ResourceManager,
    Responder,
    ServedResource,
    check_caps,
    make_responder,
    replica_id,
    resource_policy,
)
from tests.support.migplans import NODE, config_of, plan_of
from tests.support.service import run
from tests.support.waiting import WAIT_S

# --- the service -------------------------------------------------------------------------------


@asynccontextmanager
async def mig_service(
    resource: ServedResource, responder: Responder | None = None
) -> AsyncIterator[tuple[DevicePluginService, api_pb2_grpc.DevicePluginStub]]:
    """A MIG resource's service as the daemon makes it (its policy: allocationPolicy's default,
    best-effort), on a fresh socket."""
    directory = tempfile.mkdtemp()
    policy = resource_policy("best-effort", NODE, resource, budget_s=DEFAULT_BUDGET_S)
    service = DevicePluginService(ResourceManager(resource, responder), policy)
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
            f"k8s.device-plugin.nvidia.com/gpu={a.mig.uuid}",
            f"k8s.device-plugin.nvidia.com/gpu={c.mig.uuid}",
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
        assert list(response.annotations.values()) == [
            "k8s.device-plugin.nvidia.com/gpu=3:0,k8s.device-plugin.nvidia.com/gpu=3:1"
        ]

    try:
        run(body)
    finally:
        shutil.rmtree(dev_root, ignore_errors=True)


def test_unknown_caps_minors_refuse_pass_device_specs_naming_the_file() -> None:
    resource = resource_of("nvidia.com/mig-3g.20gb")
    migs = tuple(replace(m, mig=replace(m.mig, caps=None)) for m in resource.migs)
    blind = replace(resource, bases=migs)
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
            assert len(service.manager.devices) == 6 and service.uuids()[0] == a
            reply = await stub.Allocate(allocate_request(replica_id(a, 1), replica_id(a, 0)))
            assert dict(reply.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": a}

    run(body)
    assert [d.unit for d in resource.bases] == [0, 1, 2]


@pytest.mark.parametrize(
    ("policy", "chosen"), [("best-effort", ["2:2", "2:3"]), ("simple", ["0:0", "0:1"])]
)
def test_allocation_policy_applies_to_mig_resources(policy: str, chosen: list[str]) -> None:
    """``nvplugin.allocationPolicy`` reaches a MIG resource served by the daemon: best-effort is
    the MIG policy (GPU 2's two devices: a tight fit), simple the lowest MIG devices first."""
    resource = resource_of("nvidia.com/mig-1g.5gb")
    ids = [m.mig.uuid for m in resource.migs]
    label = {m.mig.uuid: m.mig.label for m in resource.migs}

    async def body() -> None:
        directory = tempfile.mkdtemp()
        flags = {
            "nvplugin.devicePluginDir": directory,
            "flags.migStrategy": "mixed",
            "nvplugin.allocationPolicy": policy,
        }
        daemon = Daemon(load_config(None, flags=flags), simulate="dgx-a100-mig")
        async with FakeKubelet(directory) as kubelet:
            task = asyncio.create_task(daemon.run(handle_signals=False))
            await kubelet.wait_registered(resource.name, timeout=WAIT_S)
            path = os.path.join(directory, resource.socket)
            async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
                reply = await api_pb2_grpc.DevicePluginStub(channel).GetPreferredAllocation(
                    api_pb2.PreferredAllocationRequest(
                        container_requests=[
                            api_pb2.ContainerPreferredAllocationRequest(
                                available_deviceIDs=ids, allocation_size=2
                            )
                        ]
                    )
                )
            assert [label[i] for i in reply.container_responses[0].deviceIDs] == chosen
            daemon.stop()
            assert await task == 0

    run(body)
