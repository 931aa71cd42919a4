"""The fake kubelet's Registration service and directory handling, over real unix sockets.

A tiny in-test DevicePlugin servicer stands in for the plugin (the real ``nvplugin serve`` is
driven against FakeKubelet by the plugin's e2e tests)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from nvplugin.api.v1beta1 import api_pb2
from nvplugin.fakekubelet.devicemanager import PluginOptions
from nvplugin.fakekubelet.kubelet import FakeKubelet, remove_sockets
from tests.support.tinyplugin import RESOURCE, TinyPlugin, device, register, run
from tests.support.waiting import WAIT_S as WAIT
from tests.support.waiting import until


async def register_error(kubelet: FakeKubelet, endpoint: str, **kwargs: Any) -> str:
    """Register, expecting refusal; the error message (the status must be UNKNOWN, as Go's)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await register(kubelet, endpoint, **kwargs)
    assert info.value.code() == grpc.StatusCode.UNKNOWN
    return info.value.details() or ""


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="nvk-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_register_dials_back_reads_options_and_watches(plugin_dir: str) -> None:
    async def main() -> None:
        plugin = TinyPlugin([device("GPU-a", numa=[0]), device("GPU-b", numa=[1])], gpa=True)
        async with FakeKubelet(plugin_dir) as kubelet:
            await plugin.serve(os.path.join(plugin_dir, "p.sock"))
            sent = api_pb2.DevicePluginOptions(pre_start_required=True)
            await register(kubelet, "p.sock", options=sent)
            endpoint = await kubelet.wait_registered(RESOURCE, WAIT)
            assert endpoint.socket_path == os.path.join(plugin_dir, "p.sock")
            dm = kubelet.devices
            obs = kubelet.observer
            # The kubelet asks for the options; what the request carried is ignored.
            assert dm.options(RESOURCE) == PluginOptions(get_preferred_allocation_available=True)
            await obs.wait_for(lambda _: bool(obs.snapshots(RESOURCE)), WAIT, "a snapshot")
            assert dm.healthy_devices(RESOURCE) == {"GPU-a", "GPU-b"}
            assert dm.device_numa(RESOURCE) == {"GPU-a": (0,), "GPU-b": (1,)}
            [record] = obs.registrations
            assert (record.version, record.endpoint, record.resource_name, record.error) == (
                "v1beta1",
                "p.sock",
                RESOURCE,
                None,
            )
            assert record.options == PluginOptions(pre_start_required=True)
            assert plugin.list_and_watch_calls == 1
        await plugin.stop()

    run(main())


VERSION_ERRORS = [
    ("v1alpha", 'requested API version "v1alpha" is not supported by kubelet. '
     'Supported version is ["v1beta1"]'),
    ("", 'requested API version "" is not supported by kubelet. Supported version is ["v1beta1"]'),
    ("V1beta1", 'requested API version "V1beta1" is not supported by kubelet. '
     'Supported version is ["v1beta1"]'),
]  # fmt: skip


@pytest.mark.parametrize(("version", "message"), VERSION_ERRORS)
def test_register_rejects_other_versions(plugin_dir: str, version: str, message: str) -> None:
    async def main() -> None:
        async with FakeKubelet(plugin_dir) as kubelet:
            # The version is checked first: a bad name and a missing socket do not matter.
            error = await register_error(
                kubelet, "missing.sock", version=version, resource="not a name"
            )
            assert error == message
            assert kubelet.observer.registrations[0].error == message

    run(main())


@pytest.mark.parametrize(
    "name",
    [
        "gpu",  # no "/"
        "kubernetes.io/gpu",
        "requests.nvidia.com/gpu",
        "nvidia.com/-gpu",
        "nvidia.com/gpu-",
        "nvidia.com/",
        "/gpu",
        "Nvidia.com/gpu",
        "nvidia.com/g/pu",
        "nvidia.com/" + "g" * 64,
        "",
    ],
)
def test_register_rejects_invalid_resource_names(plugin_dir: str, name: str) -> None:
    async def main() -> None:
        async with FakeKubelet(plugin_dir) as kubelet:
            # Checked before dialling: the missing socket is never tried.
            error = await register_error(kubelet, "missing.sock", resource=name)
            assert error == f'the ResourceName "{name}" is invalid'
            assert not kubelet.devices.is_registered(name)

    run(main())


@pytest.mark.parametrize("name", ["nvidia.com/gpu", "example.com/a_b.c-d", "a/" + "b" * 63])
def test_register_accepts_valid_resource_names(plugin_dir: str, name: str) -> None:
    async def main() -> None:
        plugin = TinyPlugin([device("d0")])
        async with FakeKubelet(plugin_dir) as kubelet:
            await plugin.serve(os.path.join(plugin_dir, "p.sock"))
            await register(kubelet, "p.sock", resource=name)
            await kubelet.wait_registered(name, WAIT)
        await plugin.stop()

    run(main())


def test_dial_failure(plugin_dir: str) -> None:
    async def main() -> None:
        with open(os.path.join(plugin_dir, "not-a-socket"), "w") as f:
            f.write("x")
        async with FakeKubelet(plugin_dir, dial_timeout_s=0.5) as kubelet:
            for endpoint in ("missing.sock", "not-a-socket"):
                error = await register_error(kubelet, endpoint)
                assert error.startswith("failed to dial device plugin: "), error
                assert os.path.join(plugin_dir, endpoint) in error
            assert not kubelet.devices.is_registered(RESOURCE)
            assert kubelet.devices.resources() == []

    run(main())


def test_options_failure_is_reported(plugin_dir: str) -> None:
    async def main() -> None:
        plugin = TinyPlugin([device("d0")], options_error="options broke")
        async with FakeKubelet(plugin_dir) as kubelet:
            await plugin.serve(os.path.join(plugin_dir, "p.sock"))
            error = await register_error(kubelet, "p.sock")
            assert error == (
                "failed to get device plugin options: "
                "rpc error: code = Internal desc = options broke"
            )
            assert not kubelet.devices.is_registered(RESOURCE)
        await plugin.stop()

    run(main())


def test_endpoint_is_joined_not_validated(plugin_dir: str) -> None:
    async def main() -> None:
        os.mkdir(os.path.join(plugin_dir, "sub"))
        plugin = TinyPlugin([device("d0")])
        async with FakeKubelet(plugin_dir) as kubelet:
            await plugin.serve(os.path.join(plugin_dir, "sub", "p.sock"))
            await register(kubelet, "sub/../sub/p.sock")
            endpoint = await kubelet.wait_registered(RESOURCE, WAIT)
            assert endpoint.socket_path == os.path.join(plugin_dir, "sub", "p.sock")
        await plugin.stop()

    run(main())


def test_same_socket_while_connected_is_rejected(plugin_dir: str) -> None:
    async def main() -> None:
        path = os.path.join(plugin_dir, "p.sock")
        plugin = TinyPlugin([device("d0"), device("d1")])
        async with FakeKubelet(plugin_dir) as kubelet:
            await plugin.serve(path)
            await register(kubelet, "p.sock")
            first = await kubelet.wait_registered(RESOURCE, WAIT)
            error = await register_error(kubelet, "p.sock")
            assert error == f"device plugin already connected: {path}"
            # The first connection is untouched and still receives updates.
            assert kubelet.devices.endpoints(RESOURCE) == (first,)
            assert first.alive
            plugin.set_devices([device("d0")])
            await kubelet.observer.wait_for(
                lambda m: m.healthy_devices(RESOURCE) == {"d0"}, WAIT, "the update"
            )
            # Once that stream has ended, the same socket may register again.
            await plugin.stop()
            await kubelet.observer.wait_for(
                lambda m: not m.is_registered(RESOURCE), WAIT, "disconnect"
            )
            await plugin.serve(path)
            await register(kubelet, "p.sock")
            await kubelet.wait_registered(RESOURCE, WAIT)
        await plugin.stop()

    run(main())


def test_other_socket_coexists_and_newest_is_primary(plugin_dir: str) -> None:
    async def main() -> None:
        old = TinyPlugin([device("d0")], gpa=True)
        new = TinyPlugin([device("d0")], gpa=True)
        async with FakeKubelet(plugin_dir) as kubelet:
            await old.serve(os.path.join(plugin_dir, "old.sock"))
            await new.serve(os.path.join(plugin_dir, "new.sock"))
            dm = kubelet.devices
            obs = kubelet.observer
            await register(kubelet, "old.sock")
            await kubelet.wait_registered(RESOURCE, WAIT)
            await register(kubelet, "new.sock")
            await obs.wait_for(lambda m: len(m.endpoints(RESOURCE)) == 2, WAIT, "2 endpoints")
            primary = dm.primary(RESOURCE)
            assert primary is not None
            assert primary.socket_path.endswith("new.sock")
            assert await dm.get_preferred_allocation(RESOURCE, ["d0"], [], 1) == ["d0"]
            assert [c[0] for c in new.calls] == ["GetPreferredAllocation"]
            assert old.calls == []
            # The primary goes away: the older one takes over, devices stay healthy.
            await new.stop()
            await obs.wait_for(lambda m: len(m.endpoints(RESOURCE)) == 1, WAIT, "1 endpoint")
            primary = dm.primary(RESOURCE)
            assert primary is not None
            assert primary.socket_path.endswith("old.sock")
            assert dm.healthy_devices(RESOURCE) == {"d0"}
            await dm.allocate(RESOURCE, ["d0"])
            assert [c[0] for c in old.calls] == ["Allocate"]
        await old.stop()

    run(main())


# --- the directory ------------------------------------------------------------------------


def bind_socket(path: str) -> None:
    """Leave a socket file at ``path`` (as a crashed process would)."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()


def test_start_creates_the_directory_mode_0750(plugin_dir: str) -> None:
    async def main() -> None:
        directory = os.path.join(plugin_dir, "a", "device-plugins")
        async with FakeKubelet(directory) as kubelet:
            assert stat.S_IMODE(os.stat(directory).st_mode) == 0o750
            assert stat.S_ISSOCK(os.stat(kubelet.socket_path).st_mode)

    run(main())


def test_start_deletes_every_socket_and_nothing_else(plugin_dir: str) -> None:
    async def main() -> None:
        for name in ("stale.sock", "kubelet.sock", "no-suffix"):
            bind_socket(os.path.join(plugin_dir, name))
        os.mkdir(os.path.join(plugin_dir, "dir.sock"))
        for name in ("kubelet_internal_checkpoint", "notes.sock"):
            with open(os.path.join(plugin_dir, name), "w") as f:
                f.write("{}")
        os.symlink("/nonexistent", os.path.join(plugin_dir, "dangling"))
        async with FakeKubelet(plugin_dir):
            names = sorted(os.listdir(plugin_dir))
            assert names == [
                "dangling",
                "dir.sock",
                "kubelet.sock",
                "kubelet_internal_checkpoint",
                "notes.sock",
            ]

    run(main())


def test_restart_deletes_sockets_keeps_files_and_drops_plugins(plugin_dir: str) -> None:
    async def main() -> None:
        path = os.path.join(plugin_dir, "p.sock")
        checkpoint = os.path.join(plugin_dir, "kubelet_internal_checkpoint")
        with open(checkpoint, "w") as f:
            f.write("{}")
        plugin = TinyPlugin([device("d0", numa=[0]), device("d1", numa=[0])])
        async with FakeKubelet(plugin_dir) as kubelet:
            await plugin.serve(path)
            dm = kubelet.devices
            obs = kubelet.observer
            await register(kubelet, "p.sock")
            await obs.wait_for(lambda m: len(m.healthy_devices(RESOURCE)) == 2, WAIT, "devices")
            # A hard link elsewhere keeps the old inode alive, so a new socket gets a new one.
            os.mkdir(os.path.join(plugin_dir, "keep"))
            os.link(kubelet.socket_path, os.path.join(plugin_dir, "keep", "old-kubelet.sock"))
            kubelet_inode = os.stat(kubelet.socket_path).st_ino
            await kubelet.restart()
            assert not os.path.exists(path)
            assert os.path.exists(checkpoint)
            assert os.stat(kubelet.socket_path).st_ino != kubelet_inode  # created again
            assert not dm.is_registered(RESOURCE)
            # Like a kubelet that read its checkpoint: the resource is known, with no devices.
            assert dm.healthy_devices(RESOURCE) == set()
            assert dm.capacity()[RESOURCE].capacity == 0
            # The plugin's stream ended with the old kubelet.
            await until(lambda: not plugin.streams, "the streams to end")
            # The plugin serves again and re-registers: all back.
            await plugin.stop()
            await plugin.serve(path)
            await register(kubelet, "p.sock")
            await kubelet.wait_registered(RESOURCE, WAIT)
            await obs.wait_for(lambda m: len(m.healthy_devices(RESOURCE)) == 2, WAIT, "devices")
            assert [r.error for r in obs.registrations] == [None, None]
        await plugin.stop()

    run(main())


def test_repeated_restarts_leak_no_fds_or_tasks(plugin_dir: str) -> None:
    async def main() -> None:
        path = os.path.join(plugin_dir, "p.sock")
        plugin = TinyPlugin([device("d0")])
        async with FakeKubelet(plugin_dir) as kubelet:

            async def cycle() -> None:
                await kubelet.restart()
                await plugin.stop()
                await plugin.serve(path)
                await register(kubelet, "p.sock")
                await kubelet.observer.wait_for(
                    lambda m: bool(m.healthy_devices(RESOURCE)), WAIT, "devices"
                )

            for _ in range(3):  # warm up gRPC's lazily created threads and fds
                await cycle()
            fds = len(os.listdir("/proc/self/fd"))
            tasks = len(asyncio.all_tasks())
            for _ in range(10):
                await cycle()
            assert len(asyncio.all_tasks()) == tasks
            assert len(os.listdir("/proc/self/fd")) <= fds + 2
        await plugin.stop()

    run(main())


def test_remove_sockets_reports_what_it_removed(plugin_dir: str) -> None:
    bind_socket(os.path.join(plugin_dir, "b.sock"))
    bind_socket(os.path.join(plugin_dir, "a"))
    assert remove_sockets(plugin_dir) == ["a", "b.sock"]
    assert os.listdir(plugin_dir) == []
