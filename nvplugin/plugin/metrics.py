"""Prometheus metrics: what the plugin did, for the operator who was not watching its log.

Off by default: only ``nvplugin.metrics.address`` (``--metrics-address host:port``) starts the
HTTP endpoint, and it binds exactly that address -- nothing is exposed on a node the user did not
ask for. It is served from the daemon's event loop with bounded connections
(:mod:`nvplugin.plugin.httpendpoint`): idle clients cost no thread.

The collectors live in a private :class:`CollectorRegistry` owned by one :class:`Metrics` object
per daemon (no global registry: two daemons in one test process never share counters, and
nothing a library registers globally leaks into our endpoint).

Series (``resource`` is the extended resource name):

- ``nvplugin_devices{resource,health}``: advertised devices by health (Healthy / Unhealthy);
- ``nvplugin_registrations_total{resource}``: successful Register calls with the kubelet;
- ``nvplugin_kubelet_restarts_total{resource}``: kubelet restarts seen (a registration lost);
- ``nvplugin_rpcs_total{resource,method,code}`` and
  ``nvplugin_rpc_duration_seconds{resource,method,code}``: every RPC served on the plugin socket
  (device plugin and health service), by gRPC method and status code; streams are counted when
  they end, and only unary calls go into the latency histogram (a stream's lifetime is no latency);
- ``nvplugin_xid_events_total{gpu,xid}``: Xid events NVML delivered, ignored ones included;
- ``nvplugin_gpu_unhealthy{gpu,signal}``: 1 while that reason makes GPU ``gpu`` Unhealthy, 0
  once it no longer does (``signal``: ``xid``, ``lost``, ``nvml``, ``fabric``, ``ecc``,
  ``row-remap``, ``nvlink``, ``pcie``, ``cordon``; a series appears with its first fault);
- ``nvplugin_health_serving{resource}``: 1 while the gRPC health service reports SERVING;
- ``nvplugin_config_selected{config,why}``: under per-node selection, 1 for the config running
  and why it was chosen (``label``, ``default``, ``fallback-named``/``-single``/``-empty``,
  ``none``);
- ``nvplugin_config_rejected_total{reason}``: per-node choices not applied, the running config
  kept (``unknown``: the label or DEFAULT_CONFIG names no config; ``no-fallback``; ``invalid``:
  the file does not load; ``not-served``; ``unreadable``: the directory, or one of more than
  1000 entries).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from nvplugin.api import HEALTHY, UNHEALTHY
from nvplugin.plugin.httpendpoint import HttpEndpoint, Response

LATENCY_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Seconds. A GetPreferredAllocation answers in well under a millisecond; the top buckets catch a
policy still being computed at start."""


