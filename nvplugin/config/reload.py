"""What a reload (SIGHUP) must do to go from the running config to a new one: pure, from each
setting's declared :class:`~nvplugin.config.schema.Reload` mode.

- in place: log, health rules, the health service, the metrics and probe addresses, and the
  settings nvplugin accepts but does not act on: applied while serving, nothing the kubelet sees
  changes.
- re-serve: everything that shapes what is served or how (resource names, strategies, the
  device-plugin directory, the allocation policy, ...): the resources are served again.
- restart: read once, before the serve loop (``flags.failOnInitError`` while the node is
  discovered, ``flags.plugin.containerDriverRoot`` where NVML is loaded from): the new value
  takes effect at the next start; re-serving would not apply it.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvplugin.config.declare import value_at
from nvplugin.config.model import ATTRIBUTES, SETTINGS, Config
from nvplugin.config.schema import Reload


@dataclass(frozen=True)
class ReloadPlan:
    """The key paths whose value changed, by what applying them needs (file order)."""

    in_place: tuple[str, ...] = ()
    reserve: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()

    @property
    def changed(self) -> tuple[str, ...]:
        return self.in_place + self.reserve + self.restart


def reload_plan(old: Config, new: Config) -> ReloadPlan:
    """Which settings differ between ``old`` and ``new``, by reload mode. The config's source
    and notes are no settings: a new file path with the same values changes nothing."""
    changed: dict[Reload, list[str]] = {mode: [] for mode in Reload}
    for path, attrs in ATTRIBUTES.items():
        if value_at(old, attrs) != value_at(new, attrs):
            changed[SETTINGS[path].reload].append(path)
    return ReloadPlan(
        in_place=tuple(changed[Reload.IN_PLACE]),
        reserve=tuple(changed[Reload.RESERVE]),
        restart=tuple(changed[Reload.RESTART]),
    )
