"""The device manager's endpoint side: ListAndWatch snapshots, disconnects, and the kubelet's calls
to the plugin, over real unix sockets with a tiny in-test plugin."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterator

import grpc
import pytest

from nvplugin.fakekubelet.devicemanager import (
    DeviceInfo,
    DeviceManager,
    DevicePluginError,
    ResourceCapacity,
    go_rpc_error,
)
from nvplugin.fakekubelet.kubelet import FakeKubelet
from tests.support.tinyplugin import RESOURCE, TinyPlugin, device, register, run
from tests.support.waiting import WAIT_S as WAIT


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="nvk-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


Body = Callable[[FakeKubelet, TinyPlugin], Awaitable[None]]


def with_plugin(
    plugin_dir: str,
    plugin: TinyPlugin,
    body: Body,
    devices: DeviceManager | None = None,
) -> None:
    """Start a kubelet, serve ``plugin`` on p.sock, register it, wait for its first snapshot."""

    async def main() -> None:
        async with FakeKubelet(plugin_dir, devices=devices) as kubelet:
            await plugin.serve(os.path.join(plugin_dir, "p.sock"))
            try:
                await register(kubelet, "p.sock")
                await kubelet.wait_registered(RESOURCE, WAIT)
                await kubelet.observer.wait_for(
                    lambda _: bool(kubelet.observer.snapshots(RESOURCE)), WAIT, "the first snapshot"
                )
                await body(kubelet, plugin)
            finally:
                await plugin.stop()

    run(main())


def test_snapshots_rebuild_the_device_sets(plugin_dir: str) -> None:
    async def body(kubelet: FakeKubelet, plugin: TinyPlugin) -> None:
        dm = kubelet.devices
        obs = kubelet.observer
        assert dm.healthy_devices(RESOURCE) == {"a", "c"}
        # Only the exact string "Healthy" counts.
        assert dm.unhealthy_devices(RESOURCE) == {"b", "d", "e"}
        assert dm.device_numa(RESOURCE) == {
            "a": (0,),
            "b": (1,),
            "c": (),
            "d": (),
            "e": (0, 1),
        }
        assert dm.has_topology_alignment(RESOURCE)
        assert dm.capacity() == {RESOURCE: ResourceCapacity(capacity=5, allocatable=2)}

        # A full snapshot replaces the last: missing devices disappear, health flips.
        plugin.set_devices([device("b", numa=[1]), device("a", "Unhealthy", numa=[0])])
        await obs.wait_for(lambda _: len(obs.snapshots(RESOURCE)) == 2, WAIT, "snapshot 2")
        assert dm.healthy_devices(RESOURCE) == {"b"}
        assert dm.unhealthy_devices(RESOURCE) == {"a"}
        assert list(dm.devices(RESOURCE)) == ["b", "a"]  # the plugin's order
        assert dm.devices(RESOURCE)["a"] == DeviceInfo("a", "Unhealthy", (0,))
        assert dm.capacity()[RESOURCE] == ResourceCapacity(capacity=2, allocatable=1)

        first, second = obs.snapshots(RESOURCE)
        assert [d.id for d in first.devices] == ["a", "b", "c", "d", "e"]
        assert first.healthy == ("a", "c")
        assert second.unhealthy == ("a",)
        assert second.socket_path == os.path.join(kubelet.directory, "p.sock")

        plugin.set_devices([])
        await obs.wait_for(lambda _: len(obs.snapshots(RESOURCE)) == 3, WAIT, "snapshot 3")
        assert dm.devices(RESOURCE) == {}
        assert dm.capacity()[RESOURCE] == ResourceCapacity(capacity=0, allocatable=0)
        assert dm.is_registered(RESOURCE)

    with_plugin(
        plugin_dir,
        TinyPlugin(
            [
                device("a", numa=[0]),
                device("b", "Unhealthy", numa=[1]),
                device("c"),  # no topology
                device("d", "healthy", numa=[]),  # topology with no nodes; wrong case
                device("e", "", numa=[0, 1]),
            ]
        ),
        body,
    )


def test_no_numa_anywhere_means_no_topology_alignment(plugin_dir: str) -> None:
    async def body(kubelet: FakeKubelet, plugin: TinyPlugin) -> None:
        assert not kubelet.devices.has_topology_alignment(RESOURCE)
        assert not kubelet.devices.has_topology_alignment("example.com/unknown")

    with_plugin(plugin_dir, TinyPlugin([device("a"), device("b", numa=[])]), body)


def test_disconnect_makes_every_device_unhealthy_and_nothing_redials(plugin_dir: str) -> None:
    async def body(kubelet: FakeKubelet, plugin: TinyPlugin) -> None:
        dm = kubelet.devices
        obs = kubelet.observer
        assert dm.healthy_devices(RESOURCE) == {"a", "b"}
        await plugin.stop()
        await obs.wait_for(lambda m: not m.is_registered(RESOURCE), WAIT, "the disconnect")
        assert dm.healthy_devices(RESOURCE) == set()
        assert dm.unhealthy_devices(RESOURCE) == {"a", "b", "c"}
        assert dm.capacity() == {RESOURCE: ResourceCapacity(capacity=3, allocatable=0)}
        assert dm.options(RESOURCE) is None
        with pytest.raises(DevicePluginError, match="endpoint not found in cache"):
            await dm.allocate(RESOURCE, ["a"])

        # The plugin comes back on the same socket: the kubelet does not dial it by itself.
        await plugin.serve(os.path.join(kubelet.directory, "p.sock"))
        calls = plugin.list_and_watch_calls
        await asyncio.sleep(0.3)
        assert plugin.list_and_watch_calls == calls
        assert not dm.is_registered(RESOURCE)

        await register(kubelet, "p.sock")
        await obs.wait_for(lambda m: len(m.healthy_devices(RESOURCE)) == 2, WAIT, "re-register")
        assert dm.unhealthy_devices(RESOURCE) == {"c"}

    with_plugin(plugin_dir, TinyPlugin([device("a"), device("b"), device("c", "Unhealthy")]), body)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_resource_dropped_five_minutes_after_its_plugin_stopped(plugin_dir: str) -> None:
    clock = Clock()

    async def body(kubelet: FakeKubelet, plugin: TinyPlugin) -> None:
        dm = kubelet.devices
        obs = kubelet.observer
        clock.now = 1000.0  # registered long ago: only the time since stopping counts
        assert dm.capacity() == {RESOURCE: ResourceCapacity(capacity=1, allocatable=1)}
        await plugin.stop()
        await obs.wait_for(lambda m: not m.is_registered(RESOURCE), WAIT, "the disconnect")
        clock.now += 300
        assert dm.capacity() == {RESOURCE: ResourceCapacity(capacity=1, allocatable=0)}
        clock.now += 1
        assert dm.capacity() == {}
        assert dm.resources() == []

    with_plugin(plugin_dir, TinyPlugin([device("a")]), body, DeviceManager(clock=clock))


def test_preferred_allocation_only_when_offered(plugin_dir: str) -> None:
    async def body(kubelet: FakeKubelet, plugin: TinyPlugin) -> None:
        assert await kubelet.devices.get_preferred_allocation(RESOURCE, ["a", "b"], [], 1) is None
        assert plugin.calls == []

    with_plugin(plugin_dir, TinyPlugin([device("a"), device("b")]), body)


def test_kubelet_calls_reach_the_plugin(plugin_dir: str) -> None:
    async def body(kubelet: FakeKubelet, plugin: TinyPlugin) -> None:
        dm = kubelet.devices
        got = await dm.get_preferred_allocation(RESOURCE, ["c", "b", "a"], ["b"], 2)
        assert got == ["a", "b"]
        name, request = plugin.calls[-1]
        assert name == "GetPreferredAllocation"
        [creq] = request.container_requests
        assert list(creq.available_deviceIDs) == ["c", "b", "a"]
        assert list(creq.must_include_deviceIDs) == ["b"]
        assert creq.allocation_size == 2

        with pytest.raises(DevicePluginError) as info:
            await dm.get_preferred_allocation(RESOURCE, ["a"], [], -1)
        assert str(info.value) == (
            "device plugin GetPreferredAllocation rpc failed with err: "
            "rpc error: code = InvalidArgument desc = negative allocation size"
        )

        response = await dm.allocate(RESOURCE, ["a", "b"])
        assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "a,b"}
        with pytest.raises(DevicePluginError) as info:
            await dm.allocate(RESOURCE, ["a", "zz"])
        assert str(info.value) == "rpc error: code = InvalidArgument desc = unknown device zz"

        assert await dm.pre_start_container(RESOURCE, ["a", "b"])
        name, request = plugin.calls[-1]
        assert (name, list(request.devices_ids)) == ("PreStartContainer", ["a", "b"])

    with_plugin(
        plugin_dir,
        TinyPlugin([device("a"), device("b"), device("c")], gpa=True, pre_start=True),
        body,
    )


def test_pre_start_skipped_unless_required(plugin_dir: str) -> None:
    async def body(kubelet: FakeKubelet, plugin: TinyPlugin) -> None:
        assert not await kubelet.devices.pre_start_container(RESOURCE, ["a"])
        assert plugin.calls == []

    with_plugin(plugin_dir, TinyPlugin([device("a")]), body)


def test_wait_for_times_out_with_the_state(plugin_dir: str) -> None:
    async def body(kubelet: FakeKubelet, plugin: TinyPlugin) -> None:
        with pytest.raises(TimeoutError) as info:
            await kubelet.observer.wait_for(lambda m: False, 0.05, "the impossible")
        message = str(info.value)
        assert "waiting for the impossible" in message
        assert "healthy=['a']" in message

    with_plugin(plugin_dir, TinyPlugin([device("a")]), body)


def test_go_rpc_error_format() -> None:
    error = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "connection refused")
    assert go_rpc_error(error) == "rpc error: code = Unavailable desc = connection refused"