class Metrics:
    """Every collector, in a private registry. Methods are cheap and thread-safe."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.devices = Gauge(
            "nvplugin_devices",
            "Devices advertised to the kubelet, by health.",
            ["resource", "health"],
            registry=r,
        )
        self.registrations = Counter(
            "nvplugin_registrations",
            "Successful registrations with the kubelet.",
            ["resource"],
            registry=r,
        )
        self.kubelet_restarts = Counter(
            "nvplugin_kubelet_restarts",
            "Kubelet restarts seen (a registration lost; the plugin registers again).",
            ["resource"],
            registry=r,
        )
        self.rpcs = Counter(
            "nvplugin_rpcs",
            "RPCs served on the plugin socket, by method and status code.",
            ["resource", "method", "code"],
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "nvplugin_rpc_duration_seconds",
            "Time to answer a unary RPC on the plugin socket, by method and status code.",
            ["resource", "method", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.xids = Counter(
            "nvplugin_xid_events",
            "Xid events delivered by NVML, by GPU index and Xid (ignored ones included).",
            ["gpu", "xid"],
            registry=r,
        )
        self.gpu_unhealthy = Gauge(
            "nvplugin_gpu_unhealthy",
            "1 while this reason makes the GPU Unhealthy.",
            ["gpu", "signal"],
            registry=r,
        )
        self._reasons_lock = threading.Lock()
        self._reason_series: set[tuple[str, str]] = set()
        self.serving = Gauge(
            "nvplugin_health_serving",
            "1 while the gRPC health service reports SERVING, else 0.",
            ["resource"],
            registry=r,
        )
        self.config = Gauge(
            "nvplugin_config_selected",
            "Per-node selection: 1 for the config running, by name and why it was chosen.",
            ["config", "why"],
            registry=r,
        )
        self.node_feature_writes = Counter(
            "nvplugin_node_feature_writes",
            "The node's NodeFeature object brought in line with its labels, by result "
            "(created, updated, unchanged).",
            ["result"],
            registry=r,
        )
        self.node_feature_failures = Counter(
            "nvplugin_node_feature_failures",
            "Attempts to publish the node's NodeFeature object that failed (retried with backoff).",
            registry=r,
        )
        self.topology_writes = Counter(
            "nvplugin_topology_writes",
            "The node's NodeResourceTopology object written, by result (created, updated).",
            ["result"],
            registry=r,
        )
        self.topology_failures = Counter(
            "nvplugin_topology_failures",
            "Attempts to read the pod resources API or write the NodeResourceTopology object "
            "that failed (retried with backoff), by what failed (podresources, api).",
            ["what"],
            registry=r,
        )
        self.config_rejections = Counter(
            "nvplugin_config_rejected",
            "Per-node config choices not applied (the running config kept), by reason.",
            ["reason"],
            registry=r,
        )

    # --- what the daemon reports ---

    def observe_health(
        self,
        resource: str,
        health: Mapping[int, bool],
        devices_per_gpu: int | Mapping[int, int] = 1,
    ) -> None:
        """``health`` is per GPU; each GPU is ``devices_per_gpu`` devices (time-slicing
        replicas), or as many as the mapping says for it (MIG devices, their replicas)."""

        def count(gpu: int) -> int:
            if isinstance(devices_per_gpu, int):
                return devices_per_gpu
            return devices_per_gpu.get(gpu, 0)

        healthy = sum(count(gpu) for gpu, ok in health.items() if ok)
        unhealthy = sum(count(gpu) for gpu, ok in health.items() if not ok)
        self.devices.labels(resource, HEALTHY).set(healthy)
        self.devices.labels(resource, UNHEALTHY).set(unhealthy)

    def gpu_reasons(self, reasons: Mapping[int, Mapping[str, str]]) -> None:
        """Each GPU's reasons now (the health monitor's ``on_reasons``): 1 for each, 0 for a
        series whose reason is gone."""
        with self._reasons_lock:
            now = {(str(gpu), kind) for gpu, kinds in reasons.items() for kind in kinds}
            for labels in self._reason_series - now:
                self.gpu_unhealthy.labels(*labels).set(0)
            for labels in now:
                self.gpu_unhealthy.labels(*labels).set(1)
            self._reason_series |= now

    def registered(self, resource: str) -> None:
        self.registrations.labels(resource).inc()

    def kubelet_restarted(self, resource: str) -> None:
        self.kubelet_restarts.labels(resource).inc()

    def xid(self, gpu: int, xid: int) -> None:
        self.xids.labels(str(gpu), str(xid)).inc()

    def set_serving(self, resource: str, serving: bool) -> None:
        self.serving.labels(resource).set(1 if serving else 0)

    def config_selected(self, name: str, why: str) -> None:
        self.config.clear()
        self.config.labels(name, why).set(1)

    def config_rejected(self, reason: str) -> None:
        self.config_rejections.labels(reason).inc()

    def node_feature_written(self, result: str) -> None:
        self.node_feature_writes.labels(result).inc()

    def node_feature_failed(self) -> None:
        self.node_feature_failures.inc()

    def topology_written(self, result: str) -> None:
        self.topology_writes.labels(result).inc()

    def topology_failed(self, what: str) -> None:
        self.topology_failures.labels(what).inc()

    def forget(self, resource: str) -> None:
        """Drop the gauges of a resource no longer served (after a reload renamed it); counters
        stay, as Prometheus expects of counters."""
        for health in (HEALTHY, UNHEALTHY):
            self._remove(self.devices, resource, health)
        self._remove(self.serving, resource)

    @staticmethod
    def _remove(gauge: Gauge, *labels: str) -> None:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)

    def interceptor(self, resource: str) -> grpc.aio.ServerInterceptor:
        """A server interceptor counting and timing every RPC for ``resource``'s socket."""
        return _RpcInterceptor(self, resource)

    def exposition(self) -> str:
        """The text a scrape gets."""
        return generate_latest(self.registry).decode()


class _RpcInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps each unary and server-streaming handler; other kinds pass through untouched."""

    def __init__(self, metrics: Metrics, resource: str) -> None:
        self._metrics = metrics
        self._resource = resource

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = str(handler_call_details.method).rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(handler.unary_stream, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _record(self, method: str, code: str, seconds: float | None) -> None:
        self._metrics.rpcs.labels(self._resource, method, code).inc()
        if seconds is not None:
            self._metrics.rpc_seconds.labels(self._resource, method, code).observe(seconds)

    def _unary(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
        async def call(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            code = "OK"
            try:
                return await behaviour(request, context)
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except BaseException:
                code = _code_of(context, default="UNKNOWN")
                raise
            finally:
                if code == "OK":
                    code = _code_of(context, default="OK")
                self._record(method, code, time.perf_counter() - started)

        return call

    def _stream(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
        async def call(request: Any, context: Any) -> AsyncIterator[Any]:
            code = "OK"
            try:
                async for message in behaviour(request, context):
                    yield message
            except (asyncio.CancelledError, GeneratorExit):
                code = "CANCELLED"
                raise
            except BaseException:
                code = _code_of(context, default="UNKNOWN")
                raise
            finally:
                if code == "OK":
                    code = _code_of(context, default="OK")
                self._record(method, code, None)

        return call


def _code_of(context: Any, default: str) -> str:
    """The status code the handler set (abort or set_code), by name; ``default`` when none."""
    try:
        code = context.code()
    except Exception:
        return default
    if code is None:
        return default
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return str(status.name)
    return default


def metrics_endpoint(address: str, metrics: Metrics) -> HttpEndpoint:
    """``/metrics`` (``metrics``' private registry) on exactly ``address``; not started. Served
    from the event loop, connections bounded (:mod:`nvplugin.plugin.httpendpoint`)."""

    def scrape() -> Response:
        return Response(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)

    return HttpEndpoint("metrics", address, {"/metrics": scrape})
