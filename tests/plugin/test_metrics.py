"""Prometheus metrics: the address rule, the RPC interceptor on a real server, the endpoint on
127.0.0.1, and a real ``nvplugin serve`` counting registrations, kubelet restarts and Xids --
and binding nothing when metrics are off."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import urllib.request
from collections.abc import Awaitable, Callable

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nvplugin.allocator import make_policy
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.config import load_config
from nvplugin.config.rules import parse_address
from nvplugin.errors import InputError, NvpluginError
from nvplugin.nodesession import load_topology
from nvplugin.plugin.metrics import Metrics, metrics_endpoint
from nvplugin.plugin.server import DevicePluginService, PluginSocket
from tests.support.serve import Serve, kubelet_with, new_dir, node_file
from tests.support.service import gpus_manager
from tests.support.waiting import WAIT_S, until

GPU = "nvidia.com/gpu"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def run(body: Callable[[], Awaitable[None]], timeout: float = 60) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


def samples(text: str) -> Samples:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as response:
        text: str = response.read().decode()
        return text


# --- the address ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:9400", ("::1", 9400)),
        ("node.example:65535", ("node.example", 65535)),
    ],
)
def test_addresses_that_bind(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("9400", "is not host:port"),
        (":9400", "is not host:port"),
        ("::1:9400", "in brackets"),
        ("[::1:9400", "[address]"),
        ("[nope]:9400", "not an IPv6 address"),
        ("127.0.0.1:http", "port must be a number"),
        ("127.0.0.1:65536", "port must be a number"),
    ],
)
def test_addresses_refused_with_the_reason(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("[", r"\[")):
        parse_address(text)
    with pytest.raises(InputError) as caught:
        load_config(None, flags={"nvplugin.metrics.address": text})
    assert 'flag --metrics-address (config key "nvplugin.metrics.address")' in str(caught.value)


def test_off_by_default() -> None:
    assert load_config(None).metrics_address is None


# --- the interceptor and the endpoint -------------------------------------------------------------


def test_rpcs_are_counted_by_method_and_code_and_unary_ones_timed() -> None:
    async def body() -> None:
        topology = load_topology("workstation-4gpu")
        service = DevicePluginService(
            gpus_manager(GPU, topology.gpus), make_policy("simple", topology)
        )
        metrics = Metrics()
        path = os.path.join(tempfile.mkdtemp(), "nvplugin-gpu.sock")
        sock = PluginSocket(path, service, interceptors=[metrics.interceptor(GPU)])
        await sock.start()
        try:
            async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                uuid = topology.gpus[0].uuid
                for _ in range(3):
                    await stub.Allocate(
                        api_pb2.AllocateRequest(
                            container_requests=[
                                api_pb2.ContainerAllocateRequest(devices_ids=[uuid])
                            ]
                        )
                    )
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.Allocate(
                        api_pb2.AllocateRequest(
                            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["x"])]
                        )
                    )
                stream = stub.ListAndWatch(api_pb2.Empty())
                await stream.read()
                stream.cancel()
                watch = {"resource": GPU, "method": "ListAndWatch", "code": "CANCELLED"}

                def counted() -> bool:
                    return value(samples(metrics.exposition()), "nvplugin_rpcs_total", **watch) == 1

                await until(counted, "the cancelled stream counted")
        finally:
            await sock.stop()
        found = samples(metrics.exposition())
        ok = {"resource": GPU, "method": "Allocate", "code": "OK"}
        bad = {**ok, "code": "INVALID_ARGUMENT"}
        assert value(found, "nvplugin_rpcs_total", **ok) == 3
        assert value(found, "nvplugin_rpcs_total", **bad) == 1
        assert value(found, "nvplugin_rpc_duration_seconds_count", **ok) == 3
        assert value(found, "nvplugin_rpc_duration_seconds_count", **bad) == 1
        assert value(found, "nvplugin_rpcs_total", **watch) == 1
        assert value(found, "nvplugin_rpc_duration_seconds_count", **watch) is None  # no latency

    run(body)


def test_health_gauges_and_forgetting_a_resource() -> None:
    metrics = Metrics()
    metrics.observe_health(GPU, {0: True, 1: False, 2: True})
    metrics.set_serving(GPU, True)
    found = samples(metrics.exposition())
    assert value(found, "nvplugin_devices", resource=GPU, health="Healthy") == 2
    assert value(found, "nvplugin_devices", resource=GPU, health="Unhealthy") == 1
    assert value(found, "nvplugin_health_serving", resource=GPU) == 1
    metrics.registered(GPU)
    metrics.forget(GPU)
    found = samples(metrics.exposition())
    assert value(found, "nvplugin_devices", resource=GPU, health="Healthy") is None
    assert value(found, "nvplugin_registrations_total", resource=GPU) == 1  # counters stay


def test_device_gauges_count_time_sliced_replicas() -> None:
    metrics = Metrics()
    metrics.observe_health("nvidia.com/gpu.shared", {0: True, 1: False}, devices_per_gpu=4)
    found = samples(metrics.exposition())
    assert value(found, "nvplugin_devices", resource="nvidia.com/gpu.shared", health="Healthy") == 4
    assert (
        value(found, "nvplugin_devices", resource="nvidia.com/gpu.shared", health="Unhealthy") == 4
    )


def test_endpoint_serves_only_the_private_registry_on_the_given_address() -> None:
    async def body() -> None:
        metrics = Metrics()
        metrics.xid(3, 48)
        endpoint = metrics_endpoint("127.0.0.1:0", metrics)
        await endpoint.start()
        port = endpoint.port
        assert port
        try:
            text = await asyncio.to_thread(scrape, port)
            found = samples(text)
            assert value(found, "nvplugin_xid_events_total", gpu="3", xid="48") == 1
            assert "python_gc" not in text and "process_cpu" not in text  # no global collectors
            # Taken: a second endpoint on the same port fails with the address in the message.
            with pytest.raises(NvpluginError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
                await metrics_endpoint(f"127.0.0.1:{port}", Metrics()).start()
        finally:
            await endpoint.stop()
        with pytest.raises(OSError):
            await asyncio.to_thread(scrape, port)

    run(body)


# --- a real plugin -------------------------------------------------------------------------------


def _listening_tcp(pid: int) -> list[tuple[str, int]]:
    """(hex local address, port) of every TCP socket in LISTEN held by process ``pid``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                address, port = fields[1].rsplit(":", 1)
                found.append((address, int(port, 16)))
    return found


