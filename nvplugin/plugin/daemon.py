"""``nvplugin serve``: the daemon's life from discovery to the last socket removed.

Start: log the effective config once, open the node (NVML, real or simulated; discovery happens
once, here), then per resource start the service and its socket, the health monitor and the
registrar. The allocation policy's tables are computed on a worker thread while the plugin
registers, so a 16-GPU node is advertised without waiting for them.

Signals: SIGTERM/SIGINT stop serving, end every ListAndWatch stream, remove our sockets and
return 0. SIGHUP reloads the config (same file, flags and environment), rebuilds the resources
and registers them again; a config that no longer loads is logged and the running one kept.

NVML failing at start: with ``fail_on_init_error`` the error propagates (the CLI prints it and
exits 1); without, the daemon keeps running with no devices, retries discovery every
``discovery_retry_s`` seconds and registers once GPUs appear.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from nvplugin.allocator import Policy, make_policy
from nvplugin.config import Config
from nvplugin.errors import InputError, NvpluginError
from nvplugin.log import configure, get_logger
from nvplugin.node import NodeSession, open_node
from nvplugin.node.health import HealthMonitor, HealthSettings
from nvplugin.plugin.registration import DirWatcher, Registrar
from nvplugin.plugin.resources import socket_name
from nvplugin.plugin.responses import make_responder
from nvplugin.plugin.server import DevicePluginService, PluginSocket

DISCOVERY_RETRY_S = 30.0
STOP_GRACE_S = 0.3
"""How long in-flight unary RPCs get at shutdown; streams are ended at once."""

NodeOpener = Callable[[str | None], NodeSession]


@dataclass
class _Resource:
    """One advertised resource: its service, socket, registrar task and health monitor."""

    config: Config
    service: DevicePluginService
    socket: PluginSocket
    registrar: Registrar
    policy: asyncio.Future[Policy]
    health: _Health
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@dataclass
class _Health:
    """A health monitor, the settings it runs with, and where it sends its changes."""

    monitor: HealthMonitor
    settings: HealthSettings
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
        opener: NodeOpener = open_node,
    ) -> None:
        self.config = config
        self._reload = reload
        self._simulate = simulate
        self._discovery_retry_s = discovery_retry_s
        self._opener = opener
        self._log = get_logger("nvplugin.daemon")
        self._stop = asyncio.Event()
        self._hup = asyncio.Event()
        self._node: NodeSession | None = None
        self._resource: _Resource | None = None
        self._watcher: DirWatcher | None = None
        self._watcher_task: asyncio.Task[None] | None = None

    @property
    def node(self) -> NodeSession | None:
        return self._node

    @property
    def service(self) -> DevicePluginService | None:
        return self._resource.service if self._resource is not None else None

    def stop(self) -> None:
        """Ask the daemon to shut down (what SIGTERM does)."""
        self._stop.set()

    def reload(self) -> None:
        """Ask the daemon to reload its config (what SIGHUP does)."""
        self._hup.set()

    async def run(self, *, handle_signals: bool = True) -> int:
        """Serve until stopped; returns the exit status (0). Fatal start-up errors raise."""
        loop = asyncio.get_running_loop()
        if handle_signals:
            loop.add_signal_handler(signal.SIGTERM, self._on_signal, "SIGTERM")
            loop.add_signal_handler(signal.SIGINT, self._on_signal, "SIGINT")
            loop.add_signal_handler(signal.SIGHUP, self._on_signal, "SIGHUP")
        self._log.info("effective config", config=self.config.as_dict(), simulate=self._simulate)
        try:
            await self._serve()
        finally:
            await self._shutdown()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)
        self._log.info("stopped")
        return 0

    def _on_signal(self, name: str) -> None:
        self._log.info("signal", signal=name)
        if name == "SIGHUP":
            self._hup.set()
        else:
            self._stop.set()

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
                    return node
                node.close()
                self._log.warning("no GPUs found; waiting", retry_s=self._discovery_retry_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._discovery_retry_s):
                    await self._stop.wait()
        return None

    # --- resources ---

    async def _start_resource(self, config: Config, health: _Health | None = None) -> None:
        """Serve ``config``'s resource; ``health`` is a running monitor to keep (SIGHUP)."""
        assert self._node is not None
        loop = asyncio.get_running_loop()
        topology = self._node.topology
        os.makedirs(config.device_plugin_dir, mode=0o750, exist_ok=True)
        watcher = await self._ensure_watcher(config.device_plugin_dir)
        policy: asyncio.Future[Policy] = loop.run_in_executor(
            None, make_policy, config.allocation_policy, topology
        )
        policy.add_done_callback(self._policy_done)
        service = DevicePluginService(
            config.resource_name,
            topology.gpus,
            policy,
            responder=make_responder(),
            pre_start_required=config.pre_start_required,
            health=health.monitor.health if health is not None else None,
        )
        sock = PluginSocket(
            os.path.join(config.device_plugin_dir, socket_name(config.resource_name)), service
        )
        try:
            await sock.start()  # NvpluginError when another process serves the path
        except BaseException:
            policy.cancel()
            raise
        if health is None:
            forward = _Forward(loop, service)
            settings = config.health.settings()
            monitor = HealthMonitor(
                self._node.nvml, [gpu.index for gpu in service.gpus], settings, forward
            )
            monitor.start()
            health = _Health(monitor, settings, forward)
        else:
            health.forward.retarget(service)
            service.set_health(health.monitor.health)  # a change may have raced the rewire
        registrar = Registrar(sock, service, config.kubelet_socket_path, service.options, watcher)
        resource = _Resource(config, service, sock, registrar, policy, health)
        resource.tasks.append(asyncio.create_task(registrar.run(), name="nvplugin-registrar"))
        self._resource = resource
        self._log.info(
            "serving",
            resource=config.resource_name,
            socket=sock.path,
            devices=[gpu.uuid for gpu in service.gpus],
            unhealthy=[gpu.uuid for gpu in service.gpus if not service.health[gpu.index]],
        )

    async def _ensure_watcher(self, directory: str) -> DirWatcher:
        if self._watcher is not None and self._watcher.directory == directory:
            return self._watcher
        await self._stop_watcher()
        self._watcher = DirWatcher(directory)
        self._watcher_task = asyncio.create_task(self._watcher.run(), name="nvplugin-dirwatch")
        return self._watcher

    def _policy_done(self, future: asyncio.Future[Policy]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            self._log.error("allocation policy failed to build", error=str(exc))
        else:
            self._log.info("allocation policy ready", policy=future.result().name)

    async def _stop_resource(self, keep_health: bool) -> _Health | None:
        """Stop serving the current resource; returns its health monitor if asked to keep it."""
        resource, self._resource = self._resource, None
        if resource is None:
            return None
        await _cancel(resource.tasks)
        resource.service.close()
        await resource.socket.stop(STOP_GRACE_S)
        if not resource.policy.done():
            resource.policy.cancel()
        if keep_health:
            return resource.health
        await asyncio.to_thread(resource.health.stop)
        return None

    async def _stop_watcher(self) -> None:
        task, self._watcher_task = self._watcher_task, None
        self._watcher = None
        if task is not None:
            await _cancel([task])

    async def _reload_config(self) -> None:
        if self._reload is None:
            self._log.info("SIGHUP: nothing to reload")
            return
        try:
            config = self._reload()
        except InputError as exc:
            self._log.error("config reload failed; keeping the running config", error=str(exc))
            return
        configure(config.log.format, config.log.level)
        self._log.info("config reloaded", config=config.as_dict())
        previous = self.config
        # Same health settings: keep the monitor and what it has seen. New ones: a fresh monitor,
        # as the old verdicts were made by rules no longer configured.
        health = await self._stop_resource(keep_health=previous.health == config.health)
        try:
            await self._start_resource(config, health)
            self.config = config
        except NvpluginError as exc:
            self._log.error(
                "cannot serve with the reloaded config; going back to the previous one",
                error=str(exc),
            )
            configure(previous.log.format, previous.log.level)
            await self._start_resource(previous, health)

    async def _shutdown(self) -> None:
        await self._stop_resource(keep_health=False)
        await self._stop_watcher()
        if self._node is not None:
            node, self._node = self._node, None
            await asyncio.to_thread(node.close)


class _Forward:
    """The health monitor's ``on_change``: hands each map to the service on the event loop.

    Called on the monitor's thread; ``call_soon_threadsafe`` moves the update to the loop. The
    target can change on SIGHUP while the monitor (and the health it has seen) lives on.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, service: DevicePluginService) -> None:
        self._loop = loop
        self._service = service

    def retarget(self, service: DevicePluginService) -> None:
        self._service = service

    def __call__(self, health: dict[int, bool]) -> None:
        service = self._service
        with contextlib.suppress(RuntimeError):  # the loop closed while shutting down
            self._loop.call_soon_threadsafe(service.set_health, health)


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
) -> int:
    """Configure logging, run the daemon on a fresh event loop, return its exit status."""
    configure(config.log.format, config.log.level)
    daemon = Daemon(config, reload=reload, simulate=simulate, discovery_retry_s=discovery_retry_s)
    return asyncio.run(daemon.run())
