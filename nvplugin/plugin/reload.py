"""SIGHUP: reload the config and apply it, keeping the running one whenever anything fails.

What a new config changes, and how, is decided by :func:`reload_steps` -- a pure function of the
old and the new config, from each setting's declared reload mode -- and carried out by
:func:`reload`:

- HTTP endpoints whose address changed move (one that cannot bind is logged and left off);
- a config that changes only what can change while serving (log, health rules, health service,
  metrics, probes) is applied in place: the sockets, the kubelet's streams and the registrations
  stay, so no request fails meanwhile;
- anything else re-serves every resource: stop, start under the new config -- and if that fails,
  start under the previous one again. The health monitor (and what it has seen) is kept across
  when the health rules are the same.

Whatever goes wrong -- a config that fails to load in any way, even one nobody foresaw, or one
that cannot be served -- is logged and the running config kept: a reload never ends the plugin
(every GPU would be lost to the kubelet), unless what served a moment ago cannot be served again.
Keeping the running config means all of it: a rollback also moves back what the reload had
already moved (the HTTP endpoints, to their previous addresses) and the log settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nvplugin.config import Config
from nvplugin.config.reload import reload_plan
from nvplugin.errors import NvpluginError, reason
from nvplugin.log import configure, get_logger
from nvplugin.nodesession import NodeSession
from nvplugin.plugin.assembly import Resources
from nvplugin.plugin.endpoints import KINDS, Endpoints, endpoint_address
from nvplugin.rm import plan_for


@dataclass(frozen=True)
class ReloadSteps:
    """What applying a new config takes (see the module docstring)."""

    endpoints: tuple[str, ...]
    """The HTTP endpoints (:data:`~nvplugin.plugin.endpoints.KINDS`) whose address changed."""
    in_place: bool
    """Nothing the kubelet sees changes: keep the sockets and registrations."""
    keep_health: bool
    """Same health rules: a re-serve keeps the health monitor and what it has seen."""
    restart: tuple[str, ...] = ()
    """Changed settings read once, before serving: they take effect at the next start."""


def reload_steps(previous: Config, config: Config) -> ReloadSteps:
    """How to go from ``previous`` to ``config`` (pure): which settings changed in which mode is
    the settings' own declaration (:func:`nvplugin.config.reload.reload_plan`)."""
    changed = reload_plan(previous, config)
    return ReloadSteps(
        endpoints=tuple(
            kind
            for kind in KINDS
            if endpoint_address(config, kind) != endpoint_address(previous, kind)
        ),
        in_place=not changed.reserve,
        keep_health=previous.health == config.health,
        restart=changed.restart,
    )


async def reload(
    previous: Config,
    load: Callable[[], Config],
    node: NodeSession | None,
    resources: Resources | None,
    endpoints: Endpoints,
) -> Config:
    """Reload with ``load`` and apply the result; returns the config now in effect (``previous``
    when the new one is refused). NvpluginError only when neither the new config nor the
    previous one can be served any more."""
    log = get_logger("nvplugin.daemon")
    try:
        config = load()
        if node is not None:  # what only the node can tell (MIG, the kubelet's limit)
            plan_for(config, node.topology.gpus)
    except Exception as exc:
        log.error("config reload failed; keeping the running config", error=reason(exc))
        return previous
    configure(config.log.format, config.log.level)
    log.info("config reloaded", config=config.as_dict())
    plan = reload_steps(previous, config)
    if plan.restart:
        # Read once, before serving: re-serving would not apply them either.
        log.warning("takes effect at the next start", keys=list(plan.restart))
    for kind in plan.endpoints:
        await endpoints.move(kind, endpoint_address(config, kind))
    if resources is None:
        return config
    if resources.served and plan.in_place:
        try:
            await resources.apply_in_place(config, previous)
        except Exception as exc:
            await _roll_back(previous, plan, endpoints)
            log.error(
                "cannot apply the reloaded config; keeping the running one", error=reason(exc)
            )
            return previous
        log.info(
            "config applied in place; still registered",
            resources=[service.resource_name for service in resources.services],
        )
        return config
    health = await resources.stop(keep_health=plan.keep_health)
    try:
        await resources.start(config, health)
        return config
    except Exception as exc:
        log.error(
            "cannot serve with the reloaded config; going back to the previous one",
            error=reason(exc),
        )
        await _roll_back(previous, plan, endpoints)
    try:
        await resources.start(previous, health)
    except Exception as again:
        # What served a moment ago cannot be served again (the directory went away): exit 1
        # with the reason, so that Kubernetes restarts the plugin.
        raise NvpluginError(
            f"cannot serve the previous config again after a failed reload: {reason(again)}"
        ) from None
    return previous


async def _roll_back(previous: Config, plan: ReloadSteps, endpoints: Endpoints) -> None:
    """Undo what the reload changed before it failed: the log settings, and each HTTP endpoint
    it moved back to ``previous``'s address (one that cannot bind there is logged and off)."""
    configure(previous.log.format, previous.log.level)
    for kind in plan.endpoints:
        await endpoints.move(kind, endpoint_address(previous, kind))
