"""When ``nvplugin admit`` counts its plugin ready: every socket in the private directory has
registered and sent its device list (over real sockets, with tiny in-test plugins); and a run
with MPS leaves no control daemon behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from nvplugin.admit.admission import (
    Admission,
    AdmitSettings,
    device_allocatable,
    plugin_sockets,
    serving_everything,
)
from nvplugin.fakekubelet.devicemanager import DeviceManager
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.fakekubelet.lifecycle import NodeResources, resource_fit
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.nodesession import load_topology
from nvplugin.plugin.mps import daemon_pids
from tests.support.tinyplugin import (
    RESOURCE,
    Hints,
    ScriptedPlugin,
    TinyPlugin,
    device,
    devs,
    register,
    run,
)
from tests.support.waiting import WAIT_S as WAIT


def test_ready_once_every_socket_registered_and_listed() -> None:
    directory = tempfile.mkdtemp(prefix="nva-")

    async def main() -> None:
        first, second = TinyPlugin([device("a")]), TinyPlugin([device("b")])
        async with FakeKubelet(directory) as kubelet:
            obs = kubelet.observer

            def ready() -> bool:
                return serving_everything(directory, kubelet.devices, obs)

            assert plugin_sockets(directory) == [] and not ready()
            await first.serve(os.path.join(directory, "first.sock"))
            await second.serve(os.path.join(directory, "second.sock"))
            try:
                assert plugin_sockets(directory) == [
                    os.path.join(directory, name) for name in ("first.sock", "second.sock")
                ]
                await register(kubelet, "first.sock", resource="example.com/first")
                await obs.wait_for(lambda _: bool(obs.snapshots("example.com/first")), WAIT)
                assert not ready()  # the second socket has not registered yet
                await register(kubelet, "second.sock", resource="example.com/second")
                await obs.wait_for(lambda _: ready(), WAIT, "both registered and listed")
            finally:
                await first.stop()
                await second.stop()

    try:
        run(main())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_the_plugin_is_told_only_what_the_user_said() -> None:
    assert AdmitSettings().plugin_args() == []
    settings = AdmitSettings(simulate="dgx-1", config="c.yaml", mig_strategy="mixed")
    assert settings.plugin_args() == [
        *("--simulate", "dgx-1"),
        *("--config", "c.yaml"),
        *("--mig-strategy", "mixed"),
    ]


@pytest.mark.process  # runs nvplugin serve and the simulated nvidia-cuda-mps-control
def test_a_run_with_mps_leaves_no_daemon_behind() -> None:
    """The plugin leaves its MPS daemon running when it stops; a run, which has no next plugin
    and removes its MPS root, stops it (nvplugin mps stop) before the root goes."""
    config_dir = tempfile.mkdtemp()
    config = Path(config_dir, "mps.yaml")
    config.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n"
        "      replicas: 2\n"
    )

    async def main() -> None:
        settings = AdmitSettings(simulate="dgx-1", config=str(config))
        admission = Admission(settings, load_topology("dgx-1"))
        pipe = os.path.join(admission.mps_root, "nvidia.com/gpu", "pipe")
        async with admission:
            assert len(daemon_pids(pipe)) == 1  # registered: its daemon is ready
        assert daemon_pids(pipe) == []
        assert not os.path.exists(admission.directory)

    try:
        run(main())
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)


def test_a_pod_holding_devices_that_turned_unhealthy_does_not_starve_the_next() -> None:
    """Measured on the real kubelet 1.32: two GPUs, pod A holds the first, it
    turns unhealthy, pod B asks for one: both are admitted. The device manager allocates B's GPU
    before the fit and raises the allocatable to what is allocated (A's and B's), so the fit
    sees 2, not the 1 healthy GPU."""
    directory = tempfile.mkdtemp(prefix="nva-")

    async def main() -> None:
        devices = DeviceManager(numa_nodes=(0,), store=Hints())
        plugin = ScriptedPlugin(devs("A:0 B:0"))
        async with FakeKubelet(directory, devices=devices) as kubelet:
            await plugin.serve(os.path.join(directory, "p.sock"))
            try:
                await register(kubelet, "p.sock")
                seen = kubelet.observer
                await seen.wait_for(lambda _: bool(seen.snapshots(RESOURCE)), WAIT, "a list")
                first = Pod.of("a", [Container.of("c", limits={RESOURCE: 1})])
                await devices.allocate_container(first, first.containers[0])
                (held,) = devices.container_devices(first.uid, "c", RESOURCE) or ()
                plugin.set_devices(devs(f"{held}:0! {'B' if held == 'A' else 'A'}:0"))
                await seen.wait_for(
                    lambda m: m.capacity()[RESOURCE].allocatable == 1, WAIT, "the update"
                )
                second = Pod.of("b", [Container.of("c", limits={RESOURCE: 1})])
                await devices.allocate_container(second, second.containers[0])
                extended = device_allocatable(devices)
                assert extended == {RESOURCE: 2}
                node = NodeResources(milli_cpu=8000, memory=None, extended=extended)
                assert resource_fit(second, [first], node).admit
            finally:
                await plugin.stop()

    try:
        run(main())
    finally:
        shutil.rmtree(directory, ignore_errors=True)
