"""Time-slicing over real gRPC: replicas listed with their GPU's NUMA node and health, Allocate
mapping replicas back to GPUs, failRequestsGreaterThanOne, distributed vs packed preferred
allocation (with the link score deciding among equally loaded GPUs), and the config block."""

from __future__ import annotations

import grpc
import pytest

from nvplugin.api.v1beta1 import api_pb2
from nvplugin.config import ReplicatedResources, load_config
from nvplugin.errors import InputError
from nvplugin.nodesession import load_topology
from nvplugin.rm import Replicas, replica_id
from tests.support.service import Served, allocate_request, run, serving, write_config

INVALID = grpc.StatusCode.INVALID_ARGUMENT
ENV = "NVIDIA_VISIBLE_DEVICES"
TOPOLOGY = load_topology("workstation-4gpu")
# workstation-4gpu: 0-1 and 2-3 share a PCIe switch (50); 0-3 and 1-2 have two NVLinks (210).


def rid(s: Served, gpu: int, replica: int) -> str:
    return replica_id(s.uuid(gpu), replica)


def every_replica(s: Served, count: int) -> list[str]:
    return [rid(s, g, n) for g in range(len(s.topology.gpus)) for n in range(count)]


def gpa(available: list[str], must: list[str], size: int) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )


async def prefer(s: Served, available: list[str], must: list[str], size: int) -> list[str]:
    reply = await s.stub.GetPreferredAllocation(gpa(available, must, size))
    return list(reply.container_responses[0].deviceIDs)


# --- ListAndWatch and health --------------------------------------------------------------------


def test_list_advertises_every_replica_with_its_gpus_numa_node_and_health() -> None:
    async def body() -> None:
        async with serving(TOPOLOGY, replicas=Replicas(4)) as s:
            stream = s.stub.ListAndWatch(api_pb2.Empty())
            first = await stream.read()
            assert [d.ID for d in first.devices] == every_replica(s, 4)
            assert len(first.devices) == 4 * len(TOPOLOGY.gpus)
            for device in first.devices:
                uuid, _, number = device.ID.partition("::")
                gpu = TOPOLOGY.gpu_by_uuid(uuid)
                assert gpu is not None and number in {"0", "1", "2", "3"}
                assert device.health == "Healthy"
                assert [n.ID for n in device.topology.nodes] == [gpu.numa_node]
            # An Xid (as the health monitor reports it) on GPU 1: all four replicas go.
            s.service.set_health({1: False})
            second = await stream.read()
            unhealthy = [d.ID for d in second.devices if d.health == "Unhealthy"]
            assert unhealthy == [rid(s, 1, n) for n in range(4)]
            s.service.set_health({1: True})
            third = await stream.read()
            assert all(d.health == "Healthy" for d in third.devices)
            stream.cancel()

    run(body)


def test_a_held_resource_lists_every_replica_unhealthy_until_released() -> None:
    """What an MPS resource does while its control daemon is down: held, whatever the GPUs'
    health; released, the GPUs' health applies again (an Xid meanwhile is not forgotten)."""

    async def body() -> None:
        async with serving(TOPOLOGY, replicas=Replicas(2, strategy="mps")) as s:
            stream = s.stub.ListAndWatch(api_pb2.Empty())
            first = await stream.read()
            assert all(d.health == "Healthy" for d in first.devices)
            s.service.hold("MPS control daemon: control daemon 42 exited")
            held = await stream.read()
            assert {d.health for d in held.devices} == {"Unhealthy"}
            assert s.service.held == "MPS control daemon: control daemon 42 exited"
            s.service.set_health({2: False})  # an Xid on GPU 2 while held: nothing to send
            s.service.hold(None)
            released = await stream.read()
            unhealthy = [d.ID for d in released.devices if d.health == "Unhealthy"]
            assert unhealthy == [rid(s, 2, 0), rid(s, 2, 1)]
            assert s.service.held is None
            stream.cancel()

    run(body)


# --- Allocate -----------------------------------------------------------------------------------


def test_allocate_maps_replicas_to_their_gpus_once_each() -> None:
    async def body() -> None:
        async with serving(TOPOLOGY, replicas=Replicas(4)) as s:
            request = allocate_request([rid(s, 3, 1), rid(s, 1, 2), rid(s, 1, 0)], [rid(s, 2, 3)])
            reply = await s.stub.Allocate(request)
            first, second = reply.container_responses
            assert dict(first.envs) == {ENV: f"{s.uuid(1)},{s.uuid(3)}"}
            assert dict(second.envs) == {ENV: s.uuid(2)}
            # Whole-GPU IDs are not what this resource advertises.
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await s.stub.Allocate(allocate_request([s.uuid(0)]))
            assert caught.value.code() == INVALID
            assert f"unknown device {s.uuid(0)}" in (caught.value.details() or "")

    run(body)