@pytest.mark.process
def test_a_real_plugin_counts_registrations_restarts_xids_and_devices() -> None:
    async def body() -> None:
        directory = new_dir()
        events = [
            {"after_s": 2.0, "gpu": 0, "xid": 13},  # ignored, still counted
            {"after_s": 2.2, "gpu": 1, "xid": 48},  # critical
        ]
        node = node_file(new_dir(), "workstation-4gpu", events)
        plugin_args = ("--simulate", node, "--metrics-address", "127.0.0.1:0")
        async with kubelet_with(directory, *plugin_args) as (kubelet, serve):
            await kubelet.wait_registered(GPU, WAIT_S)
            port = int((await serve.wait_log("serving metrics"))["port"])
            assert _listening_tcp(serve.pid) == [("0100007F", port)]  # 127.0.0.1 only
            await kubelet.observer.wait_for(
                lambda m: len(m.unhealthy_devices(GPU)) == 1, WAIT_S, "GPU 1 unhealthy"
            )
            await kubelet.restart()
            await kubelet.wait_registered(GPU, WAIT_S)
            await serve.wait_log("registered with kubelet", 5, lambda e: e["registrations"] == 2)
            found = samples(await asyncio.to_thread(scrape, port))
        assert value(found, "nvplugin_registrations_total", resource=GPU) == 2
        assert value(found, "nvplugin_kubelet_restarts_total", resource=GPU) == 1
        assert value(found, "nvplugin_xid_events_total", gpu="0", xid="13") == 1
        assert value(found, "nvplugin_xid_events_total", gpu="1", xid="48") == 1
        assert value(found, "nvplugin_devices", resource=GPU, health="Healthy") == 3
        assert value(found, "nvplugin_devices", resource=GPU, health="Unhealthy") == 1
        assert value(found, "nvplugin_health_serving", resource=GPU) == 1
        options = {"resource": GPU, "method": "GetDevicePluginOptions", "code": "OK"}
        assert (value(found, "nvplugin_rpcs_total", **options) or 0) >= 2  # one per registration

    run(body)


@pytest.mark.process
def test_no_listening_socket_without_metrics_address() -> None:
    async def body() -> None:
        directory = new_dir()
        async with kubelet_with(directory, "--simulate", "workstation-4gpu") as (kubelet, serve):
            await kubelet.wait_registered(GPU, WAIT_S)
            assert _listening_tcp(serve.pid) == []
            assert not serve.events("serving metrics")

    run(body)


@pytest.mark.process
def test_metrics_port_in_use_is_a_fatal_start_up_error() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        serve = Serve(
            new_dir(), "--simulate", "workstation-4gpu", "--metrics-address", f"127.0.0.1:{port}"
        )
        code = serve.wait(30)
    finally:
        taken.close()
    assert code == 1
    assert (
        f"error: cannot serve metrics on 127.0.0.1:{port}: Address already in use" in serve.text()
    )
    assert "Traceback" not in serve.text()


def test_gpu_unhealthy_gauge_per_gpu_and_signal() -> None:
    metrics = Metrics()

    def series() -> dict[tuple[str, str], float]:
        return {
            (s.labels["gpu"], s.labels["signal"]): s.value
            for family in text_string_to_metric_families(metrics.exposition())
            if family.name == "nvplugin_gpu_unhealthy"
            for s in family.samples
        }

    metrics.gpu_reasons({1: {"fabric": "fabric in-progress", "cordon": "cordoned"}})
    assert series() == {("1", "fabric"): 1.0, ("1", "cordon"): 1.0}
    metrics.gpu_reasons({1: {"cordon": "cordoned"}, 3: {"pcie": "PCIe replays rose by 9"}})
    assert series() == {("1", "fabric"): 0.0, ("1", "cordon"): 1.0, ("3", "pcie"): 1.0}
    metrics.gpu_reasons({})
    assert set(series().values()) == {0.0}
