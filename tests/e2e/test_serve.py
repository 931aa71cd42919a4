"""``nvplugin serve`` as a real subprocess against the fake kubelet: registration, topology,
health, kubelet restarts, preferred allocation, config errors, signals and socket ownership."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvplugin.allocator import make_policy
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.fakekubelet.devicemanager import DevicePluginError
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.nodefile.reader import builtin_names
from nvplugin.nodesession import load_topology
from tests.support.serve import Serve, kubelet_with, new_dir, node_file, run_serve
from tests.support.waiting import WAIT_S, until

GPU = "nvidia.com/gpu"
SOCKET = "nvplugin-gpu.sock"


def run(body: Callable[[], Awaitable[None]], timeout: float = 90) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


class Streams:
    """Plain ListAndWatch clients on the plugin socket, besides the kubelet's own stream."""

    def __init__(self, path: str, count: int) -> None:
        self.channels = [grpc.aio.insecure_channel(f"unix:{path}") for _ in range(count)]
        self.states: list[list[tuple[str, ...]]] = [[] for _ in range(count)]
        self._tasks = [
            asyncio.create_task(self._read(channel, states))
            for channel, states in zip(self.channels, self.states, strict=True)
        ]

    @staticmethod
    async def _read(channel: grpc.aio.Channel, states: list[tuple[str, ...]]) -> None:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        async for message in stub.ListAndWatch(api_pb2.Empty()):
            states.append(tuple(d.ID for d in message.devices if d.health != "Healthy"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for channel in self.channels:
            await channel.close()


def distinct(states: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Consecutive duplicates removed: the sequence of health states a client went through."""
    out: list[tuple[str, ...]] = []
    for state in states:
        if not out or out[-1] != state:
            out.append(state)
    return out


# --- registration and the device list --------------------------------------------------------


def test_register_fields_options_and_list() -> None:
    async def body() -> None:
        directory = new_dir()
        plugin_args = ("--simulate", "dgx-1", "--pre-start-required")
        async with kubelet_with(directory, *plugin_args) as (kubelet, serve):
            await kubelet.wait_registered(GPU, WAIT_S)
            record = kubelet.observer.registrations[-1]
            assert record.version == "v1beta1"
            assert record.endpoint == SOCKET
            assert record.resource_name == GPU
            assert record.error is None
            assert record.options is not None and record.options.pre_start_required
            assert record.options.get_preferred_allocation_available
            options = kubelet.devices.options(GPU)
            assert options is not None
            assert options.pre_start_required and options.get_preferred_allocation_available
            topology = load_topology("dgx-1")
            await kubelet.observer.wait_for(
                lambda m: len(m.healthy_devices(GPU)) == 8, WAIT_S, "8 healthy GPUs"
            )
            snapshot = kubelet.observer.snapshots(GPU)[-1]
            assert [d.id for d in snapshot.devices] == [g.uuid for g in topology.gpus]
            path = os.path.join(directory, SOCKET)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            assert await kubelet.devices.pre_start_container(GPU, [topology.gpus[0].uuid])
            started = serve.events("effective config")
            assert len(started) == 1
            assert started[0]["config"]["nvplugin"]["preStartRequired"] is True
            assert started[0]["level"] == "info"

    run(body)


def test_numa_topology_of_every_built_in_node() -> None:
    """One plugin per built-in node, each under its own resource name, one kubelet."""

    async def body() -> None:
        directory = new_dir()
        nodes = builtin_names()
        assert len(nodes) >= 7
        async with FakeKubelet(directory) as kubelet:
            serves = [
                Serve(directory, "--simulate", node, "--resource-name", f"example.com/{node}")
                for node in nodes
            ]
            try:
                for node in nodes:
                    resource = f"example.com/{node}"
                    await kubelet.wait_registered(resource, WAIT_S)
                    topology = load_topology(node)
                    count = len(topology.gpus)
                    await kubelet.observer.wait_for(
                        lambda m, r=resource, n=count: len(m.devices(r)) == n,
                        WAIT_S,
                        f"{node}'s devices",
                    )
                    expected = {
                        g.uuid: (() if g.numa_node is None else (g.numa_node,))
                        for g in topology.gpus
                    }
                    assert kubelet.devices.device_numa(resource) == expected
                    has_numa = any(g.numa_node is not None for g in topology.gpus)
                    assert kubelet.devices.has_topology_alignment(resource) == has_numa
                    ids = [d.id for d in kubelet.observer.snapshots(resource)[-1].devices]
                    assert ids == [g.uuid for g in topology.gpus]
                    socket = os.path.join(directory, f"nvplugin-{node}.sock")
                    assert os.path.exists(socket)
                assert not kubelet.devices.has_topology_alignment("example.com/no-numa")
            finally:
                for serve in serves:
                    serve.send(signal.SIGTERM)
                assert [serve.wait() for serve in serves] == [0] * len(nodes)

    run(body)


# --- health ---------------------------------------------------------------------------------


async def health_states(
    events: list[dict[str, Any]], expected_count: int, *args: str, streams: int = 0
) -> tuple[list[str], list[tuple[str, ...]], list[list[tuple[str, ...]]]]:
    """Serve workstation-4gpu with scripted ``events``; wait until the kubelet has seen
    ``expected_count`` distinct health states. Returns the UUIDs, the kubelet's states, and those
    of ``streams`` extra ListAndWatch clients."""
    directory = new_dir()
    node = node_file(new_dir(), "workstation-4gpu", events)
    uuids = [g.uuid for g in load_topology(node).gpus]
    async with kubelet_with(directory, "--simulate", node, *args) as (kubelet, serve):
        await kubelet.wait_registered(GPU, WAIT_S)
        extra = Streams(os.path.join(directory, SOCKET), streams)
        await kubelet.observer.wait_for(
            lambda _: (
                len(distinct([s.unhealthy for s in kubelet.observer.snapshots(GPU)]))
                >= expected_count
            ),
            WAIT_S,
            f"{expected_count} health states",
        )
        await asyncio.sleep(0.3)  # anything more would be a wrong extra state
        await extra.close()
        seen = distinct([s.unhealthy for s in kubelet.observer.snapshots(GPU)])
        assert serve.events("device health changed")
    return uuids, seen, [distinct(states) for states in extra.states]


def test_scripted_xids_and_lost_gpus_reach_every_stream() -> None:
    """An ignored Xid changes nothing; a critical Xid and a lost GPU mark exactly that GPU, on
    the kubelet's stream and on every other open stream."""

    async def body() -> None:
        events = [
            {"after_s": 2.5, "gpu": 0, "xid": 13},  # ignored by default
            {"after_s": 2.8, "gpu": 1, "xid": 48},  # double-bit ECC: critical
            {"after_s": 3.1, "gpu": 0, "xid": 31},  # ignored by default
            {"after_s": 3.4, "gpu": 2, "lost": True},
        ]
        uuids, seen, streams = await health_states(events, 3, streams=2)
        expected = [(), (uuids[1],), (uuids[1], uuids[2])]
        assert seen == expected
        assert streams == [expected, expected]

    run(body)


def test_failing_event_wait_marks_all_until_waits_work_again() -> None:
    async def body() -> None:
        events = [
            {"after_s": 2.5, "gpu": 1, "xid": 79},  # fallen off the bus
            {"after_s": 3.0, "wait_error": True, "for_s": 0.6},
        ]
        uuids, seen, streams = await health_states(events, 4, streams=1)
        expected = [(), (uuids[1],), tuple(uuids), (uuids[1],)]
        assert seen == expected
        assert streams == [expected]

    run(body)


def test_failing_event_wait_with_a_lost_gpu() -> None:
    """After the wait works again, a GPU lost before it stays Unhealthy, the others recover."""

    async def body() -> None:
        events = [
            {"after_s": 2.5, "gpu": 2, "lost": True},
            {"after_s": 3.0, "wait_error": True, "for_s": 0.6},
        ]
        uuids, seen, _ = await health_states(events, 4)
        assert seen == [(), (uuids[2],), tuple(uuids), (uuids[2],)]

    run(body, timeout=30)


def test_recovery_and_configured_xids() -> None:
    """With recovery on, a lost GPU comes back once its probe succeeds again; config makes Xid 13
    critical and Xid 48 ignored."""

    async def body() -> None:
        directory = new_dir()
        events = [
            {"after_s": 2.0, "gpu": 0, "xid": 48},  # ignored by this config
            {"after_s": 2.3, "gpu": 3, "xid": 13},  # critical by this config
            {"after_s": 2.6, "gpu": 1, "lost": True},
            {"after_s": 3.4, "gpu": 1, "recover": True},
        ]
        node = node_file(new_dir(), "workstation-4gpu", events)
        uuids = [g.uuid for g in load_topology(node).gpus]
        config = Path(new_dir()) / "config.yaml"
        config.write_text(
            "version: v1\nnvplugin:\n  health:\n    xids: {ignore: [48], critical: [13]}\n"
            "    recovery: {quietPeriod: 500ms}\n"
        )
        plugin_args = ("--simulate", node, "--config", str(config))
        async with kubelet_with(directory, *plugin_args) as (kubelet, _):
            await kubelet.wait_registered(GPU, WAIT_S)
            await kubelet.observer.wait_for(
                lambda _: (
                    len(distinct([s.unhealthy for s in kubelet.observer.snapshots(GPU)])) >= 5
                ),
                WAIT_S,
                "GPUs 3 and 1 unhealthy, then recovered",
            )
            seen = distinct([s.unhealthy for s in kubelet.observer.snapshots(GPU)])
            assert seen == [
                (),
                (uuids[3],),
                (uuids[1], uuids[3]),
                (uuids[1],),  # 3 was not lost: it recovers after 0.5 s quiet
                (),  # 1 recovers once its probe works again
            ]

    run(body)


def test_health_disabled_ignores_every_event() -> None:
    async def body() -> None:
        directory = new_dir()
        node = node_file(new_dir(), "workstation-4gpu", [{"after_s": 0.1, "gpu": 1, "xid": 48}])
        config = Path(new_dir()) / "config.yaml"
        config.write_text("version: v1\nnvplugin:\n  health: {enabled: false}\n")
        plugin_args = ("--simulate", node, "--config", str(config))
        async with kubelet_with(directory, *plugin_args) as (kubelet, _):
            await kubelet.wait_registered(GPU, WAIT_S)
            await kubelet.observer.wait_for(
                lambda m: len(m.healthy_devices(GPU)) == 4, WAIT_S, "4 healthy GPUs"
            )
            await asyncio.sleep(1.0)  # the Xid (0.1 s after start) must change nothing
            assert kubelet.devices.unhealthy_devices(GPU) == frozenset()
            assert len(kubelet.devices.healthy_devices(GPU)) == 4

    run(body)


# --- kubelet restarts ----------------------------------------------------------------------------


def test_kubelet_restarts_twenty_times() -> None:
    async def body() -> None:
        directory = new_dir()
        async with kubelet_with(directory, "--simulate", "dgx-a100") as (kubelet, serve):
            await kubelet.wait_registered(GPU, WAIT_S)
            fds: list[int] = []
            for n in range(20):
                await kubelet.restart()
                await kubelet.wait_registered(GPU, WAIT_S)
                await kubelet.observer.wait_for(
                    lambda m: len(m.healthy_devices(GPU)) == 8, WAIT_S, "8 healthy GPUs"
                )
                await serve.wait_log(
                    "registered with kubelet", where=lambda e, n=n: e["registrations"] == n + 2
                )
                fds.append(await serve.settled_fds())
            records = kubelet.observer.registrations
            assert len(records) == 21
            assert all(r.error is None for r in records)
            tasks = [e["tasks"] for e in serve.events("registered with kubelet")]
            assert len(tasks) == 21
            # No leaks: a leak of one fd or task per restart would add 15 between the first
            # and the last five restarts. Counts taken mid-handshake vary by a few (a
            # connection being set up or torn down), so compare the fewest seen late with
            # the most seen early, with room for that noise but not for a steady leak.
            assert min(tasks[-5:]) <= max(tasks[1:6]) + 2, tasks
            assert min(fds[-5:]) <= max(fds[:5]) + 2, fds
            # Still answers, on the new socket.
            pref = await kubelet.devices.get_preferred_allocation(
                GPU, sorted(kubelet.devices.healthy_devices(GPU)), [], 2
            )
            assert pref is not None and len(pref) == 2

    run(body)


def test_kubelet_started_after_the_plugin() -> None:
    async def body() -> None:
        directory = new_dir()
        serve = Serve(directory, "--simulate", "workstation-4gpu")
        try:
            await serve.wait_log("waiting for the kubelet")
            await asyncio.sleep(2.0)  # the plugin backs off meanwhile
            assert not serve.events("registered with kubelet")
            async with FakeKubelet(directory) as kubelet:
                await kubelet.wait_registered(GPU, WAIT_S)
        finally:
            assert serve.stop() == 0

    run(body)


# --- requests -------------------------------------------------------------------------------------


def test_preferred_allocation_and_allocate_through_the_kubelet() -> None:
    async def body() -> None:
        directory = new_dir()
        topology = load_topology("dgx-2")
        policy = make_policy("best-effort", topology)
        uuid = [g.uuid for g in topology.gpus]
        async with kubelet_with(directory, "--simulate", "dgx-2") as (kubelet, serve):
            await kubelet.wait_registered(GPU, WAIT_S)
            dm = kubelet.devices
            for available, must, size in [
                (range(16), [], 4),
                (range(16), [], 7),
                ([0, 3, 5, 6, 9, 12, 13], [5], 3),
                (range(16), [15, 0], 8),
            ]:
                got = await dm.get_preferred_allocation(
                    GPU, [uuid[i] for i in available], [uuid[i] for i in must], size
                )
                assert got == [uuid[i] for i in policy.allocate(list(available), must, size)]
            assert await dm.get_preferred_allocation(GPU, uuid[:2], [], 3) == []
            with pytest.raises(DevicePluginError) as caught:
                await dm.get_preferred_allocation(GPU, [*uuid[:2], "GPU-nope"], [], 1)
            assert "unknown device GPU-nope" in str(caught.value)
            with pytest.raises(DevicePluginError) as caught:
                await dm.get_preferred_allocation(GPU, uuid[:2], [uuid[5]], 1)
            assert f"device {uuid[5]} is not in available_deviceIDs" in str(caught.value)
            response = await dm.allocate(GPU, [uuid[9], uuid[3]])
            assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{uuid[3]},{uuid[9]}"}
            with pytest.raises(DevicePluginError) as caught:
                await dm.allocate(GPU, [uuid[1], "GPU-gone"])
            assert "unknown device GPU-gone" in str(caught.value)
            assert serve.process.poll() is None  # bad requests never kill the daemon

    run(body)


# --- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "args", "expected"),
    [
        (
            "nvplugin:\n  resourceNme: a/b\n",
            [],
            'unknown key "nvplugin.resourceNme"; did you mean',
        ),
        (
            "nvplugin:\n  health:\n    enabled: yes please\n",
            [],
            'key "nvplugin.health.enabled": expected',
        ),
        (
            "nvplugin:\n  resourceName: gpu\n",
            [],
            'key "nvplugin.resourceName": the ResourceName "gpu"',
        ),
        (None, ["--resource-name", "kubernetes.io/gpu"], "flag --resource-name"),
        (None, ["--config", "/tmp/nvplugin-missing/config.yaml"], "no such file"),
        (None, ["--log-level", "loud"], "flag --log-level"),
    ],
)
def test_bad_config_exits_2_naming_the_key(
    config: str | None, args: list[str], expected: str
) -> None:
    directory = new_dir()
    extra = list(args)
    if config is not None:
        path = Path(new_dir()) / "config.yaml"
        path.write_text(config)
        extra += ["--config", str(path)]
    result = run_serve("--simulate", "workstation-4gpu", "--device-plugin-dir", directory, *extra)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ")
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert os.listdir(directory) == []


def test_bad_environment_exits_2() -> None:
    directory = new_dir()
    env = {**os.environ, "NVPLUGIN_ALLOCATION_POLICY": "random"}
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "nvplugin", "serve", "--device-plugin-dir", directory],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert result.returncode == 2
    assert "NVPLUGIN_ALLOCATION_POLICY" in result.stderr and "'random'" in result.stderr


def test_sighup_reloads_and_registers_the_new_config() -> None:
    async def body() -> None:
        directory = new_dir()
        config = Path(new_dir()) / "config.yaml"
        config.write_text("nvplugin:\n  resourceName: example.com/gpu\n")
        async with FakeKubelet(directory) as kubelet:
            serve = Serve(directory, "--simulate", "dgx-1", "--config", str(config))
            try:
                await kubelet.wait_registered("example.com/gpu", WAIT_S)
                config.write_text(
                    "nvplugin:\n  resourceName: example.com/tensor\n  preStartRequired: true\n"
                )
                serve.send(signal.SIGHUP)
                await kubelet.wait_registered("example.com/tensor", WAIT_S)
                assert kubelet.devices.options("example.com/tensor").pre_start_required  # type: ignore[union-attr]
                assert not os.path.exists(os.path.join(directory, SOCKET))
                assert os.path.exists(os.path.join(directory, "nvplugin-tensor.sock"))
                # A broken file on reload: logged, the running config kept.
                config.write_text("nvplugin:\n  resourceNam: x/y\n")
                serve.send(signal.SIGHUP)
                line = await serve.wait_log("config reload failed; keeping the running config")
                assert 'unknown key "nvplugin.resourceNam"' in line["error"]
                assert serve.process.poll() is None
                assert os.path.exists(os.path.join(directory, "nvplugin-tensor.sock"))
            finally:
                assert serve.stop() == 0
            assert not os.path.exists(os.path.join(directory, "nvplugin-tensor.sock"))

    run(body)


# --- lifecycle --------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly(sig: int) -> None:
    async def body() -> None:
        directory = new_dir()
        async with FakeKubelet(directory) as kubelet:
            serve = Serve(directory, "--simulate", "dgx-h100")
            await kubelet.wait_registered(GPU, WAIT_S)
            path = os.path.join(directory, SOCKET)
            assert os.path.exists(path)
            serve.send(sig)
            assert await asyncio.to_thread(serve.wait, 5) == 0
            assert not os.path.exists(path)
            assert os.path.exists(kubelet.socket_path)  # the kubelet's socket is not ours
            await kubelet.observer.wait_for(
                lambda m: not m.is_registered(GPU), WAIT_S, "the stream to end"
            )
            assert "Traceback" not in serve.text()

    run(body)


def test_second_serve_on_the_same_socket_exits_1() -> None:
    async def body() -> None:
        directory = new_dir()
        async with kubelet_with(directory, "--simulate", "workstation-4gpu") as (kubelet, first):
            await kubelet.wait_registered(GPU, WAIT_S)
            path = os.path.join(directory, SOCKET)
            inode = os.stat(path).st_ino
            result = await asyncio.to_thread(
                run_serve, "--simulate", "workstation-4gpu", "--device-plugin-dir", directory
            )
            assert result.returncode == 1, result.stderr
            assert f"another live process is serving {path}" in result.stderr
            assert "Traceback" not in result.stderr
            assert os.stat(path).st_ino == inode
            assert first.process.poll() is None
            async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=WAIT_S)
            assert kubelet.devices.is_registered(GPU)
            assert len(kubelet.observer.registrations) == 1

    run(body)