def test_fail_requests_greater_than_one() -> None:
    async def body() -> None:
        async with serving(
            TOPOLOGY, replicas=Replicas(4, fail_requests_greater_than_one=True)
        ) as s:
            reply = await s.stub.Allocate(allocate_request([rid(s, 0, 2)]))
            assert dict(reply.container_responses[0].envs) == {ENV: s.uuid(0)}
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await s.stub.Allocate(
                    allocate_request([rid(s, 0, 0)], [rid(s, 0, 1), rid(s, 2, 0)])
                )
            assert caught.value.code() == INVALID
            details = caught.value.details() or ""
            assert details.startswith("container request 1: devices_ids: 2 replicas requested")
            assert "failRequestsGreaterThanOne allows at most 1 per container" in details
        async with serving(TOPOLOGY, replicas=Replicas(4)) as s:  # without the option: allowed
            reply = await s.stub.Allocate(allocate_request([rid(s, 0, 0), rid(s, 0, 1)]))
            assert dict(reply.container_responses[0].envs) == {ENV: s.uuid(0)}

    run(body)


# --- GetPreferredAllocation ---------------------------------------------------------------------


def busy(s: Served, in_use: dict[int, int], count: int = 4) -> list[str]:
    """Every replica except the first ``in_use[gpu]`` of each GPU (those are in use)."""
    return [
        rid(s, g, n)
        for g in range(len(s.topology.gpus))
        for n in range(count)
        if n >= in_use.get(g, 0)
    ]


def test_distributed_spreads_over_the_least_used_gpus() -> None:
    async def body() -> None:
        async with serving(TOPOLOGY, replicas=Replicas(4)) as s:
            available = busy(s, {0: 2, 1: 1})
            # GPUs 2 and 3 have no replica in use: one goes to 2 (tie: lowest index).
            assert await prefer(s, available, [], 1) == [rid(s, 2, 0)]
            assert await prefer(s, available, [], 2) == [rid(s, 2, 0), rid(s, 3, 0)]
            # The third replica: GPUs 1, 2, 3 are then equal (one in use each); 1 is new.
            assert await prefer(s, available, [], 3) == [rid(s, 1, 1), rid(s, 2, 0), rid(s, 3, 0)]
            # Everything free, two replicas: two GPUs, and the best linked pair (0-3 NVLink,
            # not 0-1 PCIe switch).
            every = every_replica(s, 4)
            assert await prefer(s, every, [], 2) == [rid(s, 0, 0), rid(s, 3, 0)]
            # Must-include on GPU 1: its NVLink partner 2 joins it.
            assert await prefer(s, every, [rid(s, 1, 2)], 2) == [rid(s, 1, 2), rid(s, 2, 0)]
            # Five replicas over four GPUs: one GPU gets two.
            five = await prefer(s, every, [], 5)
            assert sorted({i.partition("::")[0] for i in five}) == sorted(
                s.uuid(g) for g in range(4)
            )

    run(body)


def test_packed_fills_the_busiest_gpu_first() -> None:
    async def body() -> None:
        async with serving(TOPOLOGY, replicas=Replicas(4, allocation="packed")) as s:
            available = busy(s, {0: 2, 1: 1})
            assert await prefer(s, available, [], 1) == [rid(s, 0, 2)]
            assert await prefer(s, available, [], 3) == [rid(s, 0, 2), rid(s, 0, 3), rid(s, 1, 1)]
            # All free, six replicas: GPU 0 full, then the GPU best linked to it (3), not 1.
            every = every_replica(s, 4)
            expected = [rid(s, 0, n) for n in range(4)] + [rid(s, 3, 0), rid(s, 3, 1)]
            assert await prefer(s, every, [], 6) == expected
            # Must-include: its GPU is filled first.
            assert await prefer(s, every, [rid(s, 2, 1)], 2) == [rid(s, 2, 0), rid(s, 2, 1)]

    run(body)


