"""Which units of a node -- whole GPUs and MIG devices -- are served under which resource name.

Resources by model (``resources.gpus``: first matching pattern wins, the rest stay the default
resource; ``resources.exclude`` hides GPUs and MIG devices from all), the MIG strategy
(``flags.migStrategy``: MIG devices as the GPU resource, or one resource per profile, renamed by
``resources.mig``) and sharing renames make several resource names out of one node. The
config checks what it can when it loads (:func:`nvplugin.config.layout.resolve_layout`: a
collision or a bad name is exit 2 naming the key); :func:`plan_resources` applies them to the
discovered GPUs (one server, socket and registration per non-empty resource), checks what only the
node can tell (the MIG resources' names, the kubelet's message size) and says which parts of the
config do nothing on this node (warnings, logged once at start).

Whole GPUs and MIG devices go through the same loop: the strategy lists the units in node order
with their default resource, a naming rule per kind renames them (``resources.gpus`` on the GPU's
model, ``resources.mig`` on the MIG device's profile), sharing replicates them -- time-slicing or
MPS, the same replicas (:mod:`nvplugin.rm.sharing`); MPS only whole GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nvplugin.config.layout import (
    MPS,
    GpuPattern,
    ResourceRules,
    Sharing,
    check_served,
    model_matches,
)
from nvplugin.config.schema import Invalid
from nvplugin.errors import InputError, shortened
from nvplugin.node.model import Gpu
from nvplugin.resourcenames import socket_name
from nvplugin.rm.devices import Device, Kind, health_gpus
from nvplugin.rm.listing import check_listing
from nvplugin.rm.migstrategy import apply_strategy
from nvplugin.rm.sharing import NOT_SHARED, Replicas

if TYPE_CHECKING:
    from nvplugin.config.model import Config

EXCLUDED_LABEL = "(excluded)"
MPS_MIG_ON_LABEL = "(MIG on: not shared through MPS)"


@dataclass(frozen=True)
class ServedResource:
    """One resource the daemon serves: one server, one socket, one registration.

    ``bases``: the units it serves before replication, all of one kind -- whole GPUs in index
    order, or MIG devices in node order (parent, then MIG index), each with its ``position``."""

    name: str
    bases: tuple[Device, ...]
    replicas: Replicas = NOT_SHARED
    base: str = ""
    """The resource before sharing renamed it ("" = same as ``name``)."""

    @property
    def socket(self) -> str:
        return socket_name(self.name)

    @property
    def kind(self) -> Kind:
        return self.bases[0].kind if self.bases else Kind.GPU

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        """The GPUs whose health its devices follow: its GPUs, or its MIG devices' parents."""
        return health_gpus(self.bases)

    @property
    def migs(self) -> tuple[Device, ...]:
        """Its MIG devices (none for a resource of whole GPUs)."""
        return tuple(device for device in self.bases if device.mig is not None)

    @property
    def devices(self) -> tuple[Device, ...]:
        """What it advertises: its units, or their replicas (unit order, then replica order)."""
        return self.replicas.devices(self.bases)

    @property
    def device_count(self) -> int:
        """How many devices it advertises."""
        return len(self.bases) * self.replicas.count

    def label(self) -> str:
        """What ``nvplugin devices`` shows for one of its GPUs or MIG devices."""
        if not self.replicas.shared:
            return self.name
        count = self.replicas.count
        mps = " MPS shares" if self.replicas.strategy == MPS else ""
        return f"{self.name} x{count}{mps} (<uuid>::0..{count - 1})"


def served_resource(
    name: str, units: Sequence[Device], replicas: Replicas = NOT_SHARED, base: str = ""
) -> ServedResource:
    """A resource over ``units`` (whole GPUs, or MIG devices) in node order, each MIG device
    placed at its position (what the resource's policy allocates)."""
    ordered = sorted(units, key=lambda device: device.order)
    bases = tuple(
        device if device.mig is None else _placed(device, position)
        for position, device in enumerate(ordered)
    )
    return ServedResource(name, bases, replicas, "" if base == name else base)


def _placed(device: Device, position: int) -> Device:
    return Device(device.id, device.gpu, device.replica, device.mig, position)


