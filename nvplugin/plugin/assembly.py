"""What the daemon serves of a node under one config: for each resource of the plan
(:func:`nvplugin.rm.plan_for`) its resource manager, DevicePlugin service, gRPC health service,
socket and registrar; one health monitor for every served GPU, wired to every service; the
resources' allocation policies, built off the event loop while the sockets already serve; for a
resource shared through MPS, its control daemon (:mod:`.mps`): the resource is registered once the
daemon is ready, and held (every device Unhealthy) whenever it is not.

:class:`Resources` starts all of that for a config, stops it (keeping the health monitor and what
it has seen when asked: a reload with the same health rules; and the MPS daemons whose resource is
served the same way again), and applies in place what can change while serving (health rules,
the health service's settings). Each start also ends what earlier plugins left of MPS under the
MPS root that this config does not want (a daemon, recorded compute modes); at shutdown the MPS
daemons are left running for the next plugin where they can outlive this one
(:func:`~.mps.daemons_outlive_us`), and stopped where they cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from nvplugin.allocator import Policy
from nvplugin.cdi.generate import SpecIncomplete, refresh, spec_dir, writes_spec
from nvplugin.config import Config
from nvplugin.errors import NvpluginError
from nvplugin.log import get_logger
from nvplugin.node.health import HealthMonitor
from nvplugin.node.model import Topology
from nvplugin.nodesession import NodeSession
from nvplugin.plugin import healthservice
from nvplugin.plugin.executor import RequestExecutor
from nvplugin.plugin.healthservice import PluginHealthService
from nvplugin.plugin.heap import release_freed_heap
from nvplugin.plugin.metrics import Metrics
from nvplugin.plugin.mps import MpsDaemons, daemon_specs, daemons_outlive_us, mps_root
from nvplugin.plugin.registrar import DirWatcher, Registrar
from nvplugin.plugin.server import DevicePluginService, PluginSocket, preferred_budget
from nvplugin.plugin.tasks import Tasks
from nvplugin.rm import (
    MpsAllocation,
    ResourceManager,
    ResourcePlan,
    Responder,
    ServedResource,
    check_caps,
    make_responder,
    plan_for,
    resource_policies,
)

STOP_GRACE_S = 0.3
"""How long in-flight unary RPCs get at shutdown; streams are ended at once."""

ENVVAR_COLLISION = (
    "a container that requests two of these resources gets one NVIDIA_VISIBLE_DEVICES per "
    "resource and the kubelet keeps only one of them, so it silently loses GPUs; use "
    "deviceListStrategy volume-mounts, cdi-annotations or cdi-cri (with or without envvar), "
    "which the kubelet merges"
)


@dataclass
class Served:
    """One socket being served: the DevicePlugin service and the health service on it."""

    service: DevicePluginService
    health_service: PluginHealthService
    socket: PluginSocket

    async def close(self, grace: float) -> None:
        """End the streams and stop serving (the socket file goes)."""
        self.service.close()
        self.health_service.close()
        await self.socket.stop(grace)


async def serve_socket(
    path: str, service: DevicePluginService, health_service: PluginHealthService, metrics: Metrics
) -> Served:
    """Serve ``service`` and ``health_service`` on ``path`` (RPCs counted in ``metrics``);
    NvpluginError when another process serves the path. Both are closed if it fails."""
    sock = PluginSocket(
        path,
        service,
        extra_services=[lambda server: healthservice.add_to_server(health_service, server)],
        interceptors=[metrics.interceptor(service.resource_name)],
    )
    try:
        await sock.start()
    except BaseException:
        service.close()
        health_service.close()
        raise
    return Served(service, health_service, sock)


def make_dir(directory: str) -> None:
    """Create the device-plugin directory (0750, as the kubelet does) if it is missing."""
    try:
        os.makedirs(directory, mode=0o750, exist_ok=True)
    except OSError as exc:  # a message and exit 1 (or, on SIGHUP, the previous config)
        raise NvpluginError(
            f"cannot create the device-plugin directory {directory}: {exc.strerror or exc}"
        ) from None


@dataclass
class Health:
    """A health monitor and where it sends its changes."""

    monitor: HealthMonitor
    forward: Forward

    def stop(self) -> None:
        self.monitor.stop()


@dataclass
class Generation:
    """What one :meth:`Resources.start` serves until the next :meth:`Resources.stop`: the plan,
    each resource's socket, the health monitor, and the tasks of this generation -- the
    device-plugin directory's watch, the policies' build and each resource's policy, the
    registrars (an MPS resource's waits for its daemon first)."""

    plan: ResourcePlan
    served: list[Served]
    health: Health
    tasks: Tasks


class Resources:
    """The resources served for the current config (see the module docstring).

    ``on_fatal`` is told when a registrar fails (a socket the kubelet removed that cannot be
    served again): the daemon must then stop and exit non-zero. ``executor`` does the work of
    every resource's requests (the daemon's, for its whole life). ``keep_mps``: leave the MPS
    daemons running at :meth:`close` (default: where they can outlive this process).
    """

    def __init__(
        self,
        node: NodeSession,
        metrics: Metrics,
        *,
        serve_give_up_s: float,
        on_fatal: Callable[[NvpluginError], None],
        executor: RequestExecutor,
        keep_mps: bool | None = None,
    ) -> None:
        self._node = node
        self._keep_mps = daemons_outlive_us() if keep_mps is None else keep_mps
        self._metrics = metrics
        self._executor = executor
        self._serve_give_up_s = serve_give_up_s
        self._on_fatal = on_fatal
        self._log = get_logger("nvplugin.daemon")
        self.plan: ResourcePlan | None = None  # what is served (the last start's plan)
        self._generation: Generation | None = None  # None: nothing served
        self._mps = MpsDaemons(node.nvml)  # kept across generations
        self._cordon: frozenset[int] = frozenset()  # GPUs cordoned (plugin/cordon.py)

    def set_cordon(self, indices: frozenset[int]) -> None:
        """Cordon exactly ``indices``: Unhealthy, with every unit of theirs, until lifted (kept
        across generations and health monitors)."""
        self._cordon = frozenset(indices)
        if self._generation is not None:
            self._generation.health.monitor.set_cordon(self._cordon)

    @property
    def health_reasons(self) -> dict[int, dict[str, str]]:
        """Why each Unhealthy GPU is (GPU -> reason kind -> reason); empty while not serving."""
        if self._generation is None:
            return {}
        return self._generation.health.monitor.reasons

    @property
    def served(self) -> list[Served]:
        """One per served resource name, in plan order (none while nothing is served)."""
        return list(self._generation.served) if self._generation is not None else []

    @property
    def services(self) -> tuple[DevicePluginService, ...]:
        """Every served resource's service, in the order of their first unit."""
        return tuple(part.service for part in self.served)

    async def start(self, config: Config, health: Health | None = None) -> None:
        """Serve every resource ``config`` makes of the node's GPUs: one service, socket and
        registrar each; a resource with no GPU is not served. ``health`` is a running monitor
        to keep (SIGHUP)."""
        topology = self._node.topology
        plan = plan_for(config, topology.gpus)
        if config.pass_device_specs:  # MIG devices need their nvidia-caps nodes: known now
            check_caps([device for served in plan.resources for device in served.bases])
        for warning in plan.warnings:  # once per start (and per reload): config doing nothing
            self._log.warning("config has no effect on this node", reason=warning)
        if plan.empty:
            self._log.info("not serving resources without GPUs", resources=list(plan.empty))
        specs = daemon_specs(config, plan.resources, self._node.driver_root, self._node.sim is None)
        root = mps_root(config, topology.gpus, self._node.driver_root)
        if len(plan.resources) > 1 and tuple(config.device_list_strategy) == ("envvar",):
            self._log.warning(
                "several resources served with deviceListStrategy envvar alone",
                resources=[served.name for served in plan.resources],
                reason=ENVVAR_COLLISION,
            )
        if writes_spec(config):  # before anything registers: every name handed out resolves
            await self._write_cdi_spec(config, plan)
        make_dir(config.device_plugin_dir)
        tasks = Tasks("served resources")
        parts: list[Served] = []
        try:
            watcher = DirWatcher(config.device_plugin_dir)
            tasks.spawn(watcher.run(), "nvplugin-dirwatch")
            # The policies' start-up work (best-effort's tables) off the loop, once for the node.
            build = tasks.spawn(
                self._policies(config, topology, plan.resources), "nvplugin-policies", quiet=True
            )
            responder = make_responder(
                config.device_list_strategy,
                config.device_id_strategy,
                pass_device_specs=config.pass_device_specs,
                dev_root=config.dev_root,
                cdi_annotation_prefix=config.cdi_annotation_prefix,
                cdi_kind=config.cdi_kind,
            )
            for served in plan.resources:
                # Its failure is the build's, logged once there.
                policy = tasks.spawn(_policy_of(build, served.name), "nvplugin-policy", quiet=True)
                parts.append(await self._open(config, served, policy, responder, health))
            self.plan = plan
            if not parts:
                self._log.warning("every GPU is excluded; serving no resource")
                await tasks.close()
                await self._mps.serve([], root)
                if health is not None:
                    await asyncio.to_thread(health.stop)
                return
            daemons = await self._mps.serve(specs, root)
        except BaseException:
            await tasks.close()
            for part in parts:
                await part.close(STOP_GRACE_S)
            raise
        services = [part.service for part in parts]
        if health is None:
            health = self._new_health(config, services)
        else:
            health.forward.retarget(services)
            for service in services:
                service.set_health(health.monitor.health)  # a change may have raced the rewire
        self._generation = Generation(plan, parts, health, tasks)
        # Registered means ready: the kubelet's first GetPreferredAllocation must not wait for
        # the policies' start-up work (built off the loop while the sockets already serve).
        await asyncio.wait({build})
        for part in parts:
            daemon = daemons.get(part.service.resource_name)
            ready = None
            if daemon is not None:  # registered once its daemon is ready; held whenever not
                ready = asyncio.Event()
                daemon.follow(functools.partial(_follow_mps, part.service, ready))
            tasks.spawn(self._registrar(config, part, watcher, ready), "nvplugin-registrar")

    async def _write_cdi_spec(self, config: Config, plan: ResourcePlan) -> None:
        """Write the CDI spec of ``plan`` (off the loop; unchanged: left alone). A spec that
        cannot be whole fails the start under failOnInitError, else is logged and not written."""
        node = self._node
        sim_root = node.sim.driver_root if node.sim is not None else None
        directory = spec_dir(config, sim_root)
        try:
            path, changed = await asyncio.to_thread(
                refresh,
                config,
                plan,
                node.topology,
                node.scan.driver.version,
                node.driver_root,
                directory,
            )
        except SpecIncomplete as exc:
            if config.fail_on_init_error:
                raise
            self._log.error("CDI spec not written (failOnInitError is false)", reason=str(exc))
            return
        self._log.info("CDI spec written" if changed else "CDI spec unchanged", path=path)

    async def stop(self, *, keep_health: bool) -> Health | None:
        """Stop serving every resource; returns their health monitor if asked to keep it."""
        generation, self._generation = self._generation, None
        self._mps.detach()  # kept running: the next start reuses what it serves the same way
        if generation is None:
            return None
        await generation.tasks.close()  # registrars first: nothing serves a socket again
        for part in generation.served:
            await part.close(STOP_GRACE_S)
            self._metrics.forget(part.service.resource_name)
        if keep_health:
            return generation.health
        await asyncio.to_thread(generation.health.stop)
        return None

    async def close(self) -> None:
        """Stop serving and the health monitor (shutdown); leave the MPS daemons running (or stop
        them: ``keep_mps``)."""
        await self.stop(keep_health=False)
        if self._keep_mps:
            await self._mps.release()
        else:
            await self._mps.stop()

    async def apply_in_place(self, config: Config, previous: Config) -> None:
        """Apply what changes nothing the kubelet sees (health rules, health service) without
        touching the sockets: no request fails, no stream ends, no re-registration. Changed
        health rules get a fresh monitor, as the old verdicts were made by rules no longer
        configured."""
        generation = self._generation
        assert generation is not None
        if config.health != previous.health:
            await asyncio.to_thread(generation.health.stop)  # one monitor for all
            generation.health = self._new_health(config, list(self.services))
            for service in self.services:
                service.set_health(generation.health.monitor.health)
        for part in generation.served:
            part.health_service.set_settings(config.health_service)

    # --- one resource ---

    async def _open(
        self,
        config: Config,
        served: ServedResource,
        policy: asyncio.Future[Policy],
        responder: Responder,
        health: Health | None,
    ) -> Served:
        """The service for one resource, serving on its socket (not registered yet)."""
        if served.replicas.mps:
            responder = replace(
                responder, mps=MpsAllocation(served.name, config.mps_root, served.replicas.count)
            )
        manager = ResourceManager(served, responder)
        service = DevicePluginService(
            manager,
            policy,
            pre_start_required=config.pre_start_required,
            health=health.monitor.health if health is not None else None,
            executor=self._executor,
            preferred_budget_s=preferred_budget(config.allocation_budget_s),
        )
        name = served.name
        health_service = PluginHealthService(
            name,
            config.health_service,
            on_status=lambda serving: self._metrics.set_serving(name, serving),
        )
        self._metrics.set_serving(name, health_service.serving)
        service.watch_health(health_service.set_health)
        per_gpu = Counter(device.gpu.index for device in manager.devices)  # GPU -> devices
        service.watch_health(lambda h: self._metrics.observe_health(name, h, per_gpu))
        path = os.path.join(config.device_plugin_dir, served.socket)
        return await serve_socket(path, service, health_service, self._metrics)

    async def _registrar(
        self, config: Config, served: Served, watcher: DirWatcher, ready: asyncio.Event | None
    ) -> None:
        """Register one served resource -- once ``ready`` is set, for an MPS resource: its
        daemon ready the first time -- and keep it registered for the generation's life. A
        registrar only ends by cancellation; if it fails, the plugin must not stay up
        unregistered: stop, and exit non-zero."""
        if ready is not None:
            await ready.wait()
        service, health_service, sock = served.service, served.health_service, served.socket
        name = service.resource_name

        def registered() -> None:
            self._metrics.registered(name)
            health_service.set_registered(True)

        def unregistered() -> None:
            self._metrics.kubelet_restarted(name)
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
        self._log.info(
            "serving",
            resource=name,
            socket=sock.path,
            devices=service.uuids(),
            replicas=service.manager.replicas.count,
            unhealthy=service.unhealthy_uuids(),
        )
        try:
            await registrar.run()
        except NvpluginError as exc:
            self._on_fatal(exc)
        except Exception as exc:
            self._on_fatal(NvpluginError(f"registration failed: {exc!r}"))

    def _new_health(self, config: Config, services: Sequence[DevicePluginService]) -> Health:
        """One started health monitor for every served GPU, under ``config``'s health rules."""
        forward = Forward(asyncio.get_running_loop(), services)
        monitor = HealthMonitor(
            self._node.nvml,
            sorted({gpu for service in services for gpu in service.manager.gpus}),
            config.health.settings(),
            forward,
            on_xid=self._metrics.xid,
            on_reasons=self._metrics.gpu_reasons,
            cordon=self._cordon,
        )
        self._metrics.gpu_reasons(monitor.reasons)  # a new monitor: nothing else holds
        monitor.start()
        return Health(monitor, forward)

    async def _policies(
        self, config: Config, topology: Topology, resources: Sequence[ServedResource]
    ) -> dict[str, Policy]:
        """The resources' policies, built on a worker thread; said once, built or failed."""
        try:
            policies = await asyncio.to_thread(
                _build_policies,
                config.allocation_policy,
                topology,
                resources,
                budget_s=config.allocation_budget_s,
            )
        except Exception as exc:
            self._log.error("allocation policy failed to build", error=str(exc))
            raise
        self._log.info("allocation policy ready", policy=config.allocation_policy)
        return policies


def _build_policies(
    name: str, topology: Topology, resources: Sequence[ServedResource], *, budget_s: float
) -> dict[str, Policy]:
    """The resources' policies with their start-up work done (on a worker thread), then the heap
    that work freed handed back to the OS (:mod:`.heap`), before the resources register."""
    policies = resource_policies(name, topology, resources, budget_s=budget_s)
    released = release_freed_heap()
    get_logger("nvplugin.daemon").debug("start-up heap handed back", released=released)
    return policies


async def _policy_of(build: asyncio.Task[dict[str, Policy]], name: str) -> Policy:
    """Resource ``name``'s policy, once the build is done (its failure too)."""
    return (await asyncio.shield(build))[name]


def _follow_mps(service: DevicePluginService, ready: asyncio.Event, state: str | None) -> None:
    """An MPS daemon's state for its resource: every device held while it is not ready;
    ``ready`` set (the registrar may start) the first time it is."""
    service.hold(None if state is None else f"MPS control daemon: {state}")
    if state is None:
        ready.set()


class Forward:
    """The health monitor's ``on_change``: hands each map to the services on the event loop
    (each takes the GPUs it serves; replicas follow their GPU).

    Called on the monitor's thread. Maps are coalesced on their way to the loop: at most one
    hand-over is queued at a time and it carries the latest map, so a storm of changes while the
    loop is busy queues one callback, not one per change. The targets can change on SIGHUP
    while the monitor (and the health it has seen) lives on.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, services: Sequence[DevicePluginService]
    ) -> None:
        self._loop = loop
        self._services = list(services)
        self._lock = threading.Lock()
        self._latest: dict[int, bool] | None = None  # set while a hand-over is queued

    def retarget(self, services: Sequence[DevicePluginService]) -> None:
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
