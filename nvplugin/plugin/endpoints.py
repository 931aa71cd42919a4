"""The daemon's two HTTP endpoints, each on its configured address or off: ``/metrics``
(``nvplugin.metrics.address``) and the kubelet's probes ``/livez`` and ``/readyz``
(``nvplugin.healthProbes.address``). Both run on the event loop (:mod:`.httpendpoint`)."""

from __future__ import annotations

from nvplugin.config import Config
from nvplugin.errors import NvpluginError
from nvplugin.log import get_logger
from nvplugin.plugin.httpendpoint import Handler, HttpEndpoint
from nvplugin.plugin.metrics import Metrics, metrics_endpoint

METRICS = "metrics"
PROBES = "health probes"
KINDS = (PROBES, METRICS)
"""In start order: the probes first, so that the startup probe passes as soon as the process
answers."""


def endpoint_address(config: Config, kind: str) -> str | None:
    """Where ``config`` serves ``kind`` (None: off)."""
    return config.metrics_address if kind == METRICS else config.health_probe_address


class Endpoints:
    """The endpoints being served, by kind (absent when off)."""

    def __init__(self, metrics: Metrics, livez: Handler, readyz: Handler) -> None:
        self._metrics = metrics
        self._probes = {"/livez": livez, "/readyz": readyz}
        self._serving: dict[str, HttpEndpoint] = {}
        self._log = get_logger("nvplugin.daemon")

    def port(self, kind: str) -> int | None:
        """The port ``kind`` is served on (None: off)."""
        endpoint = self._serving.get(kind)
        return endpoint.port if endpoint is not None else None

    async def start(self, config: Config) -> None:
        """Serve every endpoint ``config`` turns on; NvpluginError when one cannot bind."""
        for kind in KINDS:
            await self._start(kind, endpoint_address(config, kind))

    async def move(self, kind: str, address: str | None) -> None:
        """Serve ``kind`` on ``address`` instead (a reload, or its rollback): off if it cannot
        bind there, which is logged (the daemon serves on)."""
        await self._stop(kind)
        try:
            await self._start(kind, address)
        except NvpluginError as exc:
            self._log.error(
                f"{kind} off: cannot serve its address", address=address, error=str(exc)
            )

    async def stop(self) -> None:
        for kind in reversed(KINDS):
            await self._stop(kind)

    async def _start(self, kind: str, address: str | None) -> None:
        if address is None:
            return
        endpoint = (
            metrics_endpoint(address, self._metrics)
            if kind == METRICS
            else HttpEndpoint(kind, address, self._probes)
        )
        await endpoint.start()
        self._serving[kind] = endpoint

    async def _stop(self, kind: str) -> None:
        endpoint = self._serving.pop(kind, None)
        if endpoint is not None:
            await endpoint.stop()