@dataclass(frozen=True)
class ResourcePlan:
    """What a node's GPUs become under a config. ``resources`` holds only non-empty resources,
    ordered by their first unit (GPU index, then MIG index); ``served_as`` maps every unit of the
    node -- each GPU served whole or excluded, each MIG device -- by its label (``3``, ``3:1``) to
    its resource name (None: excluded, or not served); ``gpus`` are the node's GPUs; ``warnings``
    are the config parts that do nothing on this node; ``mps_mig_on``: the GPUs with MIG on that
    MPS would have shared under migStrategy none, not served."""

    resources: tuple[ServedResource, ...]
    served_as: dict[str, str | None]
    empty: tuple[str, ...]
    warnings: tuple[str, ...]
    mig_strategy: str = "none"
    gpus: tuple[Gpu, ...] = ()
    mps_mig_on: tuple[int, ...] = ()

    def resource(self, name: str) -> ServedResource | None:
        for served in self.resources:
            if served.name == name:
                return served
        return None

    @property
    def assignment(self) -> dict[int, str | None]:
        """GPU index -> resource, for the GPUs served whole or excluded."""
        return {gpu.index: self.served_as[str(gpu.index)] for gpu in self._whole()}

    def labels(self) -> dict[int, str]:
        """GPU index -> what ``nvplugin devices`` shows: the resource, its replica IDs,
        ``(excluded)``, or that the GPU is served as its MIG devices."""
        out: dict[int, str] = {}
        for gpu in self.gpus:
            if gpu.index in self.mps_mig_on:
                out[gpu.index] = MPS_MIG_ON_LABEL
            elif str(gpu.index) in self.served_as:
                out[gpu.index] = self._shown(str(gpu.index))
            elif gpu.mig_devices:
                out[gpu.index] = f"(as {len(gpu.mig_devices)} MIG devices)"
            else:
                out[gpu.index] = "(MIG, no MIG devices)"
        return out

    def mig_labels(self) -> dict[str, str]:
        """``<gpu>:<mig index>`` -> what ``nvplugin devices`` shows for that MIG device."""
        return {label: self._shown(label) for label in self._mig_labels()}

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
            if served.kind is Kind.MIG:
                entry["mig_devices"] = [device.label for device in served.bases]
            entry.update(
                sharing=served.replicas.strategy if served.replicas.shared else None,
                replicas=served.replicas.count,
                devices=served.device_count,
                renamed_from=served.base or None,
            )
            resources.append(entry)
        return {
            "mig_strategy": self.mig_strategy,
            "resources": resources,
            "excluded": [
                gpu.index
                for gpu in self._whole()
                if self.assignment[gpu.index] is None and gpu.index not in self.mps_mig_on
            ],
            "mps_mig_on": list(self.mps_mig_on),
            "excluded_mig_devices": [
                label for label in self._mig_labels() if self.served_as[label] is None
            ],
            "empty": list(self.empty),
            "warnings": list(self.warnings),
        }

    def _whole(self) -> list[Gpu]:
        return [gpu for gpu in self.gpus if str(gpu.index) in self.served_as]

    def _mig_labels(self) -> list[str]:
        return [m.label for gpu in self.gpus for m in gpu.mig_devices if m.label in self.served_as]

    def _shown(self, label: str) -> str:
        name = self.served_as[label]
        served = None if name is None else self.resource(name)
        return EXCLUDED_LABEL if served is None else served.label()


def plan_for(config: Config, gpus: Sequence[Gpu]) -> ResourcePlan:
    """:func:`plan_resources` with ``config``'s resource name, rules, sharing and MIG
    strategy: what the plugin serves of ``gpus`` under ``config``."""
    return plan_resources(
        gpus, config.resource_name, config.resources, config.sharing, config.mig_strategy
    )


