"""The device manager's checkpoint ``<dir>/kubelet_internal_checkpoint``: its format, written after
every update and allocation, read back by a restarted fake kubelet (same or new process state)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvplugin.api.v1beta1 import api_pb2
from nvplugin.fakekubelet.devicemanager import DeviceManager, ResourceCapacity
from nvplugin.fakekubelet.devicemanager import checkpoint as ckpt
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.fakekubelet.pods import Container, Pod
from tests.support.tinyplugin import RESOURCE, Hints, ScriptedPlugin, devs, register, run
from tests.support.waiting import WAIT_S as WAIT


@pytest.fixture
def directory() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="nvk-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def sample() -> ckpt.CheckpointData:
    response = api_pb2.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": "A,N"})
    entry = ckpt.PodDevicesEntry(
        "uid-1", "main", RESOURCE, {0: ("A",), -1: ("N",)}, response.SerializeToString()
    )
    return ckpt.CheckpointData((entry,), {RESOURCE: ("A", "B", "N")})


def test_format_round_trip_and_upstream_field_names(directory: str) -> None:
    ckpt.write_checkpoint(directory, sample())
    path = os.path.join(directory, "kubelet_internal_checkpoint")
    doc = json.loads(Path(path).read_text())
    assert set(doc) == {"Data", "Checksum"}
    [entry] = doc["Data"]["PodDeviceEntries"]
    assert entry["PodUID"] == "uid-1"
    assert entry["ContainerName"] == "main"
    assert entry["ResourceName"] == RESOURCE
    assert entry["DeviceIDs"] == {"-1": ["N"], "0": ["A"]}
    response = api_pb2.ContainerAllocateResponse.FromString(base64.b64decode(entry["AllocResp"]))
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "A,N"}
    assert doc["Data"]["RegisteredDevices"] == {RESOURCE: ["A", "B", "N"]}
    back = ckpt.read_checkpoint(directory)
    assert back is not None
    assert back.entries[0].all_device_ids() == {"A", "N"}
    assert dict(back.entries[0].device_ids) == {0: ("A",), -1: ("N",)}
    assert dict(back.registered_devices) == {RESOURCE: ("A", "B", "N")}


def test_missing_corrupt_and_tampered(directory: str) -> None:
    assert ckpt.read_checkpoint(directory) is None
    path = ckpt.checkpoint_path(directory)
    ckpt.write_checkpoint(directory, sample())
    doc = json.loads(Path(path).read_text())
    doc["Data"]["RegisteredDevices"][RESOURCE].append("X")
    Path(path).write_text(json.dumps(doc))
    with pytest.raises(ckpt.CheckpointError, match="checksum mismatch"):
        ckpt.read_checkpoint(directory)
    Path(path).write_text('{"Data": ')
    with pytest.raises(ckpt.CheckpointError, match="not JSON"):
        ckpt.read_checkpoint(directory)


def test_fnv32a_known_values() -> None:
    assert ckpt.fnv32a(b"") == 0x811C9DC5
    assert ckpt.fnv32a(b"a") == 0xE40C292C


def test_checkpoint_survives_kubelet_restarts(directory: str) -> None:
    hints = Hints()
    plugin = ScriptedPlugin(devs("A:0 B:0 C:1 N:-"), preferred=["A", "N"])
    pod = Pod.of("p", [Container.of("main", limits={RESOURCE: 2})])
    sock = os.path.join(directory, "p.sock")

    async def main() -> None:
        dm = DeviceManager(numa_nodes=(0, 1), store=hints, checkpoint_dir=directory)
        async with FakeKubelet(directory, devices=dm) as kubelet:
            obs = kubelet.observer
            await plugin.serve(sock)
            try:
                await register(kubelet, "p.sock")
                await obs.wait_for(lambda m: len(m.healthy_devices(RESOURCE)) == 4, WAIT, "GPUs")
                writes = dm.checkpoint_writes
                assert writes >= 1  # after the first snapshot
                await dm.allocate_container(pod, pod.containers[0])
                assert dm.checkpoint_writes == writes + 1
                data = ckpt.read_checkpoint(directory)
                assert data is not None
                [entry] = data.entries
                assert (entry.pod_uid, entry.container_name) == (pod.uid, "main")
                assert dict(entry.device_ids) == {0: ("A",), -1: ("N",)}
                assert set(data.registered_devices[RESOURCE]) == {"A", "B", "C", "N"}

                # A health change is an update: RegisteredDevices follows the healthy set.
                plugin.set_devices(devs("A:0 B:0! C:1 N:-"))
                await obs.wait_for(lambda m: len(m.healthy_devices(RESOURCE)) == 3, WAIT, "B sick")
                data = ckpt.read_checkpoint(directory)
                assert data is not None
                assert set(data.registered_devices[RESOURCE]) == {"A", "C", "N"}

                # The kubelet restarts: sockets deleted, nothing allocatable until the plugin
                # registers again, the pod keeps its devices.
                await kubelet.restart()
                assert not os.path.exists(sock)
                assert dm.capacity() == {RESOURCE: ResourceCapacity(0, 0)}
                assert dm.allocated_devices(RESOURCE) == {"A", "N"}
                await plugin.stop()
                plugin.set_devices(devs("A:0 B:0 C:1 N:-"))
                await plugin.serve(sock)
                await register(kubelet, "p.sock")
                await obs.wait_for(lambda m: len(m.healthy_devices(RESOURCE)) == 4, WAIT, "back")
                assert dm.available_devices(RESOURCE) == {"B", "C"}
            finally:
                await plugin.stop()

        # A new kubelet process: state comes from the file alone.
        fresh = DeviceManager(numa_nodes=(0, 1), store=hints, checkpoint_dir=directory)
        async with FakeKubelet(directory, devices=fresh):
            assert fresh.container_devices(pod.uid, "main", RESOURCE) == {"A", "N"}
            assert fresh.allocated_devices(RESOURCE) == {"A", "N"}
            assert fresh.is_device_plugin_resource(RESOURCE)
            assert fresh.capacity() == {RESOURCE: ResourceCapacity(0, 0)}
            entry_ = fresh.container_allocation(pod.uid, "main", RESOURCE)
            assert entry_ is not None and entry_.response is not None
            assert dict(entry_.response.envs) == {"NVIDIA_VISIBLE_DEVICES": "A,N"}

    run(main())


def test_corrupt_checkpoint_is_ignored_at_start(directory: str) -> None:
    Path(ckpt.checkpoint_path(directory)).write_text("garbage")

    async def main() -> None:
        dm = DeviceManager(checkpoint_dir=directory)
        async with FakeKubelet(directory, devices=dm):
            assert dm.allocations() == []
            assert dm.resources() == []

    run(main())


def test_default_fake_kubelet_keeps_its_checkpoint_in_the_plugin_dir(directory: str) -> None:
    plugin = ScriptedPlugin(devs("A:0 B:1"), preferred=["A"])
    pod = Pod.of("p", [Container.of("main", limits={RESOURCE: 1})])
    sock = os.path.join(directory, "p.sock")

    async def main() -> None:
        async with FakeKubelet(directory) as kubelet:
            await plugin.serve(sock)
            try:
                await register(kubelet, "p.sock")
                dm = kubelet.devices
                obs = kubelet.observer
                await obs.wait_for(lambda m: len(m.healthy_devices(RESOURCE)) == 2, WAIT, "GPUs")
                await dm.allocate_container(pod, pod.containers[0])
            finally:
                await plugin.stop()
        assert os.path.exists(ckpt.checkpoint_path(directory))
        async with FakeKubelet(directory) as again:
            assert again.devices.container_devices(pod.uid, "main", RESOURCE) == {"A"}

    run(main())
