"""Which GPU (or MIG device) is served under which resource name on this node.

Resources by model (``resources.gpus``: first matching pattern wins, the rest stay the default
resource; ``resources.exclude`` hides GPUs from all), the MIG strategy (``flags.migStrategy``:
MIG devices as the GPU resource, or one resource per profile, renamed by ``resources.mig``) and
time-slicing renames make several resource names out of one node. The config checks what it
can when it loads (:func:`nvplugin.config.layout.resolve_layout`: a collision or a bad name is
exit 2 naming the key); :func:`plan_resources` applies them to the discovered GPUs (one server,
socket and registration per non-empty resource), checks what only the node can tell (the MIG
resources' names, the kubelet's message size) and says which parts of the config do nothing on
this node (warnings, logged once at start).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nvplugin.config.layout import (
    GpuPattern,
    ResourceRules,
    TimeSlicing,
    check_served,
    model_matches,
)
from nvplugin.config.schema import Invalid
from nvplugin.errors import InputError
from nvplugin.node.model import Gpu
from nvplugin.plugin.listing import check_listing
from nvplugin.plugin.migstrategy import ServedMig, apply_strategy
from nvplugin.plugin.sharing import NOT_SHARED, Device, Replicas, base_devices
from nvplugin.resourcenames import socket_name

if TYPE_CHECKING:
    from nvplugin.config.model import Config

EXCLUDED_LABEL = "(excluded)"


@dataclass(frozen=True)
class ServedResource:
    """One resource the daemon serves: one server, one socket, one registration.

    ``gpus``: the GPUs served whole, or -- a MIG resource -- the parents of its MIG devices
    (``migs``, parent then MIG index order), whose health its devices follow."""

    name: str
    gpus: tuple[Gpu, ...]
    replicas: Replicas = NOT_SHARED
    base: str = ""
    """The resource before time-slicing renamed it ("" = same as ``name``)."""
    migs: tuple[ServedMig, ...] = ()

    @property
    def socket(self) -> str:
        return socket_name(self.name)

    @property
    def bases(self) -> tuple[Device, ...]:
        """What it serves before replication: its GPUs, or its MIG devices."""
        return base_devices(self.gpus, self.migs)

    @property
    def device_count(self) -> int:
        """How many devices it advertises."""
        return len(self.bases) * self.replicas.count

    def label(self) -> str:
        """What ``nvplugin devices`` shows for one of its GPUs or MIG devices."""
        if not self.replicas.shared:
            return self.name
        count = self.replicas.count
        return f"{self.name} x{count} (<uuid>::0..{count - 1})"


@dataclass(frozen=True)
class ResourcePlan:
    """What a node's GPUs become under a config. ``resources`` holds only non-empty resources,
    ordered by their lowest GPU index (then MIG index); ``assignment`` maps every GPU served
    whole or excluded to its resource name (None: excluded); ``mig_assignment`` does the same
    for MIG devices (by ``<gpu>:<mig index>``); ``mig_gpus`` lists the GPUs served as their MIG
    devices, with how many they have; ``warnings`` are the config parts that do nothing on
    this node."""

    resources: tuple[ServedResource, ...]
    assignment: dict[int, str | None]
    empty: tuple[str, ...]
    warnings: tuple[str, ...]
    mig_strategy: str = "none"
    mig_assignment: dict[str, str | None] | None = None
    mig_gpus: dict[int, int] | None = None

    def resource(self, name: str) -> ServedResource | None:
        for served in self.resources:
            if served.name == name:
                return served
        return None

    def labels(self) -> dict[int, str]:
        """GPU index -> what ``nvplugin devices`` shows: the resource, its replica IDs,
        ``(excluded)``, or that the GPU is served as its MIG devices."""
        out: dict[int, str] = {}
        for index, name in self.assignment.items():
            served = None if name is None else self.resource(name)
            out[index] = EXCLUDED_LABEL if served is None else served.label()
        for index, count in (self.mig_gpus or {}).items():
            out[index] = f"(as {count} MIG devices)" if count else "(MIG, no MIG devices)"
        return dict(sorted(out.items()))

    def mig_labels(self) -> dict[str, str]:
        """``<gpu>:<mig index>`` -> what ``nvplugin devices`` shows for that MIG device."""
        out: dict[str, str] = {}
        for label, name in (self.mig_assignment or {}).items():
            served = None if name is None else self.resource(name)
            out[label] = EXCLUDED_LABEL if served is None else served.label()
        return out

    def as_dict(self) -> dict[str, object]:
        """The plan for ``devices --output json``: each served resource with its socket, GPU
        indices (a MIG resource: its parents and its MIG devices), replicas per device and
        advertised device count; the excluded GPUs and MIG devices; the empty resources; the
        warnings."""
        resources = []
        for served in self.resources:
            entry: dict[str, object] = {
                "name": served.name,
                "socket": served.socket,
                "gpus": [gpu.index for gpu in served.gpus],
            }
            if served.migs:
                entry["mig_devices"] = [m.mig.label for m in served.migs]
            entry.update(
                replicas=served.replicas.count,
                devices=served.device_count,
                renamed_from=served.base or None,
            )
            resources.append(entry)
        return {
            "mig_strategy": self.mig_strategy,
            "resources": resources,
            "excluded": sorted(i for i, name in self.assignment.items() if name is None),
            "excluded_mig_devices": [
                label for label, name in (self.mig_assignment or {}).items() if name is None
            ],
            "empty": list(self.empty),
            "warnings": list(self.warnings),
        }


def plan_for(config: Config, gpus: Sequence[Gpu]) -> ResourcePlan:
    """:func:`plan_resources` with ``config``'s resource name, rules, time-slicing and MIG
    strategy: what the plugin serves of ``gpus`` under ``config``."""
    return plan_resources(
        gpus, config.resource_name, config.resources, config.time_slicing, config.mig_strategy
    )


def plan_resources(
    gpus: Sequence[Gpu],
    resource_name: str,
    rules: ResourceRules,
    time_slicing: TimeSlicing,
    mig_strategy: str = "none",
) -> ResourcePlan:
    """Split ``gpus`` into served resources (names already resolved by :func:`resolve_layout`).

    Excluded GPUs go nowhere (nor do their MIG devices); ``mig_strategy`` then splits the rest
    into GPUs served whole and MIG devices (:func:`apply_strategy`; InputError when ``single``
    does not fit the node). Whole GPUs: first matching ``resources.gpus`` pattern wins, unmatched
    GPUs stay ``resource_name``. MIG devices: under ``mixed`` the first matching
    ``resources.mig`` pattern (on the profile) names the resource, else ``<domain>/mig-<profile>``;
    under ``single`` they are ``resource_name``. InputError when two resources would share a name
    or a socket, or when a time-sliced resource would list more devices than the kubelet can
    receive (:mod:`nvplugin.plugin.listing`).
    """
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    visible = [gpu for gpu in ordered if not rules.exclude.hides(gpu.uuid, gpu.name)]
    layout = apply_strategy(visible, mig_strategy, resource_name=resource_name)
    warnings = list(layout.warnings)
    warnings += _pattern_warnings(rules, ordered, layout.gpus)
    mig_devices = [served for _, devices in layout.mig for served in devices]
    warnings += _mig_warnings(rules, mig_strategy, mig_devices)

    members: dict[str, list[Gpu]] = {}
    mig_members: dict[str, list[ServedMig]] = {}
    base_of: dict[str, str] = {}  # served name -> the resource before time-slicing
    origins: dict[tuple[str, str], None] = {}  # (base resource, the key path that made it)
    assignment: dict[int, str | None] = {gpu.index: None for gpu in ordered}
    for gpu in layout.gpus:
        matched = _first_match(rules.gpus, gpu.name)
        base, at = (
            (resource_name, "nvplugin.resourceName")
            if matched is None
            else (rules.gpus[matched].name, f"resources.gpus[{matched}].name")
        )
        name = _served_name(time_slicing, base)
        assignment[gpu.index] = name
        members.setdefault(name, []).append(gpu)
        base_of[name] = base
        origins[(base, at)] = None
    mig_assignment: dict[str, str | None] = {}
    mig_gpus: dict[int, int] = {}
    for gpu in visible:
        if gpu.mig_enabled and gpu not in layout.gpus:
            del assignment[gpu.index]
            mig_gpus[gpu.index] = len(gpu.mig_devices)
    for default, devices in layout.mig:
        for served in devices:
            if served.mig.uuid in rules.exclude.uuids:
                mig_assignment[served.mig.label] = None
                continue
            base, at = default, f"MIG profile {served.mig.profile} (migStrategy mixed)"
            if mig_strategy == "single":
                at = "nvplugin.resourceName"
            else:
                matched = _first_match(rules.mig, served.mig.profile)
                if matched is not None:
                    base, at = rules.mig[matched].name, f"resources.mig[{matched}].name"
            name = _served_name(time_slicing, base)
            mig_assignment[served.mig.label] = name
            mig_members.setdefault(name, []).append(served)
            base_of[name] = base
            origins[(base, at)] = None
    try:  # a MIG resource under a name already served (whole GPUs, another base) is refused
        check_served(list(origins), time_slicing)
    except Invalid as exc:
        raise InputError(f'config key "{exc.at}": {exc.message}') from None

    resources = []
    for name, group in members.items():
        resources.append(_served(name, base_of[name], time_slicing, tuple(group)))
    for name, migs in mig_members.items():
        ordered_migs = tuple(sorted(migs, key=lambda m: (m.gpu.index, m.mig.index)))
        parents = tuple({m.gpu.index: m.gpu for m in ordered_migs}.values())
        resources.append(_served(name, base_of[name], time_slicing, parents, ordered_migs))
    resources.sort(key=_first_unit)
    for resource in resources:  # what the kubelet can receive bounds the replicas
        if resource.replicas.shared:
            entry = time_slicing.entry(resource.base or resource.name)
            number = time_slicing.resources.index(entry) if entry is not None else 0
            check_listing(
                resource.name,
                resource.bases,
                resource.replicas.count,
                f"sharing.timeSlicing.resources[{number}].replicas",
            )
    configured = [resource_name, *(p.name for p in rules.gpus)]
    empty = [
        name
        for name in dict.fromkeys(_served_name(time_slicing, base) for base in configured)
        if name not in members and name not in mig_members
    ]
    served_bases = set(base_of.values())
    for number, entry in enumerate(time_slicing.resources):
        if entry.name not in served_bases and entry.name not in configured:
            warnings.append(
                f"sharing.timeSlicing.resources[{number}].name {entry.name} is no resource of "
                "this node (no MIG device is served as it)"
            )
    return ResourcePlan(
        tuple(resources),
        assignment,
        tuple(empty),
        tuple(warnings),
        mig_strategy,
        mig_assignment,
        mig_gpus,
    )


def _served_name(time_slicing: TimeSlicing, base: str) -> str:
    entry = time_slicing.entry(base)
    return base if entry is None else time_slicing.served_name(entry)


def _served(
    name: str,
    base: str,
    time_slicing: TimeSlicing,
    gpus: tuple[Gpu, ...],
    migs: tuple[ServedMig, ...] = (),
) -> ServedResource:
    entry = time_slicing.entry(base)
    replicas = (
        NOT_SHARED
        if entry is None
        else Replicas(
            entry.replicas, time_slicing.fail_requests_greater_than_one, time_slicing.allocation
        )
    )
    return ServedResource(name, gpus, replicas, "" if base == name else base, migs)


def _first_unit(served: ServedResource) -> tuple[int, int]:
    """Resources in order of their lowest GPU index; a MIG resource by its first MIG device."""
    if served.migs:
        return served.migs[0].gpu.index, served.migs[0].mig.index
    return served.gpus[0].index, -1


def _pattern_warnings(
    rules: ResourceRules, ordered: Sequence[Gpu], whole: Sequence[Gpu]
) -> list[str]:
    """``resources.gpus`` patterns matching no GPU served whole; exclusions matching nothing."""
    models = ", ".join(sorted({gpu.name for gpu in ordered})) or "none"
    warnings = []
    for number, pattern in enumerate(rules.gpus):
        at = f"resources.gpus[{number}].pattern {pattern.pattern!r}"
        hits = [gpu for gpu in whole if pattern.matches(gpu.name)]
        if not hits:
            if any(pattern.matches(gpu.name) for gpu in ordered):
                warnings.append(f"{at} matches only GPUs excluded or served as MIG devices")
            else:
                warnings.append(f"{at} matches no GPU on this node (models: {models})")
        elif all(_first_match(rules.gpus, gpu.name) != number for gpu in hits):
            warnings.append(f"{at} matches only GPUs an earlier pattern already took")
    known = {gpu.uuid for gpu in ordered} | {m.uuid for gpu in ordered for m in gpu.mig_devices}
    for number, uuid in enumerate(rules.exclude.uuids):
        if uuid not in known:
            warnings.append(
                f"resources.exclude.uuids[{number}] {uuid} is not a GPU or MIG device on this node"
            )
    for number, model in enumerate(rules.exclude.models):
        if not any(model_matches(model, gpu.name) for gpu in ordered):
            warnings.append(
                f"resources.exclude.models[{number}] {model!r} matches no GPU on this node "
                f"(models: {models})"
            )
    return warnings


def _mig_warnings(
    rules: ResourceRules, mig_strategy: str, devices: Sequence[ServedMig]
) -> list[str]:
    """``resources.mig`` under a strategy that does not use it, or matching no MIG device."""
    if not rules.mig:
        return []
    if mig_strategy != "mixed":
        return [
            f"resources.mig applies under migStrategy mixed only; migStrategy is {mig_strategy}"
        ]
    profiles = sorted({served.mig.profile for served in devices})
    warnings = []
    for number, pattern in enumerate(rules.mig):
        at = f"resources.mig[{number}].pattern {pattern.pattern!r}"
        hits = [p for p in profiles if pattern.matches(p)]
        if not hits:
            shown = ", ".join(profiles) or "none"
            warnings.append(f"{at} matches no MIG device on this node (profiles: {shown})")
        elif all(_first_match(rules.mig, p) != number for p in hits):
            warnings.append(f"{at} matches only MIG devices an earlier pattern already took")
    return warnings


def _first_match(patterns: Sequence[GpuPattern], name: str) -> int | None:
    """The first pattern matching ``name`` (a GPU model, or a MIG profile)."""
    for number, pattern in enumerate(patterns):
        if pattern.matches(name):
            return number
    return None
