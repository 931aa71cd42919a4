"""The DevicePlugin service over real gRPC on a real unix socket, with a simulated node."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import tempfile
from collections.abc import Awaitable
from itertools import combinations

import grpc
import pytest

from nvplugin.allocator import POLICY_NAMES, make_policy
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.errors import NvpluginError
from nvplugin.nodesession import NodeSession, load_topology, open_node
from nvplugin.plugin.server import DevicePluginService, PluginSocket, claim_socket_path
from tests.support.service import gpus_manager, run, serving

BUILT_IN = ["workstation-4gpu", "dgx-1", "dgx-a100", "dgx-h100", "dgx-2", "pcie-8gpu", "no-numa"]
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def gpa(available: list[str], must: list[str], size: int) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )


async def rpc_error(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def test_options_and_socket_mode() -> None:
    async def body() -> None:
        topology = load_topology("workstation-4gpu")
        async with serving(topology) as s:
            options = await s.stub.GetDevicePluginOptions(api_pb2.Empty())
            assert options.get_preferred_allocation_available is True
            assert options.pre_start_required is False
            assert stat.S_IMODE(os.stat(s.socket.path).st_mode) == 0o600
            assert os.path.basename(s.socket.path) == "nvplugin-gpu.sock"
        async with serving(topology, pre_start_required=True) as s:
            options = await s.stub.GetDevicePluginOptions(api_pb2.Empty())
            assert options.pre_start_required is True
            reply = await s.stub.PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=[s.uuid(0)])
            )
            assert reply == api_pb2.PreStartContainerResponse()
        assert not os.path.exists(s.socket.path)  # stop removes our socket

    run(body)


@pytest.mark.parametrize("node", BUILT_IN)
def test_list_has_every_gpu_in_index_order_with_numa(node: str) -> None:
    async def body() -> None:
        topology = load_topology(node)
        async with serving(topology) as s:
            stream = s.stub.ListAndWatch(api_pb2.Empty())
            first = await stream.read()
            stream.cancel()
            assert [d.ID for d in first.devices] == [g.uuid for g in topology.gpus]
            assert [g.index for g in topology.gpus] == sorted(g.index for g in topology.gpus)
            for device, gpu in zip(first.devices, topology.gpus, strict=True):
                assert device.health == "Healthy"
                if gpu.numa_node is None:
                    assert not device.HasField("topology")
                else:
                    assert [n.ID for n in device.topology.nodes] == [gpu.numa_node]

    run(body)


def test_numa_is_omitted_only_when_unknown() -> None:
    assert all(g.numa_node is None for g in load_topology("no-numa").gpus)
    assert all(g.numa_node is not None for g in load_topology("dgx-2").gpus)


def test_every_stream_gets_every_change_and_ends_cleanly() -> None:
    async def body() -> None:
        topology = load_topology("workstation-4gpu")
        async with serving(topology) as s:
            streams = [s.stub.ListAndWatch(api_pb2.Empty()) for _ in range(3)]
            for stream in streams:
                assert len((await stream.read()).devices) == 4
            assert s.service.open_streams == 3
            s.service.set_health({1: False})
            for stream in streams:
                update = await stream.read()
                assert [d.health for d in update.devices] == [
                    "Healthy",
                    "Unhealthy",
                    "Healthy",
                    "Healthy",
                ]
            s.service.set_health({1: False, 7: False})  # no change for us: no message
            s.service.set_health({1: True, 3: False})
            for stream in streams:
                update = await stream.read()
                assert [d.health for d in update.devices][1:] == ["Healthy", "Healthy", "Unhealthy"]
            # A stream opened now starts with the current list.
            late = s.stub.ListAndWatch(api_pb2.Empty())
            assert [d.health for d in (await late.read()).devices][3] == "Unhealthy"
            s.service.close()
            for stream in [*streams, late]:
                assert await stream.read() is grpc.aio.EOF
                assert await stream.code() == grpc.StatusCode.OK
            assert s.service.open_streams == 0

    run(body)


def test_changes_within_an_interval_are_coalesced_into_one_list() -> None:
    """The first change goes out at once; changes arriving within the interval after it go out
    together, as one list with the latest map; changes that undo each other send nothing."""

    async def body() -> None:
        topology = load_topology("workstation-4gpu")
        async with serving(topology, publish_interval_s=0.3) as s:
            seen: list[dict[int, bool]] = []
            s.service.watch_health(seen.append)
            stream = s.stub.ListAndWatch(api_pb2.Empty())
            assert len((await stream.read()).devices) == 4

            def health(message: api_pb2.ListAndWatchResponse) -> list[str]:
                return [d.health[0] for d in message.devices]  # H / U

            s.service.set_health({0: False})  # after a quiet spell: at once
            assert health(await stream.read()) == ["U", "H", "H", "H"]
            s.service.set_health({1: False})  # within the interval: held back ...
            s.service.set_health({2: False})
            s.service.set_health({1: True})
            assert s.service.health == {0: False, 1: True, 2: False, 3: True}
            assert s.service.unhealthy_uuids() == [s.uuid(0)]  # ... not sent yet
            assert health(await stream.read()) == ["U", "H", "U", "H"]  # ... then the latest
            s.service.set_health({3: False})
            s.service.set_health({3: True})  # undone before it was sent: no list at all
            s.service.set_health({0: True})
            assert health(await stream.read()) == ["H", "H", "U", "H"]
            assert [sorted(i for i, ok in h.items() if not ok) for h in seen] == [
                [],
                [0],
                [0, 2],
                [2],
            ]

    run(body)


@pytest.mark.parametrize("node", BUILT_IN)
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_preferred_allocation_matches_the_allocator(node: str, policy: str) -> None:
    async def body() -> None:
        topology = load_topology(node)
        reference = make_policy(policy, topology)
        n = len(topology.gpus)
        cases = [(list(range(n)), [], size) for size in range(n + 1)]
        cases += [(list(range(1, n)), [1], 2), (list(range(0, n, 2)), [0, 2], 3)]
        cases += [(list(avail), [], 2) for avail in list(combinations(range(n), 4))[:20]]
        async with serving(topology, policy) as s:
            for available, must, size in cases:
                reply = await s.stub.GetPreferredAllocation(
                    gpa([s.uuid(i) for i in reversed(available)], [s.uuid(i) for i in must], size)
                )
                expected = [s.uuid(i) for i in reference.allocate(available, must, size)]
                assert list(reply.container_responses[0].deviceIDs) == expected

    run(body)


def test_preferred_allocation_answers_each_container_in_order() -> None:
    async def body() -> None:
        topology = load_topology("dgx-1")
        reference = make_policy("best-effort", topology)
        async with serving(topology) as s:
            all_ids = [s.uuid(i) for i in range(8)]
            request = api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=all_ids, allocation_size=size
                    )
                    for size in (4, 1, 9, 2)
                ]
            )
            reply = await s.stub.GetPreferredAllocation(request)
            got = [list(r.deviceIDs) for r in reply.container_responses]
            want = [
                [s.uuid(i) for i in reference.allocate(range(8), [], size)] for size in (4, 1, 9, 2)
            ]
            assert got == want and got[2] == []

    run(body)


def test_preferred_allocation_impossible_is_empty_and_malformed_is_invalid() -> None:
    async def body() -> None:
        topology = load_topology("dgx-a100")
        async with serving(topology) as s:
            u = s.uuid
            for available, must, size in [
                ([u(0), u(1)], [], 3),  # more than available
                ([u(0), u(1), u(2)], [u(0), u(1)], 1),  # more must-include than size
                ([u(0)], [], 0),  # size 0
                ([], [], 1),
            ]:
                reply = await s.stub.GetPreferredAllocation(gpa(available, must, size))
                assert list(reply.container_responses[0].deviceIDs) == []
            for request, message in [
                (gpa([u(0), "GPU-bogus"], [], 1), "available_deviceIDs: unknown device GPU-bogus"),
                (gpa([u(0)], ["GPU-x"], 1), "must_include_deviceIDs: unknown device GPU-x"),
                (gpa([u(0), u(0)], [], 1), f"available_deviceIDs: device {u(0)} listed twice"),
                (
                    gpa([u(0), u(1)], [u(2)], 2),
                    f"must_include_deviceIDs: device {u(2)} is not in available_deviceIDs",
                ),
                (gpa([u(0), u(1)], [], -1), "allocation_size: -1 is negative"),
            ]:
                error = await rpc_error(s.stub.GetPreferredAllocation(request))
                assert error.code() == INVALID
                assert error.details() == message
            two = api_pb2.PreferredAllocationRequest(
                container_requests=[
                    gpa([u(0)], [], 1).container_requests[0],
                    gpa([u(7)], [], 1).container_requests[0],
                    gpa(["nope"], [], 1).container_requests[0],
                ]
            )
            error = await rpc_error(s.stub.GetPreferredAllocation(two))
            assert (
                error.details() == "container request 2: available_deviceIDs: unknown device nope"
            )
            # The server lives on after bad requests.
            assert (await s.stub.GetDevicePluginOptions(api_pb2.Empty())).ListFields()

    run(body)


def test_preferred_allocation_makes_no_nvml_call() -> None:
    async def body(node: NodeSession) -> None:
        assert node.sim is not None
        async with serving(node.topology) as s:
            before = sum(node.sim.calls.values())
            ids = [s.uuid(i) for i in range(16)]
            for size in range(17):
                await s.stub.GetPreferredAllocation(gpa(ids, ids[:1] if size else [], size))
            await rpc_error(s.stub.GetPreferredAllocation(gpa(ids, [], -2)))
            await s.stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids[:2])]
                )
            )
            assert sum(node.sim.calls.values()) == before
            assert before > 0  # the counter does count (discovery made calls)

    with open_node("dgx-2") as node:
        asyncio.run(body(node))


def test_allocate_envvar_in_index_order_and_errors() -> None:
    async def body() -> None:
        topology = load_topology("dgx-1")
        async with serving(topology) as s:
            u = s.uuid
            request = api_pb2.AllocateRequest(
                container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=[u(5), u(2), u(7)]),
                    api_pb2.ContainerAllocateRequest(devices_ids=[u(0)]),
                ]
            )
            reply = await s.stub.Allocate(request)
            assert len(reply.container_responses) == 2
            envs = [dict(r.envs) for r in reply.container_responses]
            assert envs == [
                {"NVIDIA_VISIBLE_DEVICES": f"{u(2)},{u(5)},{u(7)}"},
                {"NVIDIA_VISIBLE_DEVICES": u(0)},
            ]
            single = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-nope"])]
            )
            error = await rpc_error(s.stub.Allocate(single))
            assert error.code() == INVALID
            assert error.details() == "devices_ids: unknown device GPU-nope"
            request.container_requests.add(devices_ids=[u(1), "GPU-zzz"])
            error = await rpc_error(s.stub.Allocate(request))
            assert error.details() == "container request 2: devices_ids: unknown device GPU-zzz"
            dup = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[u(1), u(1)])]
            )
            error = await rpc_error(s.stub.Allocate(dup))
            assert error.details() == f"devices_ids: device {u(1)} listed twice"

    run(body)


def test_preferred_allocation_waits_for_a_policy_still_computing() -> None:
    async def body() -> None:
        topology = load_topology("workstation-4gpu")
        loop = asyncio.get_running_loop()
        pending: asyncio.Future[object] = loop.create_future()
        directory = tempfile.mkdtemp()
        manager = gpus_manager("nvidia.com/gpu", topology.gpus)
        service = DevicePluginService(manager, pending)  # type: ignore[arg-type]
        sock = PluginSocket(os.path.join(directory, "p.sock"), service)
        await sock.start()
        async with grpc.aio.insecure_channel(f"unix:{sock.path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            ids = [g.uuid for g in topology.gpus]
            call = asyncio.ensure_future(stub.GetPreferredAllocation(gpa(ids, [], 2)))
            await asyncio.sleep(0.2)
            assert not call.done()
            pending.set_result(make_policy("best-effort", topology))
            reply = await call
            expected = make_policy("best-effort", topology).allocate(range(4), [], 2)
            assert list(reply.container_responses[0].deviceIDs) == [ids[i] for i in expected]
        await sock.stop()

    run(body)


def test_stale_socket_is_replaced_and_a_live_one_refused() -> None:
    async def body() -> None:
        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "nvplugin-gpu.sock")
        # Stale: a socket file nobody listens on.
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(path)
        stale.close()
        topology = load_topology("workstation-4gpu")
        service = DevicePluginService(
            gpus_manager("nvidia.com/gpu", topology.gpus), make_policy("simple", topology)
        )
        first = PluginSocket(path, service)
        await first.start()
        assert first.intact()
        # Live: a second server on the same path is refused, and the first keeps serving.
        second = PluginSocket(path, service)
        with pytest.raises(NvpluginError, match="another live process is serving"):
            await second.start()
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            await stub.GetDevicePluginOptions(api_pb2.Empty())
        # Deleted under us (a kubelet restart): no longer intact.
        os.unlink(path)
        assert not first.intact()
        await first.stop()

    run(body)


def test_a_file_that_is_not_a_socket_is_left_alone() -> None:
    directory = tempfile.mkdtemp()
    path = os.path.join(directory, "nvplugin-gpu.sock")
    with open(path, "w") as out:
        out.write("mine")
    with pytest.raises(NvpluginError, match="exists and is not a socket"):
        claim_socket_path(path)
    with open(path) as kept:
        assert kept.read() == "mine"


def test_socket_deleted_between_bind_and_chmod_is_an_error_to_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kubelet restart can delete the socket right after gRPC bound it: start() must raise
    NvpluginError (the registrar retries it), not an OSError that would end the daemon."""

    async def body() -> None:
        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "nvplugin-gpu.sock")
        topology = load_topology("workstation-4gpu")
        service = DevicePluginService(
            gpus_manager("nvidia.com/gpu", topology.gpus), make_policy("simple", topology)
        )
        sock = PluginSocket(path, service)
        real_chmod = os.chmod

        def deleted_first(target: str, mode: int) -> None:
            os.unlink(target)  # what the kubelet does on start
            real_chmod(target, mode)

        monkeypatch.setattr("nvplugin.plugin.server.os.chmod", deleted_first)
        with pytest.raises(NvpluginError, match=r"cannot serve on .*No such file"):
            await sock.start()
        assert not sock.intact()
        monkeypatch.undo()
        await sock.start()  # the retry serves again
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            await api_pb2_grpc.DevicePluginStub(channel).GetDevicePluginOptions(api_pb2.Empty())
        service.close()
        await sock.stop()
        assert not os.path.exists(path)

    run(body)
