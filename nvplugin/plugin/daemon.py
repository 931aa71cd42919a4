"""``nvplugin serve``: the daemon's life from discovery to the last socket removed.

Start: log the effective config once, open the node (NVML, real or simulated; discovery happens
once, here), then per resource start the service and its socket, the health monitor and the
registrar. The allocation policy's tables are computed on a worker thread while the plugin
registers, so a 16-GPU node is advertised without waiting for them.

Signals: SIGTERM/SIGINT stop serving, end every ListAndWatch stream, remove our sockets and
return 0. SIGHUP reloads the config (same file, flags and environment), rebuilds the resources
and registers them again; a config that no longer loads is logged and the running one kept. A
reload that changes only log, health rules, health service or metrics is applied in place: the
sockets, the kubelet's streams and the registrations stay, so no request fails meanwhile.

Observability: each socket also serves the gRPC health service (registered and a healthy GPU:
SERVING), every RPC goes through the metrics interceptor, ``nvplugin.metrics.address`` (off by
default) serves the daemon's private Prometheus registry, and ``nvplugin.healthProbes.address``
(off by default; the chart turns it on) serves the same statuses over HTTP for the kubelet's
probes: ``/livez`` (the daemon answers) and ``/readyz`` (a resource is SERVING). Both HTTP
endpoints run on the event loop and start before anything else, so the startup probe passes at
once.

Exit 1 after start only when a socket the kubelet removed cannot be served again (the registrar
gives up): a plugin that nobody can reach must be restarted, not kept as a zombie.

NVML failing at start: with ``flags.failOnInitError`` the error propagates (the CLI prints it and
exits 1); without, the daemon keeps running with no devices, retries discovery every
``discovery_retry_s`` seconds and registers once GPUs appear. Meanwhile (and while NVML finds no
GPU) it serves its socket unregistered, so that the health service answers probes NOT_SERVING
instead of the liveness probe finding no socket and restarting the plugin in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nvplugin.allocator import Policy
from nvplugin.config import Config
from nvplugin.errors import InputError, NvpluginError, reason
from nvplugin.log import configure, get_logger
from nvplugin.node import NodeSession, open_node
from nvplugin.node.health import HealthMonitor
from nvplugin.plugin import healthservice
from nvplugin.plugin.healthservice import PluginHealthService
from nvplugin.plugin.httpendpoint import HttpEndpoint, Response
from nvplugin.plugin.metrics import Metrics, metrics_endpoint
from nvplugin.plugin.registration import SERVE_AGAIN_GIVE_UP_S, DirWatcher, Registrar
from nvplugin.plugin.server import DevicePluginService, PluginSocket
from nvplugin.plugin.signals import HANDLED, PendingSignals
from nvplugin.resourcenames import socket_name
from nvplugin.rm import (
    ResourceManager,
    Responder,
    ServedResource,
    check_caps,
    make_responder,
    plan_for,
    resource_policies,
)

DISCOVERY_RETRY_S = 30.0
WAITING_CHECK_S = 1.0
"""While waiting for GPUs, how often the daemon checks that its socket is still there (a kubelet
restart removes it; the liveness probe needs it)."""
STOP_GRACE_S = 0.3
"""How long in-flight unary RPCs get at shutdown; streams are ended at once."""

NodeOpener = Callable[[str | None], NodeSession]

ENVVAR_COLLISION = (
    "a container that requests two of these resources gets one NVIDIA_VISIBLE_DEVICES per "
    "resource and the kubelet keeps only one of them, so it silently loses GPUs; use "
    "deviceListStrategy volume-mounts, cdi-annotations or cdi-cri (with or without envvar), "
    "which the kubelet merges"
)


@dataclass
class _Served:
    """One socket being served: the DevicePlugin service and the health service on it."""

    service: DevicePluginService
    health_service: PluginHealthService
    socket: PluginSocket

    async def close(self, grace: float) -> None:
        """End the streams and stop serving (the socket file goes)."""
        self.service.close()
        self.health_service.close()
        await self.socket.stop(grace)


@dataclass
class _Health:
    """A health monitor and where it sends its changes."""

    monitor: HealthMonitor
    forward: _Forward

    def stop(self) -> None:
        self.monitor.stop()


class Daemon:
    """The serve loop. ``reload`` re-reads the config (flags, environment and file) on SIGHUP."""

    def __init__(
        self,
        config: Config,
        *,
        reload: Callable[[], Config] | None = None,
        simulate: str | None = None,
        discovery_retry_s: float = DISCOVERY_RETRY_S,
        opener: NodeOpener | None = None,
        serve_give_up_s: float = SERVE_AGAIN_GIVE_UP_S,
    ) -> None:
        self.config = config
        self.metrics = Metrics()
        # The HTTP endpoints, by what they serve (METRICS, PROBES); absent when not configured.
        self._endpoints: dict[str, HttpEndpoint] = {}
        self._serve_give_up_s = serve_give_up_s
        self._fatal: NvpluginError | None = None
        self._reload = reload
        self._simulate = simulate
        self._discovery_retry_s = discovery_retry_s
        self._opener = opener or functools.partial(
            open_node, driver_root=config.container_driver_root
        )
        self._log = get_logger("nvplugin.daemon")
        self._stop = asyncio.Event()
        self._hup = asyncio.Event()
        self._node: NodeSession | None = None
        self._resources: list[_Served] = []  # one per served resource name, GPU index order
        self._registrars: list[asyncio.Task[None]] = []  # one per served resource
        self._policies: asyncio.Future[dict[str, Policy]] | None = None  # by resource name
        self._health: _Health | None = None  # one monitor for every served GPU
        self._watcher: DirWatcher | None = None
        self._watcher_task: asyncio.Task[None] | None = None
        # While no GPU is discovered: the health service alone on the plugin socket.
        self._waiting: _Served | None = None

    @property
    def node(self) -> NodeSession | None:
        return self._node

    @property
    def service(self) -> DevicePluginService | None:
        """The first served resource's service (the only one unless resources are split)."""
        return self._resources[0].service if self._resources else None

    @property
    def services(self) -> tuple[DevicePluginService, ...]:
        """Every served resource's service, in the order of their lowest GPU index."""
        return tuple(resource.service for resource in self._resources)

    @property
    def health_service(self) -> PluginHealthService | None:
        return self._resources[0].health_service if self._resources else None

    @property
    def metrics_port(self) -> int | None:
        """The port /metrics is served on (None: metrics off)."""
        endpoint = self._endpoints.get(METRICS)
        return endpoint.port if endpoint is not None else None

    @property
    def probe_port(self) -> int | None:
        """The port /livez and /readyz are served on (None: off)."""
        endpoint = self._endpoints.get(PROBES)
        return endpoint.port if endpoint is not None else None

    def stop(self) -> None:
        """Ask the daemon to shut down (what SIGTERM does)."""
        self._stop.set()

    def reload(self) -> None:
        """Ask the daemon to reload its config (what SIGHUP does)."""
        self._hup.set()

    async def run(
        self, *, handle_signals: bool = True, pending: PendingSignals | None = None
    ) -> int:
        """Serve until stopped; returns the exit status (0). Fatal start-up errors raise.

        ``pending`` holds the signals that arrived before the loop's handlers were in place
        (``serve`` installs it first thing): they are acted on now, and it takes the signals
        back when the loop ends.
        """
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in HANDLED:
                loop.add_signal_handler(sig, self._on_signal, sig.name)
        for name in pending.take() if pending is not None else ():
            self._on_signal(name, before_serving=True)
        self._log.info("effective config", config=self.config.as_dict(), simulate=self._simulate)
        for note in self.config.notes:  # keys present that are not for the plugin: said once
            self._log.info("config note", note=note)
        try:
            # The probes first: the startup probe passes as soon as the process answers.
            for kind in (PROBES, METRICS):
                await self._start_endpoint(kind, _endpoint_address(self.config, kind))
            await self._serve()
        finally:
            await self._shutdown()
            if handle_signals:
                for sig in HANDLED:
                    loop.remove_signal_handler(sig)
                if pending is not None:
                    pending.hold()
        if self._fatal is not None:
            # Only a lost socket we could not serve again (or a registrar bug) gets here: exit
            # non-zero so that Kubernetes restarts the plugin rather than keep a zombie.
            self._log.error("exiting", error=str(self._fatal))
            raise self._fatal
        self._log.info("stopped")
        return 0

    async def _start_endpoint(self, kind: str, address: str | None) -> None:
        """Serve ``kind`` (METRICS, PROBES) on ``address`` (None: not at all); NvpluginError
        when it cannot bind."""
        if address is None:
            return
        endpoint = (
            metrics_endpoint(address, self.metrics)
            if kind == METRICS
            else HttpEndpoint(kind, address, {"/livez": self._livez, "/readyz": self._readyz})
        )
        await endpoint.start()
        self._endpoints[kind] = endpoint

    async def _stop_endpoint(self, kind: str) -> None:
        endpoint = self._endpoints.pop(kind, None)
        if endpoint is not None:
            await endpoint.stop()

    def _health_services(self) -> list[PluginHealthService]:
        if self._waiting is not None:
            return [self._waiting.health_service]
        return [resource.health_service for resource in self._resources]

    def _livez(self) -> Response:
        return healthservice.probe_response(self._health_services(), live=True)

    def _readyz(self) -> Response:
        return healthservice.probe_response(self._health_services(), live=False)

    def _on_signal(self, name: str, before_serving: bool = False) -> None:
        """Act first, log after: a log line must never stand between a signal and its effect
        (the log sink drops what it cannot write, but acting first does not rely on that)."""
        if name == "SIGHUP":
            self._hup.set()  # before serving: reload once serving
        else:
            self._stop.set()
        self._log.info("signal", signal=name, before_serving=before_serving)

    async def _serve(self) -> None:
        self._node = await self._discover()
        if self._node is None:
            return  # stopped while waiting for GPUs
        await self._start_resource(self.config)
        while not self._stop.is_set():
            await _first(self._stop, self._hup)
            if self._hup.is_set() and not self._stop.is_set():
                self._hup.clear()
                await self._reload_config()

    # --- discovery ---

    async def _discover(self) -> NodeSession | None:
        """Open the node, retrying while NVML fails (unless fail_on_init_error) or has no GPU."""
        while not self._stop.is_set():
            try:
                node = await asyncio.to_thread(self._opener, self._simulate)
            except InputError:
                raise
            except NvpluginError as exc:
                if self.config.fail_on_init_error:
                    raise
                self._log.error(
                    "nvml init failed; running with no devices",
                    error=str(exc),
                    retry_s=self._discovery_retry_s,
                )
            else:
                if len(node.topology.gpus) > 0:
                    self._log.info(
                        "discovered node",
                        node=node.topology.name,
                        gpus=len(node.topology.gpus),
                        simulated=node.sim is not None,
                    )
                    await self._stop_waiting()
                    return node
                node.close()
                self._log.warning("no GPUs found; waiting", retry_s=self._discovery_retry_s)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._discovery_retry_s
            while not self._stop.is_set() and loop.time() < deadline:
                await self._serve_waiting()  # again at once if a kubelet restart removed it
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(WAITING_CHECK_S, deadline - loop.time())):
                        await self._stop.wait()
        return None

    async def _serve_waiting(self) -> None:
        """Serve the plugin socket with no devices while discovery waits for GPUs.

        Only the health service matters on it: it answers NOT_SERVING (not registered, no GPU),
        so liveness and startup probes (``/livez``, ``nvplugin probe --live``) see a live plugin
        and do not restart it in a loop -- with ``fail_on_init_error: false`` the point is to
        stay up -- while readiness (``/readyz``) shows it is not ready. It is not registered:
        there is nothing to advertise. Another live process on the path is the usual start-up
        error.
        """
        if self._waiting is not None and self._waiting.socket.intact():
            return
        await self._stop_waiting()
        config = self.config
        name = config.resource_name
        _make_dir(config.device_plugin_dir)
        service = DevicePluginService(ResourceManager(ServedResource(name, ())), _NoGpus())
        health_service = PluginHealthService(name, config.health_service)
        service.watch_health(health_service.set_health)
        self.metrics.set_serving(name, False)
        path = os.path.join(config.device_plugin_dir, socket_name(name))
        self._waiting = await self._serve_socket(path, service, health_service)
        self._log.info(
            "serving the health service only (unregistered) until GPUs appear", socket=path
        )

    async def _stop_waiting(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            await waiting.close(0)

    async def _serve_socket(
        self, path: str, service: DevicePluginService, health_service: PluginHealthService
    ) -> _Served:
        """Serve ``service`` and ``health_service`` on ``path`` (RPCs counted in the metrics);
        NvpluginError when another process serves the path. Both are closed if it fails."""
        sock = PluginSocket(
            path,
            service,
            extra_services=[lambda server: healthservice.add_to_server(health_service, server)],
            interceptors=[self.metrics.interceptor(service.resource_name)],
        )
        try:
            await sock.start()
        except BaseException:
            service.close()
            health_service.close()
            raise
        return _Served(service, health_service, sock)

    # --- resources ---

    async def _start_resource(self, config: Config, health: _Health | None = None) -> None:
        """Serve every resource ``config`` makes of the node's GPUs (resources by model, time-
        slicing): one service, socket and registrar each; a resource with no GPU is not served.
        ``health`` is a running monitor to keep (SIGHUP)."""
        assert self._node is not None
        loop = asyncio.get_running_loop()
        topology = self._node.topology
        plan = plan_for(config, topology.gpus)
        if config.pass_device_specs:  # MIG devices need their nvidia-caps nodes: known now
            check_caps([device for served in plan.resources for device in served.bases])
        for warning in plan.warnings:  # once per start (and per reload): config doing nothing
            self._log.warning("config has no effect on this node", reason=warning)
        if plan.empty:
            self._log.info("not serving resources without GPUs", resources=list(plan.empty))
        if len(plan.resources) > 1 and tuple(config.device_list_strategy) == ("envvar",):
            self._log.warning(
                "several resources served with deviceListStrategy envvar alone",
                resources=[served.name for served in plan.resources],
                reason=ENVVAR_COLLISION,
            )
        _make_dir(config.device_plugin_dir)
        watcher = await self._ensure_watcher(config.device_plugin_dir)
        # The policies' start-up work (best-effort's tables) off the loop, once for the node.
        policies: asyncio.Future[dict[str, Policy]] = loop.run_in_executor(
            None,
            functools.partial(
                resource_policies,
                config.allocation_policy,
                topology,
                plan.resources,
                budget_s=config.allocation_budget_s,
            ),
        )
        policies.add_done_callback(functools.partial(self._policies_done, config))
        responder = make_responder(
            config.device_list_strategy,
            config.device_id_strategy,
            pass_device_specs=config.pass_device_specs,
            dev_root=config.dev_root,
            cdi_annotation_prefix=config.cdi_annotation_prefix,
        )
        parts: list[_Served] = []
        try:
            for served in plan.resources:
                parts.append(await self._open_resource(config, served, policies, responder, health))
        except BaseException:
            for part in parts:
                await part.close(STOP_GRACE_S)
            policies.cancel()
            raise
        if not parts:
            self._log.warning("every GPU is excluded; serving no resource")
            policies.cancel()
            if health is not None:
                await asyncio.to_thread(health.stop)
            return
        services = [part.service for part in parts]
        if health is None:
            health = self._new_health(config, services)
        else:
            health.forward.retarget(services)
            for service in services:
                service.set_health(health.monitor.health)  # a change may have raced the rewire
        self._policies, self._health = policies, health
        # Registered means ready: the kubelet's first GetPreferredAllocation must not wait for
        # the policies' start-up work (built off the loop while the sockets already serve).
        await asyncio.wait({policies})
        for part in parts:
            self._register(config, part, watcher)

    async def _open_resource(
        self,
        config: Config,
        served: ServedResource,
        policies: asyncio.Future[dict[str, Policy]],
        responder: Responder,
        health: _Health | None,
    ) -> _Served:
        """The service for one resource, serving on its socket (not registered yet)."""
        manager = ResourceManager(served, responder)
        service = DevicePluginService(
            manager,
            _policy_of(policies, served.name),
            pre_start_required=config.pre_start_required,
            health=health.monitor.health if health is not None else None,
        )
        resource_name = served.name
        health_service = PluginHealthService(
            resource_name,
            config.health_service,
            on_status=lambda serving: self.metrics.set_serving(resource_name, serving),
        )
        self.metrics.set_serving(resource_name, health_service.serving)
        service.watch_health(health_service.set_health)
        per_gpu = Counter(device.gpu.index for device in manager.devices)  # GPU -> devices
        service.watch_health(lambda h: self.metrics.observe_health(resource_name, h, per_gpu))
        path = os.path.join(config.device_plugin_dir, served.socket)
        return await self._serve_socket(path, service, health_service)

    def _register(self, config: Config, served: _Served, watcher: DirWatcher) -> None:
        """Start registering one served resource, and keep re-registering it."""
        service, health_service, sock = served.service, served.health_service, served.socket
        resource_name = service.resource_name

        def registered() -> None:
            self.metrics.registered(resource_name)
            health_service.set_registered(True)

        def unregistered() -> None:
            self.metrics.kubelet_restarted(resource_name)
            health_service.set_registered(False)

        registrar = Registrar(
            sock,
            service,
            config.kubelet_socket_path,
            watcher,
            on_registered=registered,
            on_unregistered=unregistered,
            serve_give_up_s=self._serve_give_up_s,
        )
        task = asyncio.create_task(registrar.run(), name="nvplugin-registrar")
        task.add_done_callback(self._registrar_done)
        self._registrars.append(task)
        self._resources.append(served)
        self._log.info(
            "serving",
            resource=resource_name,
            socket=sock.path,
            devices=service.uuids(),
            replicas=service.manager.replicas.count,
            unhealthy=service.unhealthy_uuids(),
        )

    def _new_health(self, config: Config, services: list[DevicePluginService]) -> _Health:
        """One started health monitor for every served GPU, under ``config``'s health rules."""
        assert self._node is not None
        forward = _Forward(asyncio.get_running_loop(), services)
        settings = config.health.settings()
        monitor = HealthMonitor(
            self._node.nvml,
            sorted({gpu for service in services for gpu in service.manager.gpus}),
            settings,
            forward,
            on_xid=self.metrics.xid,
        )
        monitor.start()
        return _Health(monitor, forward)

    def _registrar_done(self, task: asyncio.Task[None]) -> None:
        """A registrar only ends by cancellation; if it failed, the plugin must not stay up
        unregistered: stop, and exit non-zero."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        self._fatal = (
            exc
            if isinstance(exc, NvpluginError)
            else NvpluginError(f"registration failed: {exc!r}")
        )
        self._stop.set()

    async def _ensure_watcher(self, directory: str) -> DirWatcher:
        if self._watcher is not None and self._watcher.directory == directory:
            return self._watcher
        await self._stop_watcher()
        self._watcher = DirWatcher(directory)
        self._watcher_task = asyncio.create_task(self._watcher.run(), name="nvplugin-dirwatch")
        return self._watcher

    def _policies_done(self, config: Config, future: asyncio.Future[dict[str, Policy]]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            self._log.error("allocation policy failed to build", error=str(exc))
        else:
            self._log.info("allocation policy ready", policy=config.allocation_policy)

    async def _stop_resource(self, keep_health: bool) -> _Health | None:
        """Stop serving every resource; returns their health monitor if asked to keep it."""
        resources, self._resources = self._resources, []
        registrars, self._registrars = self._registrars, []
        policies, self._policies = self._policies, None
        health, self._health = self._health, None
        if not resources:
            return None
        await _cancel(registrars)
        for resource in resources:
            await resource.close(STOP_GRACE_S)
            self.metrics.forget(resource.service.resource_name)
        if policies is not None and not policies.done():
            policies.cancel()
        assert health is not None  # set with the resources
        if keep_health:
            return health
        await asyncio.to_thread(health.stop)
        return None

    async def _stop_watcher(self) -> None:
        task, self._watcher_task = self._watcher_task, None
        self._watcher = None
        if task is not None:
            await _cancel([task])

    async def _reload_config(self) -> None:
        """SIGHUP. Whatever goes wrong -- a config that fails to load in any way, even one
        nobody foresaw, or one that cannot be served -- is logged and the running config kept:
        a reload never ends the plugin (every GPU would be lost to the kubelet)."""
        if self._reload is None:
            self._log.info("SIGHUP: nothing to reload")
            return
        try:
            config = self._reload()
            if self._node is not None:  # what only the node can tell (MIG, the kubelet's limit)
                plan_for(config, self._node.topology.gpus)
        except Exception as exc:
            self._log.error("config reload failed; keeping the running config", error=reason(exc))
            return
        configure(config.log.format, config.log.level)
        self._log.info("config reloaded", config=config.as_dict())
        previous = self.config
        for kind in (PROBES, METRICS):
            address = _endpoint_address(config, kind)
            if address == _endpoint_address(previous, kind):
                continue
            await self._stop_endpoint(kind)
            try:
                await self._start_endpoint(kind, address)
            except NvpluginError as exc:
                self._log.error(f"{kind} off: cannot serve the reloaded address", error=str(exc))
        if self._resources and _same_sockets(previous, config):
            try:
                await self._reload_in_place(config)
            except Exception as exc:
                configure(previous.log.format, previous.log.level)
                self._log.error(
                    "cannot apply the reloaded config; keeping the running one", error=reason(exc)
                )
            return
        # Same health settings: keep the monitor and what it has seen. New ones: a fresh monitor,
        # as the old verdicts were made by rules no longer configured.
        health = await self._stop_resource(keep_health=previous.health == config.health)
        try:
            await self._start_resource(config, health)
            self.config = config
        except Exception as exc:
            self._log.error(
                "cannot serve with the reloaded config; going back to the previous one",
                error=reason(exc),
            )
            configure(previous.log.format, previous.log.level)
            try:
                await self._start_resource(previous, health)
            except Exception as again:
                # What served a moment ago cannot be served again (the directory went away):
                # exit 1 with the reason, so that Kubernetes restarts the plugin.
                raise NvpluginError(
                    f"cannot serve the previous config again after a failed reload: {reason(again)}"
                ) from None

    async def _reload_in_place(self, config: Config) -> None:
        """Apply a config that changes nothing the kubelet sees (log, health rules, health
        service, metrics) without touching the socket: no request fails, no stream ends, no
        re-registration. Changed health rules get a fresh monitor, as the old verdicts were made
        by rules no longer configured."""
        resources = self._resources
        assert resources and self._health is not None
        if config.health != self.config.health:
            await asyncio.to_thread(self._health.stop)  # one monitor for all
            self._health = self._new_health(config, [resource.service for resource in resources])
            for resource in resources:
                resource.service.set_health(self._health.monitor.health)
        for resource in resources:
            resource.health_service.set_settings(config.health_service)
        self.config = config
        self._log.info(
            "config applied in place; still registered",
            resources=[resource.service.resource_name for resource in resources],
        )

    async def _shutdown(self) -> None:
        await self._stop_waiting()
        await self._stop_resource(keep_health=False)
        for kind in (METRICS, PROBES):
            await self._stop_endpoint(kind)
        await self._stop_watcher()
        if self._node is not None:
            node, self._node = self._node, None
            await asyncio.to_thread(node.close)


METRICS = "metrics"
PROBES = "health probes"


def _endpoint_address(config: Config, kind: str) -> str | None:
    return config.metrics_address if kind == METRICS else config.health_probe_address


def _make_dir(directory: str) -> None:
    """Create the device-plugin directory (0750, as the kubelet does) if it is missing."""
    try:
        os.makedirs(directory, mode=0o750, exist_ok=True)
    except OSError as exc:  # a message and exit 1 (or, on SIGHUP, the previous config)
        raise NvpluginError(
            f"cannot create the device-plugin directory {directory}: {exc.strerror or exc}"
        ) from None


def _policy_of(policies: asyncio.Future[dict[str, Policy]], name: str) -> asyncio.Future[Policy]:
    """Resource ``name``'s policy, once ``policies`` are built (their failure, or
    cancellation, too)."""
    loop = asyncio.get_running_loop()
    policy: asyncio.Future[Policy] = loop.create_future()

    def settle(built: asyncio.Future[dict[str, Policy]]) -> None:
        if policy.done():
            return
        if built.cancelled():
            policy.cancel()
        elif built.exception() is not None:
            policy.set_exception(built.exception())  # type: ignore[arg-type]
        else:
            policy.set_result(built.result()[name])

    policies.add_done_callback(settle)
    # A failure is logged once, for all (Daemon._policies_done), not per resource at exit.
    policy.add_done_callback(lambda done: done.cancelled() or done.exception())
    return policy


class _NoGpus:
    """The policy of the socket served while no GPU is discovered: it advertises no device, so
    every well-formed request is impossible (and names only unknown IDs before it gets here)."""

    name = "none"

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        return []


def _same_sockets(old: Config, new: Config) -> bool:
    """Whether ``new`` differs from ``old`` only in what can change while serving (log, health
    rules, health service, metrics, probes): then a reload keeps the socket and the
    registration."""
    in_place = dataclasses.replace(
        old,
        log=new.log,
        health=new.health,
        health_service=new.health_service,
        metrics_address=new.metrics_address,
        health_probe_address=new.health_probe_address,
        source=new.source,
    )
    return in_place == new


class _Forward:
    """The health monitor's ``on_change``: hands each map to the services on the event loop
    (each takes the GPUs it serves; replicas follow their GPU).

    Called on the monitor's thread. Maps are coalesced on their way to the loop: at most one
    hand-over is queued at a time and it carries the latest map, so a storm of changes while the
    loop is busy queues one callback, not one per change. The targets can change on SIGHUP
    while the monitor (and the health it has seen) lives on.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, services: list[DevicePluginService]
    ) -> None:
        self._loop = loop
        self._services = list(services)
        self._lock = threading.Lock()
        self._latest: dict[int, bool] | None = None  # set while a hand-over is queued

    def retarget(self, services: list[DevicePluginService]) -> None:
        self._services = list(services)

    def __call__(self, health: dict[int, bool]) -> None:
        with self._lock:
            queued = self._latest is not None
            self._latest = dict(health)
        if not queued:
            with contextlib.suppress(RuntimeError):  # the loop closed while shutting down
                self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            health, self._latest = self._latest, None
        if health is None:
            return
        for service in self._services:
            service.set_health(health)