def plan_resources(
    gpus: Sequence[Gpu],
    resource_name: str,
    rules: ResourceRules,
    sharing: Sharing,
    mig_strategy: str = "none",
) -> ResourcePlan:
    """Split ``gpus`` into served resources (names already resolved by :func:`resolve_layout`).

    Excluded GPUs go nowhere (nor do their MIG devices); ``mig_strategy`` then lists the units
    of the rest (:func:`apply_strategy`; InputError when ``single`` does not fit the node): GPUs
    served whole and MIG devices. Each unit is named by the rule of its kind
    (:func:`_resource_of`), excluded MIG devices go nowhere. InputError when two resources would
    share a name or a socket, when a shared resource would list more devices than the kubelet
    can receive (:mod:`nvplugin.rm.listing`), or when an MPS resource would serve MIG devices.
    """
    ordered = tuple(sorted(gpus, key=lambda gpu: gpu.index))
    visible = [gpu for gpu in ordered if not rules.exclude.hides(gpu.uuid, gpu.name)]
    layout = apply_strategy(visible, mig_strategy, resource_name=resource_name)
    warnings = list(layout.warnings)
    warnings += _pattern_warnings(rules, ordered, layout.gpus)
    warnings += _mig_warnings(rules, mig_strategy, [d for d, _ in layout.units if d.mig])

    members: dict[str, list[Device]] = {}
    base_of: dict[str, str] = {}  # served name -> the resource before sharing
    # (base resource, the key path that made it) -> the kind of unit it serves
    origins: dict[tuple[str, str], Kind] = {}
    served_as: dict[str, str | None] = {
        str(gpu.index): None for gpu in ordered if gpu not in visible
    }
    mps_on_mig: list[Gpu] = []
    for device, default in layout.units:
        if device.mig is not None and device.mig.uuid in rules.exclude.uuids:
            served_as[device.label] = None
            continue
        base, at = _resource_of(device, default, rules, mig_strategy)
        if device.mig is None and device.gpu.mig_enabled and _mps_shared(sharing, base):
            # migStrategy none: a GPU with MIG on would be shared through MPS, which no GPU with
            # MIG on can run. Served MPS on the others; this one left out, named.
            served_as[device.label] = None
            mps_on_mig.append(device.gpu)
            continue
        name = sharing.served_name(base)
        served_as[device.label] = name
        members.setdefault(name, []).append(device)
        base_of[name] = base
        origins.setdefault((base, at), device.kind)
    if mps_on_mig:
        left_out = tuple(f"GPU {gpu.index} (" for gpu in mps_on_mig)
        warnings = [w for w in warnings if not w.startswith(left_out)]  # "advertised whole"
        which = ", ".join(str(gpu.index) for gpu in mps_on_mig)
        warnings.append(
            f"GPU {which} {'has' if len(mps_on_mig) == 1 else 'have'} MIG enabled and "
            "sharing.mps would share them: MPS cannot run on a GPU with MIG on, so they are not "
            "served (MPS is served on the GPUs with MIG off; NVIDIA's plugin skips MIG devices "
            "for MPS, and GPU Feature Discovery fails on such a node). Disable MIG on them, or "
            "serve their MIG devices (migStrategy single or mixed)"
        )
    try:  # a MIG resource under a name already served (whole GPUs, another base) is refused
        check_served(sorted(origins, key=lambda origin: origins[origin] is Kind.MIG), sharing)
    except Invalid as exc:
        raise InputError(f'config key "{exc.at}": {exc.message}') from None

    resources = sorted(
        (
            served_resource(name, units, _replicas(sharing, base_of[name]), base_of[name])
            for name, units in members.items()
        ),
        key=lambda served: served.bases[0].order,
    )
    for resource in resources:
        found = sharing.find(resource.base or resource.name)
        if found is None:
            continue
        block, number = found
        at = f"{block.key}.resources[{number}]"
        if block.strategy == MPS and resource.migs:
            raise InputError(
                f'config key "{at}.name": {resource.base or resource.name} serves MIG devices '
                f"here (migStrategy {mig_strategy}): MPS shares whole GPUs (NVIDIA's plugin "
                "refuses MPS on MIG devices too); share them with sharing.timeSlicing, or serve "
                "these GPUs whole"
            )
        # What the kubelet can receive bounds the replicas.
        check_listing(resource.name, resource.bases, resource.replicas.count, f"{at}.replicas")
    configured = [resource_name, *(p.name for p in rules.gpus)]
    empty = [
        name
        for name in dict.fromkeys(sharing.served_name(base) for base in configured)
        if name not in members
    ]
    served_bases = set(base_of.values())
    for block in sharing.blocks:
        for number, entry in enumerate(block.resources):
            if entry.name not in served_bases and entry.name not in configured:
                warnings.append(
                    f"{block.key}.resources[{number}].name {entry.name} is no resource of "
                    "this node (no MIG device is served as it)"
                )
    return ResourcePlan(
        tuple(resources),
        served_as,
        tuple(empty),
        tuple(warnings),
        mig_strategy,
        ordered,
        tuple(gpu.index for gpu in mps_on_mig),
    )


