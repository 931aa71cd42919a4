"""The standard gRPC health service (``grpc.health.v1.Health``) on the plugin socket.

Why a health service and not just "the socket answers": a plugin can answer every RPC while being
useless to the node -- not registered with the kubelet (a "zombie" that advertises nothing), or
registered with every GPU Unhealthy. The kubelet cannot tell; a readiness probe can, if the plugin
says so. So the status is:

- NOT_SERVING while the plugin is not registered with the kubelet (before the first registration,
  and from a kubelet restart until it registers again);
- NOT_SERVING while no advertised GPU is Healthy (``not_serving_without_healthy_gpus``, on by
  default; off: a registered plugin is SERVING whatever its GPUs' health);
- SERVING otherwise.

Both the overall service ``""`` and the resource name (``nvidia.com/gpu``) report it; other names
are NOT_FOUND (Check) / SERVICE_UNKNOWN (Watch), as the protocol says. Check also sends the reason
in the trailing metadata key ``nvplugin-reason``, so ``nvplugin probe`` can say *why* a plugin is
not serving. Everything runs on the event loop: ``set_*`` must be called there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nvplugin.config import HealthServiceConfig
from nvplugin.errors import shortened
from nvplugin.log import get_logger
from nvplugin.plugin.httpendpoint import Response

SERVING: int = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
REASON_KEY = "nvplugin-reason"
"""Trailing-metadata key of Check answers: why the status is what it is (ASCII, one line)."""

STATUS_NAMES = {SERVING: "SERVING", NOT_SERVING: "NOT_SERVING", SERVICE_UNKNOWN: "SERVICE_UNKNOWN"}


class PluginHealthService(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """``grpc.health.v1.Health`` for one plugin socket (one resource)."""

    def __init__(
        self,
        resource_name: str,
        settings: HealthServiceConfig | None = None,
        *,
        on_status: Callable[[bool], None] | None = None,
    ) -> None:
        self.resource_name = resource_name
        self._names = ("", resource_name)
        self._settings = settings if settings is not None else HealthServiceConfig()
        self._on_status = on_status
        self._registered = False
        self._healthy = 0
        self._total = 0
        self._status = NOT_SERVING
        self._reason = self._explain()
        self._changed = asyncio.Event()
        self._closing = False
        self._log = get_logger("nvplugin.healthservice", resource=resource_name)

    # --- state (event loop only) ---

    @property
    def status(self) -> int:
        return self._status

    @property
    def serving(self) -> bool:
        return self._status == SERVING

    @property
    def reason(self) -> str:
        return self._reason

    def set_registered(self, registered: bool) -> None:
        self._registered = registered
        self._update()

    def set_health(self, health: Mapping[int, bool]) -> None:
        """Take the resource's health map (GPU index -> healthy)."""
        self._healthy = sum(1 for healthy in health.values() if healthy)
        self._total = len(health)
        self._update()

    def set_settings(self, settings: HealthServiceConfig) -> None:
        self._settings = settings
        self._update()

    def close(self) -> None:
        """End every Watch stream (status OK); Check keeps answering until the server stops."""
        self._closing = True
        self._wake()

    def _explain(self) -> str:
        gpus = f"{self._healthy} of {self._total} GPUs healthy"
        if not self._registered:
            return f"not registered with the kubelet ({gpus})"
        if self._healthy == 0 and self._settings.not_serving_without_healthy_gpus:
            return f"registered, but no healthy GPU ({gpus})"
        return f"registered with the kubelet, {gpus}"

    def _update(self) -> None:
        registered_ok = self._registered
        gpus_ok = self._healthy > 0 or not self._settings.not_serving_without_healthy_gpus
        status = SERVING if registered_ok and gpus_ok else NOT_SERVING
        self._reason = self._explain()
        if status == self._status:
            return
        self._status = status
        self._log.info("health service status", status=STATUS_NAMES[status], reason=self._reason)
        if self._on_status is not None:
            self._on_status(status == SERVING)
        self._wake()

    def _wake(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    # --- RPCs ---

    async def Check(self, request: Any, context: Any) -> Any:
        if request.service not in self._names:
            shown = shortened(request.service, MAX_SHOWN_SERVICE)
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f'unknown service "{shown}": this socket reports "" and "{self.resource_name}"',
            )
        context.set_trailing_metadata(((REASON_KEY, self._reason),))
        return health_pb2.HealthCheckResponse(status=self._status)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        known = request.service in self._names
        sent: int | None = None
        while not self._closing:
            status = self._status if known else SERVICE_UNKNOWN
            if status != sent:
                sent = status
                yield health_pb2.HealthCheckResponse(status=status)
                continue
            await self._changed.wait()

    async def List(self, request: Any, context: Any) -> Any:
        response = health_pb2.HealthListResponse()
        for name in self._names:
            response.statuses[name].status = self._status
        return response


MAX_SHOWN_SERVICE = 64
"""Longest requested service name quoted whole in an error (it comes from the client)."""


def add_to_server(service: PluginHealthService, server: grpc.aio.Server) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(service, server)


def probe_response(services: Sequence[PluginHealthService], *, live: bool) -> Response:
    """The kubelet's httpGet probes (``/livez``, ``/readyz``) over the same statuses: one line
    per served socket, e.g. ``nvidia.com/gpu: SERVING: registered with the kubelet, 8 of 8 GPUs
    healthy``.

    Ready (200) while one of them is SERVING, as ``nvplugin probe`` passes on the first socket
    SERVING; else 503. Live: 200 whenever the daemon answers -- this runs on its event loop, so
    an answer means the loop turns; a plugin whose GPUs fell off the bus shows NotReady and is
    not restarted in a loop for it.
    """
    lines = [
        f"{service.resource_name}: {STATUS_NAMES[service.status]}: {service.reason}"
        for service in services
    ] or ["no plugin socket yet: discovering GPUs"]
    ready = any(service.serving for service in services)
    status = 200 if live or ready else 503
    verdict = "live" if live else ("ready" if ready else "not ready")
    return Response(status, "\n".join([verdict, *lines, ""]).encode())