async def _cancel(tasks: list[asyncio.Task[None]], timeout: float = 1.0) -> None:
    """Cancel ``tasks`` and wait for them, but never longer than ``timeout`` (shutdown has a
    2 s budget; a task that ignores cancellation is left behind and logged)."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            get_logger("nvplugin.daemon").error(
                "task failed", task=task.get_name(), error=repr(task.exception())
            )
    for task in pending:
        get_logger("nvplugin.daemon").error("task did not stop", task=task.get_name())


async def _first(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waiters = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def run_daemon(
    config: Config,
    *,
    reload: Callable[[], Config] | None = None,
    simulate: str | None = None,
    discovery_retry_s: float = DISCOVERY_RETRY_S,
    serve_give_up_s: float = SERVE_AGAIN_GIVE_UP_S,
    pending: PendingSignals | None = None,
) -> int:
    """Configure logging, run the daemon on a fresh event loop, return its exit status.
    ``pending``: the signals recorded since the process started (see :mod:`.signals`)."""
    configure(config.log.format, config.log.level)
    daemon = Daemon(
        config,
        reload=reload,
        simulate=simulate,
        discovery_retry_s=discovery_retry_s,
        serve_give_up_s=serve_give_up_s,
    )
    return asyncio.run(daemon.run(pending=pending))