def test_impossible_and_malformed_replica_requests() -> None:
    async def body() -> None:
        async with serving(TOPOLOGY, replicas=Replicas(2)) as s:
            every = every_replica(s, 2)
            assert await prefer(s, every, [], 0) == []
            assert await prefer(s, every[:3], [], 4) == []
            assert await prefer(s, every, every[:3], 2) == []
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await prefer(s, every[:2], [every[3]], 2)
            assert caught.value.code() == INVALID
            assert "is not in available_deviceIDs" in (caught.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await prefer(s, [*every, f"{s.uuid(0)}::7"], [], 1)
            assert f"unknown device {s.uuid(0)}::7" in (caught.value.details() or "")

    run(body)


# --- config -------------------------------------------------------------------------------------

SHARED = """\
version: v1
flags:
  plugin:
    sharedDevicesAllocationPolicy: packed
sharing:
  timeSlicing:
    renameByDefault: {rename_by_default}
    failRequestsGreaterThanOne: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
        devices: all
"""


@pytest.mark.parametrize(("rename_by_default", "served"), [(False, "gpu"), (True, "gpu.shared")])
def test_time_slicing_config_in_nvidias_format(rename_by_default: bool, served: str) -> None:
    text = SHARED.format(rename_by_default=str(rename_by_default).lower())
    config = load_config(write_config(text))
    slicing = config.sharing.time_slicing
    assert slicing.fail_requests_greater_than_one is True
    assert slicing.allocation == "packed"
    (entry,) = slicing.resources
    assert (entry.name, entry.replicas, entry.rename) == ("nvidia.com/gpu", 4, None)
    assert slicing.served_name(entry) == f"nvidia.com/{served}"
    shown = config.as_dict()["sharing"]["timeSlicing"]
    assert shown["resources"][0]["servedAs"] == f"nvidia.com/{served}"


def test_short_names_and_rename() -> None:
    config = load_config(
        write_config(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "      - {name: gpu, replicas: 2, rename: gpu-shared}\n"
        )
    )
    (entry,) = config.sharing.time_slicing.resources
    assert (entry.name, entry.rename) == ("nvidia.com/gpu", "nvidia.com/gpu-shared")
    assert ReplicatedResources().served_name(entry) == "nvidia.com/gpu-shared"


def slicing(entries: str, extra: str = "", top: str = "") -> str:
    return f"version: v1\n{top}sharing:\n  timeSlicing:\n{extra}    resources:\n{entries}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            slicing("      - {name: nvidia.com/gpu, replicas: 1}\n"),
            'key "sharing.timeSlicing.resources[0].replicas": 1 is not between 2 and',
        ),
        (
            slicing("      - {name: nvidia.com/gpu, replicas: two}\n"),
            'key "sharing.timeSlicing.resources[0].replicas": expected an integer',
        ),
        (
            slicing("      - {replicas: 2}\n"),
            'key "sharing.timeSlicing.resources[0].name": is missing',
        ),
        (
            slicing("      - {name: gpu, replicas: 2, replica: 3}\n"),
            'key "sharing.timeSlicing.resources[0]": unknown key "replica"; '
            'did you mean "replicas"?',
        ),
        (
            slicing("      - {name: gpu, replicas: 2, devices: [0, 1]}\n"),
            'key "sharing.timeSlicing.resources[0].devices": nvplugin does not support replicating',
        ),
        (
            slicing("      - {name: gpu, replicas: 2}\n      - {name: t4, replicas: 2}\n"),
            'key "sharing.timeSlicing.resources[1].name": nvidia.com/t4 is not a resource this '
            "plugin serves (have: nvidia.com/gpu)",
        ),
        (
            slicing("      - {name: gpu, replicas: 2}\n      - {name: gpu, replicas: 3}\n"),
            'key "sharing.timeSlicing.resources[1].name": nvidia.com/gpu is already replicated',
        ),
        (
            slicing(
                "      - {name: gpu, replicas: 2, rename: a100}\n",
                top="resources:\n  gpus:\n    - {pattern: '*A100*', name: a100}\n",
            ),
            'key "sharing.timeSlicing.resources[0].rename": nvidia.com/a100 collides with the '
            "resource from resources.gpus[0].name",
        ),
        (
            slicing(
                "      - {name: gpu, replicas: 2}\n",
                extra="    renameByDefault: true\n",
                top="resources:\n  gpus:\n    - {pattern: '*T4*', name: gpu.shared}\n",
            ),
            'key "sharing.timeSlicing.renameByDefault": nvidia.com/gpu.shared collides with the '
            "resource from resources.gpus[0].name",
        ),
        (
            slicing("      - {name: gpu, replicas: 2, rename: Shared GPU}\n"),
            'key "sharing.timeSlicing.resources[0].rename": the ResourceName '
            '"nvidia.com/Shared GPU" is invalid',
        ),
        (
            slicing(
                "      - {name: gpu, replicas: 2, rename: example.com/a100}\n",
                top="resources:\n  gpus:\n    - {pattern: '*A100*', name: a100}\n",
            ),
            'key "sharing.timeSlicing.resources[0].rename": example.com/a100 would be served on '
            "the same socket nvplugin-a100.sock as the resource from resources.gpus[0].name",
        ),
        (
            slicing("      - {name: gpu, replicas: 2}\n", extra="    allocation: spread\n"),
            'unknown key "sharing.timeSlicing.allocation"; valid keys here: renameByDefault',
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources: {name: gpu}\n",
            'key "sharing.timeSlicing.resources": expected a list of mapping '
            "{name, replicas, rename",
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: 1\n",
            'key "sharing.timeSlicing.renameByDefault": expected true or false',
        ),
    ],
)
def test_bad_time_slicing_names_the_key_path(text: str, expected: str) -> None:
    path = write_config(text)
    with pytest.raises(InputError) as caught:
        load_config(path)
    assert caught.value.exit_code == 2
    assert str(caught.value).startswith(f"config file {path}: ")
    assert expected in str(caught.value)


def test_a_resource_flag_can_collide_too() -> None:
    path = write_config(slicing("      - {name: gpu, replicas: 2, rename: example.com/shared}\n"))
    # The default resource renamed by flag: the time-slicing entry named "gpu" no longer exists.
    with pytest.raises(InputError) as caught:
        load_config(path, flags={"nvplugin.resourceName": "example.com/other"})
    assert 'key "sharing.timeSlicing.resources[0].name": example.com/gpu is not' in str(
        caught.value
    )
