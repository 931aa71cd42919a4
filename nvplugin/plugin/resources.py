"""Which GPU is served under which resource name on this node.

Resources by model (``resources.gpus``: first matching pattern wins, the rest stay the default
resource; ``resources.exclude`` hides GPUs from all) and time-slicing renames make several
resource names out of one node. The config checks them once, when it loads
(:func:`nvplugin.config.layout.resolve_layout`: a collision or a bad name is exit 2 naming the
key); :func:`plan_resources` applies them to the discovered GPUs (one server, socket and
registration per non-empty resource) and says which parts of the config do nothing on this node
(warnings, logged once at start).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nvplugin.config.layout import GpuPattern, ResourceRules, TimeSlicing, model_matches
from nvplugin.node.model import Gpu
from nvplugin.plugin.listing import check_listing
from nvplugin.plugin.sharing import NOT_SHARED, Replicas
from nvplugin.resourcenames import socket_name

EXCLUDED_LABEL = "(excluded)"


@dataclass(frozen=True)
class ServedResource:
    """One resource the daemon serves: one server, one socket, one registration."""

    name: str
    gpus: tuple[Gpu, ...]
    replicas: Replicas = NOT_SHARED
    base: str = ""
    """The resource before time-slicing renamed it ("" = same as ``name``)."""

    @property
    def socket(self) -> str:
        return socket_name(self.name)


@dataclass(frozen=True)
class ResourcePlan:
    """What a node's GPUs become under a config. ``resources`` holds only non-empty resources,
    ordered by their lowest GPU index; ``assignment`` maps every GPU index to its served resource
    name (None: excluded); ``warnings`` are the config parts that do nothing on this node."""

    resources: tuple[ServedResource, ...]
    assignment: dict[int, str | None]
    empty: tuple[str, ...]
    warnings: tuple[str, ...]

    def resource(self, name: str) -> ServedResource | None:
        for served in self.resources:
            if served.name == name:
                return served
        return None

    def labels(self) -> dict[int, str]:
        """GPU index -> what ``nvplugin devices`` shows: the resource, its replica IDs, or
        ``(excluded)``."""
        out: dict[int, str] = {}
        for index, name in self.assignment.items():
            served = None if name is None else self.resource(name)
            if served is None:
                out[index] = EXCLUDED_LABEL
            elif served.replicas.shared:
                count = served.replicas.count
                out[index] = f"{served.name} x{count} (<uuid>::0..{count - 1})"
            else:
                out[index] = served.name
        return out

    def as_dict(self) -> dict[str, object]:
        """The plan for ``devices --output json``: each served resource with its socket, GPU
        indices, replicas per GPU and advertised device count; the empty ones; the warnings."""
        return {
            "resources": [
                {
                    "name": served.name,
                    "socket": served.socket,
                    "gpus": [gpu.index for gpu in served.gpus],
                    "replicas": served.replicas.count,
                    "devices": len(served.gpus) * served.replicas.count,
                    "renamed_from": served.base or None,
                }
                for served in self.resources
            ],
            "excluded": sorted(i for i, name in self.assignment.items() if name is None),
            "empty": list(self.empty),
            "warnings": list(self.warnings),
        }


def plan_resources(
    gpus: Sequence[Gpu], resource_name: str, rules: ResourceRules, time_slicing: TimeSlicing
) -> ResourcePlan:
    """Split ``gpus`` into served resources (names already resolved by :func:`resolve_layout`).

    First matching pattern wins; unmatched GPUs stay ``resource_name``; excluded GPUs go nowhere.
    InputError when a time-sliced resource would list more devices than the kubelet can receive
    (:mod:`nvplugin.plugin.listing`).
    """
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    models = sorted({gpu.name for gpu in ordered})
    warnings = []
    for number, pattern in enumerate(rules.gpus):
        hits = [gpu for gpu in ordered if pattern.matches(gpu.name)]
        if not hits:
            warnings.append(
                f"resources.gpus[{number}].pattern {pattern.pattern!r} matches no GPU on this "
                f"node (models: {', '.join(models) or 'none'})"
            )
        elif all(_first_match(rules.gpus, gpu) != number for gpu in hits):
            warnings.append(
                f"resources.gpus[{number}].pattern {pattern.pattern!r} matches only GPUs an "
                "earlier pattern already took"
            )
    uuids = {gpu.uuid for gpu in ordered}
    for number, uuid in enumerate(rules.exclude.uuids):
        if uuid not in uuids:
            warnings.append(f"resources.exclude.uuids[{number}] {uuid} is not a GPU on this node")
    for number, model in enumerate(rules.exclude.models):
        if not any(model_matches(model, gpu.name) for gpu in ordered):
            warnings.append(
                f"resources.exclude.models[{number}] {model!r} matches no GPU on this node "
                f"(models: {', '.join(models) or 'none'})"
            )

    assignment: dict[int, str | None] = {}
    members: dict[str, list[Gpu]] = {}
    bases: dict[str, str] = {}
    for gpu in ordered:
        if rules.exclude.hides(gpu.uuid, gpu.name):
            assignment[gpu.index] = None
            continue
        matched = _first_match(rules.gpus, gpu)
        base = resource_name if matched is None else rules.gpus[matched].name
        entry = time_slicing.entry(base)
        name = base if entry is None else time_slicing.served_name(entry)
        assignment[gpu.index] = name
        members.setdefault(name, []).append(gpu)
        bases[name] = base

    resources = []
    for name, group in members.items():  # insertion order = lowest GPU index first
        entry = time_slicing.entry(bases[name])
        replicas = (
            NOT_SHARED
            if entry is None
            else Replicas(
                entry.replicas, time_slicing.fail_requests_greater_than_one, time_slicing.allocation
            )
        )
        base = "" if bases[name] == name else bases[name]
        resources.append(ServedResource(name, tuple(group), replicas, base))
    for served in resources:  # what the kubelet can receive bounds the replicas
        if served.replicas.shared:
            entry = time_slicing.entry(served.base or served.name)
            number = time_slicing.resources.index(entry) if entry is not None else 0
            check_listing(
                served.name,
                served.gpus,
                served.replicas.count,
                f"sharing.timeSlicing.resources[{number}].replicas",
            )
    configured = [resource_name, *(p.name for p in rules.gpus)]
    empty = []
    for base in dict.fromkeys(configured):
        entry = time_slicing.entry(base)
        name = base if entry is None else time_slicing.served_name(entry)
        if name not in members:
            empty.append(name)
    return ResourcePlan(tuple(resources), assignment, tuple(empty), tuple(warnings))


def _first_match(patterns: Sequence[GpuPattern], gpu: Gpu) -> int | None:
    for number, pattern in enumerate(patterns):
        if pattern.matches(gpu.name):
            return number
    return None
