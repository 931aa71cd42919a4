"""The fake kubelet's Registration service on ``<dir>/kubelet.sock``
(docs/kubelet-behaviour.md#registration).

``Register`` checks, in the kubelet's order and with its error texts: the API version, the
resource name (the one copy of the rule, :mod:`nvplugin.resourcenames`), then -- without
validating ``endpoint`` -- dials ``<dir>/<endpoint>`` (blocking, 10 s), reads the plugin's options
and hands the connection to the :class:`~nvplugin.fakekubelet.devicemanager.manager.DeviceManager`,
which rejects a second live registration of the same (resource, socket) and starts ListAndWatch.
Errors travel as plain gRPC errors (status UNKNOWN carrying the message), as the Go kubelet's do.
Every request, with its answer, is reported to ``on_register`` (a :class:`RegistrationRecord`).
"""

from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import structlog

from nvplugin.api import KUBELET_SOCKET, SUPPORTED_VERSIONS
from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from nvplugin.fakekubelet.devicemanager.endpoint import (
    DIAL_TIMEOUT_S,
    DevicePluginError,
    Endpoint,
    PluginOptions,
)
from nvplugin.fakekubelet.devicemanager.manager import DeviceManager
from nvplugin.fakekubelet.topologymanager.options import go_quote
from nvplugin.resourcenames import is_extended_resource_name

_log = structlog.get_logger("nvplugin.fakekubelet.registration")


@dataclass(frozen=True)
class RegistrationRecord:
    """One Register request the kubelet received, and how it was answered (error None = OK)."""

    version: str
    endpoint: str
    resource_name: str
    options: PluginOptions | None  # req.options as sent (the kubelet ignores them)
    socket_path: str
    error: str | None
    received_at: float  # time.monotonic()


OnRegister = Callable[[RegistrationRecord], None]


def check_request(version: str, resource_name: str) -> str | None:
    """The kubelet's first two Register checks; the error text, or None when both pass."""
    if version not in SUPPORTED_VERSIONS:
        supported = "[" + " ".join(go_quote(v) for v in SUPPORTED_VERSIONS) + "]"
        return (
            f"requested API version {go_quote(version)} is not supported by kubelet. "
            f"Supported version is {supported}"
        )
    if not is_extended_resource_name(resource_name):
        return f"the ResourceName {go_quote(resource_name)} is invalid"
    return None


def plugin_socket_path(directory: str, endpoint: str) -> str:
    """``filepath.Join(dir, endpoint)``: joined and cleaned, an absolute endpoint included."""
    return posixpath.normpath(f"{directory}/{endpoint}")


class _RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    def __init__(
        self,
        directory: str,
        manager: DeviceManager,
        dial_timeout_s: float,
        on_register: OnRegister | None,
    ) -> None:
        self._directory = directory
        self._manager = manager
        self._dial_timeout_s = dial_timeout_s
        self._on_register = on_register

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.Empty:
        socket_path = plugin_socket_path(self._directory, request.endpoint)
        error = await self._register(request, socket_path)

        requested = (
            PluginOptions.from_proto(request.options) if request.HasField("options") else None
        )
        if self._on_register is not None:
            self._on_register(
                RegistrationRecord(
                    version=request.version,
                    endpoint=request.endpoint,
                    resource_name=request.resource_name,
                    options=requested,
                    socket_path=socket_path,
                    error=error,
                    received_at=time.monotonic(),
                )
            )
        if error is not None:
            _log.warning(
                "registration rejected",
                resource=request.resource_name,
                endpoint=request.endpoint,
                error=error,
            )
            await context.abort(grpc.StatusCode.UNKNOWN, error)
        return api_pb2.Empty()

    async def _register(self, request: api_pb2.RegisterRequest, socket_path: str) -> str | None:
        error = check_request(request.version, request.resource_name)
        if error is not None:
            return error
        try:
            endpoint = await Endpoint.connect(
                request.resource_name, socket_path, dial_timeout_s=self._dial_timeout_s
            )
        except DevicePluginError as exc:
            return str(exc)
        try:
            self._manager.plugin_connected(endpoint)
        except DevicePluginError as exc:
            await endpoint.close()
            return str(exc)
        return None


class RegistrationServer:
    """Serves Registration for ``manager`` on ``<directory>/kubelet.sock``; each request, with
    its answer, goes to ``on_register``."""

    def __init__(
        self,
        directory: str,
        manager: DeviceManager,
        *,
        socket_name: str = KUBELET_SOCKET,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        on_register: OnRegister | None = None,
    ) -> None:
        self.directory = directory
        self.socket_path = os.path.join(directory, socket_name)
        self._manager = manager
        self._dial_timeout_s = dial_timeout_s
        self._on_register = on_register
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        if self._server is not None:
            return
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(
            _RegistrationServicer(
                self.directory, self._manager, self._dial_timeout_s, self._on_register
            ),
            server,
        )
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        _log.info("kubelet registration serving", socket=self.socket_path)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
