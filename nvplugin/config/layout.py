"""Which resource names a node's GPUs are served under: the config's values for resources by
model (``resources.gpus``), hidden GPUs (``resources.exclude``) and time-slicing
(``sharing.timeSlicing``), and the checks that span those keys.

:func:`resolve_layout` runs once, when the config loads: short names are made full and every
rule across keys is checked (each resulting name valid for the kubelet, time-slicing entries
naming a served resource once, no two resources under one name or one socket), so a collision is
an exit-2 error naming the key. Applying the layout to a node's GPUs is the plugin's part
(:func:`nvplugin.plugin.resources.plan_resources`).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from nvplugin.config.schema import Invalid
from nvplugin.resourcenames import full_name, resource_name_error, socket_name

ALLOCATIONS = ("distributed", "packed")
"""Preferred-allocation policies for replicas (NVIDIA's ``sharedDevicesAllocationPolicy``); the
first is the default."""

MIN_REPLICAS = 2
MAX_REPLICAS = 1_000_000
"""A bound for the config check only; what a node can advertise is bounded by the kubelet's
message size (:mod:`nvplugin.plugin.resources`)."""
SHARED_SUFFIX = ".shared"
"""``renameByDefault`` renames a replicated resource ``<name>.shared`` (NVIDIA's convention)."""


@dataclass(frozen=True)
class ReplicatedResource:
    """One ``sharing.timeSlicing.resources`` entry: ``name`` (a resource the plugin would
    advertise) is served as ``replicas`` devices per GPU, under ``rename`` when given."""

    name: str
    replicas: int
    rename: str | None = None


@dataclass(frozen=True)
class TimeSlicing:
    """``sharing.timeSlicing`` (names are full once the config is loaded) and the allocation
    policy for replicas (``flags.plugin.sharedDevicesAllocationPolicy``)."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    allocation: str = ALLOCATIONS[0]
    resources: tuple[ReplicatedResource, ...] = ()

    def entry(self, name: str) -> ReplicatedResource | None:
        """The entry that replicates resource ``name``, if any."""
        for entry in self.resources:
            if entry.name == name:
                return entry
        return None

    def served_name(self, entry: ReplicatedResource) -> str:
        """The name the replicas are advertised under: ``rename``, else ``<name>.shared`` with
        ``renameByDefault``, else the resource's own name."""
        if entry.rename is not None:
            return entry.rename
        return entry.name + SHARED_SUFFIX if self.rename_by_default else entry.name


@dataclass(frozen=True)
class GpuPattern:
    """``resources.gpus[i]``: GPUs whose model matches ``pattern`` (fnmatch, case-insensitive)
    are served as resource ``name`` (full name once the config is loaded)."""

    pattern: str
    name: str

    def matches(self, model: str) -> bool:
        return model_matches(self.pattern, model)


@dataclass(frozen=True)
class Exclude:
    """``resources.exclude``: GPUs no resource advertises (by UUID, or model pattern)."""

    uuids: tuple[str, ...] = ()
    models: tuple[str, ...] = ()

    def hides(self, uuid: str, model: str) -> bool:
        return uuid in self.uuids or any(model_matches(p, model) for p in self.models)


@dataclass(frozen=True)
class ResourceRules:
    """``resources``: which GPU goes to which resource name, and which to none. ``mig`` holds
    NVIDIA's ``resources.mig`` patterns (MIG devices by profile)."""

    gpus: tuple[GpuPattern, ...] = ()
    exclude: Exclude = Exclude()
    mig: tuple[GpuPattern, ...] = ()


def model_matches(pattern: str, model: str) -> bool:
    """fnmatch (``*``, ``?``, ``[...]``), ignoring case: ``*a100*`` matches ``NVIDIA A100-SXM4``."""
    return fnmatch.fnmatchcase(model.lower(), pattern.lower())


def resolve_layout(
    resource_name: str, rules: ResourceRules, time_slicing: TimeSlicing
) -> tuple[ResourceRules, TimeSlicing]:
    """Short names made full, then every rule that spans keys checked; :class:`Invalid` with the
    key path in ``at``."""
    patterns = []
    for number, pattern in enumerate(rules.gpus):
        name = full_name(pattern.name, resource_name)
        _valid(name, f"resources.gpus[{number}].name")
        patterns.append(GpuPattern(pattern.pattern, name))
    # Where each base resource comes from, for messages: the default, then pattern names.
    origin = {resource_name: "nvplugin.resourceName"}
    for number, pattern in enumerate(patterns):
        origin.setdefault(pattern.name, f"resources.gpus[{number}].name")

    entries = []
    seen: dict[str, int] = {}
    for number, entry in enumerate(time_slicing.resources):
        at = f"sharing.timeSlicing.resources[{number}]"
        name = full_name(entry.name, resource_name)
        if name not in origin:
            raise Invalid(
                f"{name} is not a resource this plugin serves (have: {', '.join(origin)})",
                f"{at}.name",
            )
        if name in seen:
            raise Invalid(f"{name} is already replicated by resources[{seen[name]}]", f"{at}.name")
        seen[name] = number
        rename = None
        if entry.rename is not None:
            rename = full_name(entry.rename, resource_name)
            _valid(rename, f"{at}.rename")
        entries.append(ReplicatedResource(name, entry.replicas, rename))
    resolved = TimeSlicing(
        time_slicing.rename_by_default,
        time_slicing.fail_requests_greater_than_one,
        time_slicing.allocation,
        tuple(entries),
    )

    served: dict[str, str] = {}  # served name -> the key path that produced it
    sockets: dict[str, str] = {}
    # Resources served under their own name first, so a collision names the renaming key.
    for base, base_at in sorted(origin.items(), key=lambda item: item[0] in seen):
        name, at = base, base_at
        replicated = seen.get(base)
        if replicated is not None:
            entry = entries[replicated]
            name = resolved.served_name(entry)
            at = (
                f"sharing.timeSlicing.resources[{replicated}].rename"
                if entry.rename is not None
                else "sharing.timeSlicing.renameByDefault"
                if resolved.rename_by_default
                else base_at
            )
            _valid(name, at)
        if name in served:
            raise Invalid(f"{name} collides with the resource from {served[name]}", at)
        served[name] = at
        sock = socket_name(name)
        if sock in sockets:
            raise Invalid(
                f"{name} would be served on the same socket {sock} as the resource from "
                f"{sockets[sock]} (socket names use the part after '/')",
                at,
            )
        sockets[sock] = at
    return ResourceRules(tuple(patterns), rules.exclude, rules.mig), resolved


def _valid(name: str, at: str) -> None:
    error = resource_name_error(name)
    if error is not None:
        raise Invalid(error, at)
