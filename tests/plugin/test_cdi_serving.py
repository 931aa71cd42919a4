"""The daemon and its CDI spec when the spec cannot be whole (a driver root without libcuda):
failOnInitError true refuses to start, naming the file and what is missing, before anything is
served; false serves on without writing it. On a daemon in process."""

from __future__ import annotations

import asyncio
import os
import tempfile

import pytest

from nvplugin.cdi.generate import SpecIncomplete, refresh
from nvplugin.config import Config, load_config
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.nodesession import NodeSession, open_node
from nvplugin.plugin.daemon import Daemon
from nvplugin.rm import plan_for
from tests.support.service import write_config
from tests.support.waiting import WAIT_S

NODE = "workstation-4gpu"
SPEC = "k8s.device-plugin.nvidia.com-gpu.json"


def without_libcuda(simulate: str | None) -> NodeSession:
    """The simulated node, its driver root lacking the CUDA library."""
    node = open_node(simulate)
    assert node.driver_root is not None
    libdir = os.path.join(node.driver_root, "usr/lib/x86_64-linux-gnu")
    for name in os.listdir(libdir):
        if name.startswith("libcuda.so."):
            os.unlink(os.path.join(libdir, name))
    return node


def config(directory: str, specs: str, fail: bool) -> Config:
    flags = {
        "nvplugin.devicePluginDir": directory,
        "nvplugin.cdi.specDir": specs,
        "flags.plugin.deviceListStrategy": "cdi-cri",
        "flags.failOnInitError": fail,
    }
    return load_config(None, flags=flags, env={})


def test_with_fail_on_init_error_the_start_fails_naming_what_is_missing() -> None:
    async def body() -> None:
        directory, specs = tempfile.mkdtemp(), tempfile.mkdtemp()
        daemon = Daemon(config(directory, specs, True), simulate=NODE, opener=without_libcuda)
        with pytest.raises(SpecIncomplete) as caught:
            await daemon.run(handle_signals=False)
        message = str(caught.value)
        assert f"cannot make the CDI spec {specs}/{SPEC} whole" in message
        assert "library libcuda.so.<driver version>" in message
        assert os.listdir(specs) == []
        assert not [n for n in os.listdir(directory) if n.endswith(".sock")]

    asyncio.run(asyncio.wait_for(body(), 30))


def test_without_fail_on_init_error_it_serves_without_the_spec() -> None:
    async def body() -> None:
        directory, specs = tempfile.mkdtemp(), tempfile.mkdtemp()
        daemon = Daemon(config(directory, specs, False), simulate=NODE, opener=without_libcuda)
        async with FakeKubelet(directory) as kubelet:
            task = asyncio.create_task(daemon.run(handle_signals=False))
            await kubelet.wait_registered("nvidia.com/gpu", WAIT_S)
            assert os.listdir(specs) == []
            daemon.stop()
            assert await task == 0

    asyncio.run(asyncio.wait_for(body(), 30))


def test_a_whole_spec_is_written_before_registering() -> None:
    async def body() -> None:
        directory, specs = tempfile.mkdtemp(), tempfile.mkdtemp()
        daemon = Daemon(config(directory, specs, True), simulate=NODE, opener=open_node)
        async with FakeKubelet(directory) as kubelet:
            task = asyncio.create_task(daemon.run(handle_signals=False))
            await kubelet.wait_registered("nvidia.com/gpu", WAIT_S)
            assert os.listdir(specs) == [SPEC]
            daemon.stop()
            assert await task == 0
        assert os.listdir(specs) == [SPEC]  # the spec stays: containers running keep using it

    asyncio.run(asyncio.wait_for(body(), 30))


def test_no_spec_without_a_served_device() -> None:
    """Every GPU excluded: no name is handed out, and a spec without devices is not valid CDI,
    so none is written."""
    specs = tempfile.mkdtemp()
    path = write_config("version: v1\nresources:\n  exclude:\n    models: ['*']\n")
    cfg = load_config(path, env={"DEVICE_LIST_STRATEGY": "cdi-cri"})
    with open_node(NODE) as node:
        plan = plan_for(cfg, node.topology.gpus)
        assert plan.resources == ()
        done = refresh(cfg, plan, node.topology, "550.127.05", node.driver_root, specs)
    assert done == (os.path.join(specs, SPEC), False)
    assert os.listdir(specs) == []
