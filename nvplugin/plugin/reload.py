"""SIGHUP: reload the config and apply it, keeping the running one whenever anything fails.

What a new config changes, and how, is decided by :func:`reload_plan` -- a pure function of the
old and the new config -- and carried out by :func:`reload`:

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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from nvplugin.config import Config
from nvplugin.errors import NvpluginError, reason
from nvplugin.log import configure, get_logger
from nvplugin.node import NodeSession
from nvplugin.plugin.assembly import Resources
from nvplugin.plugin.endpoints import KINDS, Endpoints, endpoint_address
from nvplugin.rm import plan_for


@dataclass(frozen=True)
class ReloadPlan:
    """What going from one config to another changes, and how (see the module docstring)."""

    endpoints: tuple[str, ...]
    """The HTTP endpoints (:data:`~nvplugin.plugin.endpoints.KINDS`) whose address changed."""
    in_place: bool
    """Nothing the kubelet sees changes: keep the sockets and registrations."""
    keep_health: bool
    """Same health rules: a re-serve keeps the health monitor and what it has seen."""


def reload_plan(previous: Config, config: Config) -> ReloadPlan:
    """How to go from ``previous`` to ``config`` (pure)."""
    return ReloadPlan(
        endpoints=tuple(
            kind
            for kind in KINDS
            if endpoint_address(config, kind) != endpoint_address(previous, kind)
        ),
        in_place=_same_sockets(previous, config),
        keep_health=previous.health == config.health,
    )


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
    plan = reload_plan(previous, config)
    for kind in plan.endpoints:
        await endpoints.move(kind, endpoint_address(config, kind))
    if resources is None:
        return config
    if resources.served and plan.in_place:
        try:
            await resources.apply_in_place(config, previous)
        except Exception as exc:
            configure(previous.log.format, previous.log.level)
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
        configure(previous.log.format, previous.log.level)
    try:
        await resources.start(previous, health)
    except Exception as again:
        # What served a moment ago cannot be served again (the directory went away): exit 1
        # with the reason, so that Kubernetes restarts the plugin.
        raise NvpluginError(
            f"cannot serve the previous config again after a failed reload: {reason(again)}"
        ) from None
    return previous