def test_a_device_plugin_dir_that_cannot_be_created_exits_1() -> None:
    blocker = Path(new_dir()) / "a-file"
    blocker.write_text("")
    result = run_serve("--simulate", "workstation-4gpu", "--device-plugin-dir", str(blocker))
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"error: cannot create the device-plugin directory {blocker}: File exists"
    assert "Traceback" not in result.stderr


def test_stale_socket_is_replaced() -> None:
    import socket as sockets

    directory = new_dir()
    path = os.path.join(directory, SOCKET)
    stale = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    stale.bind(path)
    stale.close()

    async def body() -> None:
        serve = Serve(directory, "--simulate", "workstation-4gpu")
        try:
            await serve.wait_log("serving")
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        finally:
            assert serve.stop() == 0

    run(body)


def _nvml_loads() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_nvml_init_failure() -> None:
    """Real NVML: on a machine without it, exit 1 with the reason (or keep running with
    --fail-on-init-error=false). On a machine with a GPU, serve comes up instead."""
    directory = new_dir()
    if _nvml_loads():
        result: Any = None
    else:
        result = run_serve("--device-plugin-dir", directory)
        assert result.returncode == 1
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("error: NVML library libnvidia-ml.so.1 not found")
        assert "Traceback" not in result.stderr

    async def body() -> None:
        serve = Serve(directory, "--fail-on-init-error=false", "--discovery-retry-s", "0.2")
        path = os.path.join(directory, SOCKET)
        try:
            if result is None:
                await serve.wait_log("serving")
                return
            failed = "nvml init failed; running with no devices"
            await until(lambda: len(serve.events(failed)) >= 2, "a retry of the failed init")
            # Unregistered, but alive for the chart's liveness probe: NOT_SERVING, not absent.
            assert (
                len(
                    serve.events("serving the health service only (unregistered) until GPUs appear")
                )
                == 1
            )
            probe = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "nvplugin", "probe", "--live", "--socket", path],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert probe.returncode == 0, probe.stderr
            assert "NOT_SERVING: not registered with the kubelet" in probe.stdout
        finally:
            assert serve.stop() == 0
        assert not os.path.exists(path)

    run(body)
