"""Time-slicing replicas are bounded by what the kubelet can receive: the ListAndWatch message must
fit gRPC's default 4 MiB. The bound is computed for the node and named in the error: exit 2 at
start, the running config kept on SIGHUP."""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path

import pytest

from nvplugin.api.v1beta1 import api_pb2
from nvplugin.config import ReplicatedResource, ReplicatedResources, ResourceRules, Sharing
from nvplugin.errors import InputError
from nvplugin.nodesession import load_topology
from nvplugin.rm import Replicas, plan_resources
from nvplugin.rm.devices import base_devices
from nvplugin.rm.listing import (
    KUBELET_MAX_RECEIVE_BYTES,
    device_message,
    listing_size,
    max_replicas,
)
from tests.support.serve import kubelet_with, new_dir, run_serve
from tests.support.waiting import WAIT_S

DGX2 = load_topology("dgx-2")


def slicing(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - {{name: nvidia.com/gpu, replicas: {replicas}}}\n"
    )


@pytest.mark.parametrize("replicas", [1, 2, 9, 10, 11, 99, 100, 1234])
def test_the_size_is_the_encoded_message(replicas: int) -> None:
    devices = Replicas(replicas).devices(base_devices(DGX2.gpus))
    message = api_pb2.ListAndWatchResponse(
        devices=[device_message(device, healthy=False) for device in devices]
    )
    assert listing_size(DGX2.gpus, replicas) == message.ByteSize()


def test_the_bound_is_the_largest_count_that_fits() -> None:
    fit = max_replicas(DGX2.gpus)
    assert listing_size(DGX2.gpus, fit) <= KUBELET_MAX_RECEIVE_BYTES
    assert listing_size(DGX2.gpus, fit + 1) > KUBELET_MAX_RECEIVE_BYTES
    assert 3000 < fit < 4200  # 16 GPUs: the message passes 4 MiB near 4000 replicas


def test_the_plan_refuses_more_naming_the_key_and_limit() -> None:
    fit = max_replicas(DGX2.gpus)
    rules = ResourceRules()
    ok = Sharing(ReplicatedResources(resources=(ReplicatedResource("nvidia.com/gpu", fit),)))
    assert plan_resources(DGX2.gpus, "nvidia.com/gpu", rules, ok).resources
    too_many = Sharing(
        ReplicatedResources(resources=(ReplicatedResource("nvidia.com/gpu", fit + 1),))
    )
    with pytest.raises(InputError) as caught:
        plan_resources(DGX2.gpus, "nvidia.com/gpu", rules, too_many)
    message = str(caught.value)
    assert message.startswith('config key "sharing.timeSlicing.resources[0].replicas": ')
    assert f"at most {fit} replicas fit on this node" in message
    assert str(KUBELET_MAX_RECEIVE_BYTES) in message


def test_start_exits_2_naming_the_limit() -> None:
    config_dir = new_dir()
    try:
        config = Path(config_dir) / "config.yaml"
        config.write_text(slicing(5000))
        done = run_serve(
            "--simulate", "dgx-2", "--config", str(config), "--device-plugin-dir", config_dir
        )
        assert done.returncode == 2, done.stderr
        assert "at most" in done.stderr and str(KUBELET_MAX_RECEIVE_BYTES) in done.stderr
        assert "Traceback" not in done.stderr
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)


def test_reload_keeps_the_running_config() -> None:
    async def body() -> None:
        directory, config_dir = new_dir(), new_dir()
        config = Path(config_dir) / "config.yaml"
        config.write_text(slicing(4))
        try:
            args = ("--simulate", "dgx-2", "--config", str(config))
            async with kubelet_with(directory, *args) as (kubelet, serve):
                await kubelet.wait_registered("nvidia.com/gpu", WAIT_S)
                # The registration is recorded before the stream brings the devices.
                await kubelet.observer.wait_for(
                    lambda m: len(m.healthy_devices("nvidia.com/gpu")) == 4 * 16,
                    WAIT_S,
                    "64 replicas",
                )
                config.write_text(slicing(100_000))
                serve.send(signal.SIGHUP)
                line = await serve.wait_log("config reload failed; keeping the running config")
                assert "sharing.timeSlicing.resources[0].replicas" in line["error"]
                assert "at most" in line["error"]
                assert serve.process.poll() is None
                assert kubelet.devices.is_registered("nvidia.com/gpu")
                assert len(kubelet.devices.healthy_devices("nvidia.com/gpu")) == 4 * 16
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            shutil.rmtree(config_dir, ignore_errors=True)

    asyncio.run(asyncio.wait_for(body(), 90))
