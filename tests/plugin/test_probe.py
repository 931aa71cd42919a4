"""``nvplugin probe`` against real unix sockets: a live plugin, none, a dead one, a silent one,
one that is not serving, one without a health service.

The command runs as a real subprocess (as the kubelet's exec probe runs it); the plugin side is a
small in-test ``grpc.health.v1`` servicer on a real gRPC server, so the probe is checked against
the wire protocol, not a mock. (``tests/plugin/test_healthservice.py`` probes a real
``nvplugin serve``.)
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
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.errors import NvpluginError
from nvplugin.plugin.probe import ProbeResult, probe_socket


class _Plugin(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Answers Check for "" and nvidia.com/gpu; can be told to hang, to fail or not to serve."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.release = threading.Event()
        self.fail = False
        self.serving = True
        self.calls = 0

    def Check(self, request: object, context: grpc.ServicerContext) -> object:
        self.calls += 1
        if self.hang.is_set():
            self.release.wait(30)
        if self.fail:
            context.abort(grpc.StatusCode.INTERNAL, "health is broken")
        if request.service not in ("", "nvidia.com/gpu"):  # type: ignore[attr-defined]
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        reason = "registered" if self.serving else "not registered with the kubelet"
        context.set_trailing_metadata((("nvplugin-reason", reason),))
        status = health_pb2.HealthCheckResponse
        return status(status=status.SERVING if self.serving else status.NOT_SERVING)


class _OptionsOnly(api_pb2_grpc.DevicePluginServicer):
    """A device plugin without a health service (not nvplugin, or an old one)."""

    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions()


@dataclass
class _Served:
    socket: str
    plugin: _Plugin


@pytest.fixture
def sock_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="nvp-probe-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def served(sock_dir: str) -> Iterator[_Served]:
    path = os.path.join(sock_dir, "nvplugin-gpu.sock")
    plugin = _Plugin()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    health_pb2_grpc.add_HealthServicer_to_server(plugin, server)
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


@pytest.mark.process
def test_serving_plugin_exits_0_and_reports_its_status(served: _Served) -> None:
    done = _probe("--socket", served.socket, "--timeout", "5")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"ok: {served.socket} answers the health check, SERVING: registered\n"
    assert served.plugin.calls == 1


def test_library_call_returns_the_status(served: _Served) -> None:
    assert probe_socket(served.socket, 5) == ProbeResult(
        socket=served.socket, service="", status="SERVING", reason="registered"
    )
    result = probe_socket(served.socket, 5, service="nvidia.com/gpu")
    assert result.serving and result.service == "nvidia.com/gpu"


@pytest.mark.process
def test_not_serving_exits_1_with_the_plugins_reason(served: _Served) -> None:
    served.plugin.serving = False
    done = _probe("--socket", served.socket)
    assert done.returncode == 1
    assert done.stderr == (
        f"error: plugin socket {served.socket} is NOT_SERVING: not registered with the kubelet\n"
    )


@pytest.mark.process
def test_live_accepts_any_answer(served: _Served) -> None:
    served.plugin.serving = False
    done = _probe("--socket", served.socket, "--live")
    assert done.returncode == 0, done.stderr
    assert "NOT_SERVING: not registered with the kubelet" in done.stdout
    # --live still fails when nothing answers.
    served.plugin.hang.set()
    done = _probe("--socket", served.socket, "--live", "--timeout", "0.5")
    assert done.returncode == 1
    assert "did not answer the health check within 0.5s" in done.stderr


@pytest.mark.process
def test_unknown_service_is_reported(served: _Served) -> None:
    done = _probe("--socket", served.socket, "--service", "example.com/other")
    assert done.returncode == 1
    assert "failed the health check: NOT_FOUND: unknown service" in done.stderr


@pytest.mark.process
def test_socket_without_a_health_service_says_so(sock_dir: str) -> None:
    path = os.path.join(sock_dir, "other.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_DevicePluginServicer_to_server(_OptionsOnly(), server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        done = _probe("--socket", path)
    finally:
        server.stop(grace=None).wait()
    assert done.returncode == 1
    assert "UNIMPLEMENTED" in done.stderr and "no gRPC health service" in done.stderr


@pytest.mark.process
def test_missing_socket_exits_1_naming_it(sock_dir: str) -> None:
    path = os.path.join(sock_dir, "nvplugin-gpu.sock")
    done = _probe("--socket", path)
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: no plugin socket at {path}")
    assert "Traceback" not in done.stderr


@pytest.mark.process
def test_regular_file_is_not_a_socket(sock_dir: str) -> None:
    path = Path(sock_dir) / "nvplugin-gpu.sock"
    path.write_text("")
    done = _probe("--socket", str(path))
    assert done.returncode == 1
    assert done.stderr == f"error: {path} is not a unix socket\n"


@pytest.mark.process
def test_stale_socket_without_a_listener_exits_1_at_once(sock_dir: str) -> None:
    # What a killed plugin leaves behind: the socket file, nobody listening.
    path = os.path.join(sock_dir, "nvplugin-gpu.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)
    done = _probe("--socket", path, "--timeout", "30")
    assert done.returncode == 1
    assert f"plugin socket {path} failed the health check: UNAVAILABLE" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.process
def test_listener_that_never_speaks_grpc_times_out(sock_dir: str) -> None:
    # The connection is accepted by the kernel (backlog) but no HTTP/2 answer ever comes.
    path = os.path.join(sock_dir, "nvplugin-gpu.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)
        s.listen(8)
        done = _probe("--socket", path, "--timeout", "0.5")
    assert done.returncode == 1
    assert done.stderr == (
        f"error: plugin socket {path} did not answer the health check within 0.5s\n"
    )


@pytest.mark.process
def test_wedged_plugin_times_out(served: _Served) -> None:
    served.plugin.hang.set()
    done = _probe("--socket", served.socket, "--timeout", "0.5")
    assert done.returncode == 1
    assert done.stderr == (
        f"error: plugin socket {served.socket} did not answer the health check within 0.5s\n"
    )


def test_plugin_error_is_reported_with_its_code(served: _Served) -> None:
    served.plugin.fail = True
    with pytest.raises(NvpluginError, match=r"failed the health check: INTERNAL: health is broken"):
        probe_socket(served.socket, 5)


@pytest.mark.process
@pytest.mark.parametrize("timeout", ["0", "-1", "soon"])
def test_bad_timeout_is_a_usage_error(served: _Served, timeout: str) -> None:
    done = _probe("--socket", served.socket, "--timeout", timeout)
    assert done.returncode == 2
    assert "--timeout" in done.stderr
    assert served.plugin.calls == 0