def _resource_of(
    device: Device, default: str, rules: ResourceRules, mig_strategy: str
) -> tuple[str, str]:
    """The resource a unit is served as before time-slicing, and the key path that says so:
    a whole GPU by the first ``resources.gpus`` pattern matching its model; a MIG device under
    ``mixed`` by the first ``resources.mig`` pattern matching its profile; else the strategy's
    default."""
    if device.mig is None:
        patterns, matched_on, key = rules.gpus, device.gpu.name, "resources.gpus"
        at = "nvplugin.resourceName"
    elif mig_strategy == "mixed":
        patterns, matched_on, key = rules.mig, device.mig.profile, "resources.mig"
        at = f"MIG profile {device.mig.profile} (migStrategy mixed)"
    else:  # single: every MIG device is the GPU resource
        return default, "nvplugin.resourceName"
    matched = _first_match(patterns, matched_on)
    if matched is None:
        return default, at
    return patterns[matched].name, f"{key}[{matched}].name"


def _mps_shared(sharing: Sharing, base: str) -> bool:
    """Whether ``sharing`` shares resource ``base`` through MPS."""
    found = sharing.find(base)
    return found is not None and found[0].strategy == MPS


def _replicas(sharing: Sharing, base: str) -> Replicas:
    found = sharing.find(base)
    if found is None:
        return NOT_SHARED
    block, number = found
    return Replicas(
        block.resources[number].replicas,
        block.fail_requests_greater_than_one,
        block.allocation,
        block.strategy,
    )


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
    absent = [(n, uuid) for n, uuid in enumerate(rules.exclude.uuids) if uuid not in known]
    warnings += _each_or_summary(
        "resources.exclude.uuids",
        absent,
        "is not a GPU or MIG device on this node",
        "are not GPUs or MIG devices on this node",
        len(rules.exclude.uuids),
    )
    unmatched = [
        (n, repr(model))
        for n, model in enumerate(rules.exclude.models)
        if not any(model_matches(model, gpu.name) for gpu in ordered)
    ]
    warnings += _each_or_summary(
        "resources.exclude.models",
        unmatched,
        f"matches no GPU on this node (models: {models})",
        f"match no GPU on this node (models: {models})",
        len(rules.exclude.models),
    )
    return warnings


MAX_EACH_WARNED = 4
"""Entries of a list warned about one by one; beyond, one warning sums them up (an exclude list
written for a whole fleet names mostly GPUs of other nodes: one line, not one per GPU)."""


def _each_or_summary(
    key: str, entries: Sequence[tuple[int, str]], one: str, several: str, total: int
) -> list[str]:
    """A warning per entry ``(position, shown value)`` of list ``key``, or -- more than
    :data:`MAX_EACH_WARNED` -- one naming the first few and how many there are."""
    if len(entries) <= MAX_EACH_WARNED:
        return [f"{key}[{n}] {shortened(shown, 80)} {one}" for n, shown in entries]
    named = ", ".join(f"[{n}] {shortened(shown, 80)}" for n, shown in entries[:MAX_EACH_WARNED])
    return [
        f"{key}: {len(entries)} of its {total} entries {several}; "
        f"{named} and {len(entries) - MAX_EACH_WARNED} more"
    ]


def _mig_warnings(rules: ResourceRules, mig_strategy: str, devices: Sequence[Device]) -> list[str]:
    """``resources.mig`` under a strategy that does not use it, or matching no MIG device."""
    if not rules.mig:
        return []
    if mig_strategy != "mixed":
        return [
            f"resources.mig applies under migStrategy mixed only; migStrategy is {mig_strategy}"
        ]
    profiles = sorted({device.mig.profile for device in devices if device.mig is not None})
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
