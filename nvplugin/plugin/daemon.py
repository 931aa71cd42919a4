"""``nvplugin serve``: the daemon's life from discovery to the last socket removed.

This module is the lifecycle -- start, signals, discovery retry, stop; what is served for a config
is :mod:`.assembly`'s (resources, sockets, health wiring, registrars) and how a SIGHUP applies a
new config is :mod:`.reload`'s.

Start: log the effective config once, open the node (NVML, real or simulated; discovery happens
once, here), then per resource start the service and its socket, the health monitor and the
registrar. The allocation policy's tables are computed on a worker thread while the plugin
registers, so a 16-GPU node is advertised without waiting for them.

Signals: SIGTERM/SIGINT stop serving, end every ListAndWatch stream, remove our sockets and
return 0. SIGHUP reloads the config (same file, flags and environment), rebuilds the resources
and registers them again; a config that no longer loads is logged and the running one kept. A
reload that changes only log, health rules, health service or metrics is applied in place: the
sockets, the kubelet's streams and the registrations stay, so no request fails meanwhile.

Labels: with ``flags.gfd.outputFile`` set, the node's labels (GPU Feature Discovery's, and
nvplugin's few) are kept in that file (:mod:`.labelling`): written once the resources serve,
again after every reload (SIGHUP's or a per-node config's), removed at stop; with
``flags.useNodeFeatureAPI``, in NFD's NodeFeature object instead (:mod:`.nodefeature`: the pod's
``NODE_NAME``, ``NAMESPACE``, ``POD_NAME``), published in the background.

Per-node configs (``CONFIG_FILE_SRCDIR``): a :class:`~.selection.ConfigSelector` runs beside the
serve loop, follows the Node's label and the config directory, and applies what they choose
through the same reload (one at a time with SIGHUP's); SIGHUP re-reads the chosen file.

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
import functools
import os
from collections.abc import Callable, Sequence

from nvplugin.config import Config
from nvplugin.config.pod import PodIdentity
from nvplugin.errors import InputError, NvpluginError
from nvplugin.log import LoopErrors, configure, get_logger
from nvplugin.nodesession import NodeSession, open_node
from nvplugin.plugin import healthservice, reload
from nvplugin.plugin.assembly import Resources, Served, make_dir, serve_socket
from nvplugin.plugin.diraccess import check_device_plugin_access
from nvplugin.plugin.endpoints import METRICS, PROBES, Endpoints
from nvplugin.plugin.executor import RequestExecutor
from nvplugin.plugin.healthservice import PluginHealthService
from nvplugin.plugin.httpendpoint import Response
from nvplugin.plugin.labelling import Labeller
from nvplugin.plugin.metrics import Metrics
from nvplugin.plugin.nodefeature import NodeFeaturePublisher
from nvplugin.plugin.registrar import SERVE_AGAIN_GIVE_UP_S
from nvplugin.plugin.selection import ApiTiming, ConfigSelector, Following
from nvplugin.plugin.server import DevicePluginService
from nvplugin.plugin.signals import HANDLED, PendingSignals
from nvplugin.plugin.tasks import Tasks
from nvplugin.resourcenames import socket_name
from nvplugin.rm import ResourceManager, ServedResource

DISCOVERY_RETRY_S = 30.0
WAITING_CHECK_S = 1.0
"""While waiting for GPUs, how often the daemon checks that its socket is still there (a kubelet
restart removes it; the liveness probe needs it)."""

NodeOpener = Callable[[str | None], NodeSession]


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
        following: Following | None = None,
        api_timing: ApiTiming | None = None,
        pod: PodIdentity | None = None,
        keep_mps: bool | None = None,
    ) -> None:
        """``keep_mps``: whether MPS daemons outlive the plugin (None: where they can)."""
        self.config = config
        self._keep_mps = keep_mps
        self.metrics = Metrics()
        self._endpoints = Endpoints(self.metrics, self._livez, self._readyz)
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
        self._wake = asyncio.Event()  # set with either: the serve loop has something to do
        # The tasks of the daemon's whole life: the config selector, the labeller's refresh,
        # the NodeFeature publisher. Ended at shutdown, before what they use.
        self._tasks = Tasks("daemon")
        self._node: NodeSession | None = None
        self._resources: Resources | None = None  # once the node is discovered
        self._executor = RequestExecutor()  # every resource's requests' work; closed first
        # While no GPU is discovered: the health service alone on the plugin socket.
        self._waiting: Served | None = None
        timing = api_timing or ApiTiming()
        publisher = NodeFeaturePublisher(
            pod or PodIdentity(),
            self.metrics,
            tasks=self._tasks,
            backoff=(timing.backoff_initial_s, timing.backoff_max_s),
        )
        self.labeller = Labeller(publisher=publisher, tasks=self._tasks)
        self._applying = asyncio.Lock()  # one reload at a time: SIGHUP's or the selector's
        self.selector: ConfigSelector | None = None
        if following is not None:
            self.selector = ConfigSelector(
                following, self._apply, self.metrics, timing=api_timing or ApiTiming()
            )
            self._reload = self.selector.load_active

    @property
    def node(self) -> NodeSession | None:
        return self._node

    @property
    def service(self) -> DevicePluginService | None:
        """The first served resource's service (the only one unless resources are split)."""
        return self.services[0] if self.services else None

    @property
    def services(self) -> tuple[DevicePluginService, ...]:
        """Every served resource's service, in the order of their lowest GPU index."""
        return self._resources.services if self._resources is not None else ()

    @property
    def health_service(self) -> PluginHealthService | None:
        served = self._resources.served if self._resources is not None else []
        return served[0].health_service if served else None

    @property
    def metrics_port(self) -> int | None:
        """The port /metrics is served on (None: metrics off)."""
        return self._endpoints.port(METRICS)

    @property
    def probe_port(self) -> int | None:
        """The port /livez and /readyz are served on (None: off)."""
        return self._endpoints.port(PROBES)

    def stop(self) -> None:
        """Ask the daemon to shut down (what SIGTERM does)."""
        self._stop.set()
        self._wake.set()

    def reload(self) -> None:
        """Ask the daemon to reload its config (what SIGHUP does)."""
        self._hup.set()
        self._wake.set()

    async def run(
        self, *, handle_signals: bool = True, pending: PendingSignals | None = None
    ) -> int:
        """Serve until stopped; returns the exit status (0). Fatal start-up errors raise.

        ``pending`` holds the signals that arrived before the loop's handlers were in place
        (``serve`` installs it first thing): they are acted on now, and it takes the signals
        back when the loop ends.
        """
        loop = asyncio.get_running_loop()
        # What the loop cannot hand to anyone (an accept failing while the process is out of
        # file descriptors, hundreds of times a second) is logged rate-limited, not each time.
        loop.set_exception_handler(LoopErrors(get_logger("nvplugin.daemon")))
        if handle_signals:
            for sig in HANDLED:
                loop.add_signal_handler(sig, self._on_signal, sig.name)
        for name in pending.take() if pending is not None else ():
            self._on_signal(name, before_serving=True)
        self._log.info("effective config", config=self.config.as_dict(), simulate=self._simulate)
        for note in self.config.notes:  # keys present that are not for the plugin: said once
            self._log.info("config note", note=note)
        try:
            check_device_plugin_access(
                self.config.device_plugin_dir, self.config.kubelet_socket_path
            )
            # The probes first: the startup probe passes as soon as the process answers.
            await self._endpoints.start(self.config)
            if self.selector is not None:
                self._tasks.spawn(self.selector.run(), "nvplugin-config-selector")
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

    def _health_services(self) -> list[PluginHealthService]:
        if self._waiting is not None:
            return [self._waiting.health_service]
        served = self._resources.served if self._resources is not None else []
        return [part.health_service for part in served]

    def _livez(self) -> Response:
        return healthservice.probe_response(self._health_services(), live=True)

    def _readyz(self) -> Response:
        return healthservice.probe_response(self._health_services(), live=False)

    def _on_signal(self, name: str, before_serving: bool = False) -> None:
        """Act first, log after: a log line must never stand between a signal and its effect
        (the log sink drops what it cannot write, but acting first does not rely on that)."""
        if name == "SIGHUP":
            self.reload()  # before serving: reload once serving
        else:
            self.stop()
        self._log.info("signal", signal=name, before_serving=before_serving)

    def _on_fatal(self, error: NvpluginError) -> None:
        self._fatal = error
        self.stop()

    async def _serve(self) -> None:
        self._node = await self._discover()
        if self._node is None:
            return  # stopped while waiting for GPUs
        if self.selector is not None and not await self._until(self.selector.chosen):
            return  # stopped while waiting for the node's label
        self._resources = Resources(
            self._node,
            self.metrics,
            serve_give_up_s=self._serve_give_up_s,
            on_fatal=self._on_fatal,
            executor=self._executor,
            keep_mps=self._keep_mps,
        )
        async with self._applying:
            await self._resources.start(self.config)
            await self._update_labels()
        while not self._stop.is_set():
            await self._wake.wait()
            self._wake.clear()
            if self._hup.is_set() and not self._stop.is_set():
                self._hup.clear()
                await self._reload_config()

    async def _until(self, event: asyncio.Event) -> bool:
        """Wait for ``event``; False when the daemon is stopped first."""
        waits = [asyncio.ensure_future(e.wait()) for e in (event, self._stop)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return event.is_set() and not self._stop.is_set()

    async def _reload_config(self) -> None:
        if self._reload is None:
            self._log.info("SIGHUP: nothing to reload")
            return
        async with self._applying:
            self.config = await reload.reload(
                self.config, self._reload, self._node, self._resources, self._endpoints
            )
            await self._update_labels()

    async def _apply(self, load: Callable[[], Config]) -> bool:
        """Apply the config ``load`` gives through the reload path (the selector's way in);
        True when it runs now, False when the running one was kept."""
        async with self._applying:
            previous = self.config
            try:
                self.config = await reload.reload(
                    previous, load, self._node, self._resources, self._endpoints
                )
            except NvpluginError as exc:  # neither config can be served any more
                self._on_fatal(exc)
                return False
            await self._update_labels()
            return self.config is not previous

    async def _update_labels(self) -> None:
        """Bring the node's labels in line with what is served now. Not while discovery runs
        (a per-node config applied meanwhile): the labels are written once, whole, when it
        ends -- or, when it must wait for GPUs, as a node without GPUs (:meth:`_discover`)."""
        if self._node is None and self._waiting is None:
            return
        resources = self._resources
        await self.labeller.update(
            self.config, self._node, resources.plan if resources is not None else None
        )

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
            await self.labeller.update(self.config, None, None)  # a node without GPUs, for now
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
        make_dir(config.device_plugin_dir)
        service = DevicePluginService(
            ResourceManager(ServedResource(name, ())), _NoGpus(), executor=self._executor
        )
        health_service = PluginHealthService(name, config.health_service)
        service.watch_health(health_service.set_health)
        self.metrics.set_serving(name, False)
        path = os.path.join(config.device_plugin_dir, socket_name(name))
        self._waiting = await serve_socket(path, service, health_service, self.metrics)
        self._log.info(
            "serving the health service only (unregistered) until GPUs appear", socket=path
        )

    async def _stop_waiting(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            await waiting.close(0)

    async def _shutdown(self) -> None:
        # First: a request in progress is dropped, not waited for (its client gets UNAVAILABLE).
        self._executor.close()
        await self._tasks.close()  # the selector (no reload starts now), labels' refresh
        await self._stop_waiting()
        await self.labeller.close()  # NFD drops the node's labels with the file
        if self._resources is not None:
            await self._resources.close()
        await self._endpoints.stop()
        if self._node is not None:
            node, self._node = self._node, None
            await asyncio.to_thread(node.close)


class _NoGpus:
    """The policy of the socket served while no GPU is discovered: it advertises no device, so
    every well-formed request is impossible (and names only unknown IDs before it gets here)."""

    name = "none"

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        return []


def run_daemon(
    config: Config,
    *,
    reload: Callable[[], Config] | None = None,
    simulate: str | None = None,
    discovery_retry_s: float = DISCOVERY_RETRY_S,
    serve_give_up_s: float = SERVE_AGAIN_GIVE_UP_S,
    pending: PendingSignals | None = None,
    following: Following | None = None,
    api_timing: ApiTiming | None = None,
    pod: PodIdentity | None = None,
    keep_mps: bool | None = None,
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
        following=following,
        api_timing=api_timing,
        pod=pod,
        keep_mps=keep_mps,
    )
    return asyncio.run(daemon.run(pending=pending))
