"""``nvplugin probe`` against real unix sockets: a live plugin, none, a dead one, a silent one.

The command runs as a real subprocess (as the kubelet's exec probe runs it); the plugin side is a
small in-test DevicePlugin servicer on a real gRPC server, so the probe is checked against the
wire protocol, not a mock.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from nvplugin.errors import NvpluginError
from nvplugin.plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.plugin.probe import ProbeResult, probe_socket


class _Plugin(api_pb2_grpc.DevicePluginServicer):
    """Answers GetDevicePluginOptions; can be told to hang or to fail."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.release = threading.Event()
        self.fail = False
        self.calls = 0

    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        self.calls += 1
        if self.hang.is_set():
            self.release.wait(30)
        if self.fail:
            context.abort(grpc.StatusCode.INTERNAL, "options are broken")
        return api_pb2.DevicePluginOptions(
            pre_start_required=True, get_preferred_allocation_available=True
        )


@dataclass
class _Served:
    socket: str
    plugin: _Plugin


@pytest.fixture
def sock_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(dir="/tmp", prefix="nvp-probe-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def served(sock_dir: str) -> Iterator[_Served]:
    path = os.path.join(sock_dir, "nvplugin-gpu.sock")
    plugin = _Plugin()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        yield _Served(path, plugin)
    finally:
        plugin.release.set()
        server.stop(grace=None).wait()


def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", "probe", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_answering_plugin_exits_0_and_reports_its_options(served: _Served) -> None:
    done = _probe("--socket", served.socket, "--timeout", "5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ok: {served.socket} answers GetDevicePluginOptions")
    assert "pre_start_required=true" in done.stdout
    assert "get_preferred_allocation_available=true" in done.stdout
    assert served.plugin.calls == 1


def test_library_call_returns_the_options(served: _Served) -> None:
    assert probe_socket(served.socket, 5) == ProbeResult(
        socket=served.socket, pre_start_required=True, get_preferred_allocation_available=True
    )


def test_missing_socket_exits_1_naming_it(sock_dir: str) -> None:
    path = os.path.join(sock_dir, "nvplugin-gpu.sock")
    done = _probe("--socket", path)
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: no plugin socket at {path}")
    assert "Traceback" not in done.stderr


def test_regular_file_is_not_a_socket(sock_dir: str) -> None:
    path = Path(sock_dir) / "nvplugin-gpu.sock"
    path.write_text("")
    done = _probe("--socket", str(path))
    assert done.returncode == 1
    assert done.stderr == f"error: {path} is not a unix socket\n"


def test_stale_socket_without_a_listener_exits_1_at_once(sock_dir: str) -> None:
    # What a killed plugin leaves behind: the socket file, nobody listening.
    path = os.path.join(sock_dir, "nvplugin-gpu.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)
    done = _probe("--socket", path, "--timeout", "30")
    assert done.returncode == 1
    assert f"plugin socket {path} failed GetDevicePluginOptions: UNAVAILABLE" in done.stderr
    assert "Traceback" not in done.stderr


def test_listener_that_never_speaks_grpc_times_out(sock_dir: str) -> None:
    # The connection is accepted by the kernel (backlog) but no HTTP/2 answer ever comes.
    path = os.path.join(sock_dir, "nvplugin-gpu.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)
        s.listen(8)
        done = _probe("--socket", path, "--timeout", "0.5")
    assert done.returncode == 1
    assert done.stderr == (
        f"error: plugin socket {path} did not answer GetDevicePluginOptions within 0.5s\n"
    )


def test_wedged_plugin_times_out(served: _Served) -> None:
    served.plugin.hang.set()
    done = _probe("--socket", served.socket, "--timeout", "0.5")
    assert done.returncode == 1
    assert done.stderr == (
        f"error: plugin socket {served.socket} did not answer GetDevicePluginOptions within 0.5s\n"
    )


def test_plugin_error_is_reported_with_its_code(served: _Served) -> None:
    served.plugin.fail = True
    with pytest.raises(NvpluginError, match=r"failed GetDevicePluginOptions: INTERNAL: options"):
        probe_socket(served.socket, 5)


@pytest.mark.parametrize("timeout", ["0", "-1", "soon"])
def test_bad_timeout_is_a_usage_error(served: _Served, timeout: str) -> None:
    done = _probe("--socket", served.socket, "--timeout", timeout)
    assert done.returncode == 2
    assert "--timeout" in done.stderr
    assert served.plugin.calls == 0
