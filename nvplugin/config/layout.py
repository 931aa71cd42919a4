"""Which resource names a node's GPUs are served under: the config's values for resources by
model (``resources.gpus``), hidden GPUs (``resources.exclude``) and sharing (``sharing.timeSlicing``
and ``sharing.mps``, the same shape), and the checks that span those keys.

:func:`resolve_layout` runs once, when the config loads: short names are made full and every
rule across keys is checked (each resulting name valid for the kubelet, sharing entries naming a
served resource once across both blocks, MPS on no MIG resource, no two resources under one name
or one socket), so a collision is
an exit-2 error naming the key. Applying the layout to a node's GPUs is the plugin's part
(:func:`nvplugin.rm.plan.plan_resources`).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace

from nvplugin.config.schema import Invalid
from nvplugin.resourcenames import full_name, resource_domain, resource_name_error, socket_name

ALLOCATIONS = ("distributed", "packed")
"""Preferred-allocation policies for replicas (NVIDIA's ``sharedDevicesAllocationPolicy``); the
first is the default."""

MIN_REPLICAS = 2
MAX_REPLICAS = 1_000_000
"""A bound for the config check only; what a node can advertise is bounded by the kubelet's
message size (:mod:`nvplugin.rm.listing`)."""
SHARED_SUFFIX = ".shared"
"""``renameByDefault`` renames a replicated resource ``<name>.shared`` (NVIDIA's convention)."""


TIME_SLICING = "time-slicing"
MPS = "mps"
"""The sharing strategies, by NVIDIA's names (GPU Feature Discovery's ``gpu.sharing-strategy``)."""
SHARING_KEYS = {TIME_SLICING: "sharing.timeSlicing", MPS: "sharing.mps"}
"""Each strategy's block of the config file."""
MPS_MAX_REPLICAS = 48
"""An MPS server takes at most 48 clients per GPU (Volta and later): more MPS replicas of a GPU
could never all run (NVIDIA's plugin refuses them too)."""


@dataclass(frozen=True)
class ReplicatedResource:
    """One ``resources`` entry of a sharing block: ``name`` (a resource the plugin would
    advertise) is served as ``replicas`` devices per GPU, under ``rename`` when given."""

    name: str
    replicas: int
    rename: str | None = None


@dataclass(frozen=True)
class ReplicatedResources:
    """One sharing block, NVIDIA's type of the same name: ``sharing.timeSlicing`` or
    ``sharing.mps`` (``strategy``; names are full once the config is loaded), and the allocation
    policy for replicas (``flags.plugin.sharedDevicesAllocationPolicy``)."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    allocation: str = ALLOCATIONS[0]
    resources: tuple[ReplicatedResource, ...] = ()
    strategy: str = TIME_SLICING

    @property
    def key(self) -> str:
        """The block's key path: ``sharing.timeSlicing`` or ``sharing.mps``."""
        return SHARING_KEYS[self.strategy]

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
class Sharing:
    """Both sharing blocks. A resource is shared one way or not at all; two resources of one node
    may be shared two ways (NVIDIA's plugin takes one block for the whole node)."""

    time_slicing: ReplicatedResources = ReplicatedResources()
    mps: ReplicatedResources = ReplicatedResources(
        fail_requests_greater_than_one=True, strategy=MPS
    )

    @property
    def blocks(self) -> tuple[ReplicatedResources, ReplicatedResources]:
        return (self.time_slicing, self.mps)

    def find(self, name: str) -> tuple[ReplicatedResources, int] | None:
        """The block that replicates resource ``name`` and the entry's number in it, if any."""
        for block in self.blocks:
            for number, entry in enumerate(block.resources):
                if entry.name == name:
                    return block, number
        return None

    def served_name(self, name: str) -> str:
        """The name resource ``name`` is advertised under (its own when not shared)."""
        found = self.find(name)
        if found is None:
            return name
        block, number = found
        return block.served_name(block.resources[number])


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
    """``resources``: which GPU goes to which resource name, and which to none. ``mig``: NVIDIA's
    ``resources.mig`` patterns, MIG devices by profile (same pattern rule as ``gpus``), honoured
    under ``migStrategy: mixed``."""

    gpus: tuple[GpuPattern, ...] = ()
    exclude: Exclude = Exclude()
    mig: tuple[GpuPattern, ...] = ()


def model_matches(pattern: str, model: str) -> bool:
    """fnmatch (``*``, ``?``, ``[...]``), ignoring case: ``*a100*`` matches ``NVIDIA A100-SXM4``."""
    return fnmatch.fnmatchcase(model.lower(), pattern.lower())


def resolve_layout(
    resource_name: str,
    rules: ResourceRules,
    sharing: Sharing,
    mig_strategy: str = "none",
) -> tuple[ResourceRules, Sharing]:
    """Short names made full, then every rule that spans keys checked; :class:`Invalid` with the
    key path in ``at``.

    Under ``mig_strategy`` mixed the names of ``resources.mig`` are served resources too, and a
    time-slicing entry may name any MIG resource (``<domain>/mig-<profile>``): which profiles
    exist is the node's to say, so :func:`nvplugin.rm.plan.plan_resources` checks the
    rest once the node is known (with :func:`check_served`, the same rule). An MPS entry may not
    name a MIG resource (MPS shares whole GPUs; a MIG device served as the GPU resource under
    ``single`` is refused by the plan). A resource is named by one sharing block at most.
    """
    patterns = [
        GpuPattern(p.pattern, _full(p.name, resource_name, f"resources.gpus[{n}].name"))
        for n, p in enumerate(rules.gpus)
    ]
    mig = [
        GpuPattern(p.pattern, _full(p.name, resource_name, f"resources.mig[{n}].name"))
        for n, p in enumerate(rules.mig)
    ]
    # Where each base resource comes from, for messages: the default, then pattern names.
    origin = {resource_name: "nvplugin.resourceName"}
    for number, pattern in enumerate(patterns):
        origin.setdefault(pattern.name, f"resources.gpus[{number}].name")
    mixed = mig_strategy == "mixed"
    migs: set[str] = set()
    if mixed:
        for number, pattern in enumerate(mig):
            at = f"resources.mig[{number}].name"
            if origin.get(pattern.name, at).startswith(("resources.gpus", "nvplugin.")):
                raise Invalid(
                    f"{pattern.name} is already the resource of whole GPUs (from "
                    f"{origin[pattern.name]}); MIG devices need a resource of their own",
                    at,
                )
            origin.setdefault(pattern.name, at)
            migs.add(pattern.name)

    seen: dict[str, str] = {}  # resource -> the entry that shares it
    blocks = []
    for block in sharing.blocks:
        entries = []
        for number, entry in enumerate(block.resources):
            at = f"{block.key}.resources[{number}]"
            name = full_name(entry.name, resource_name)
            mig_name = name in migs or (mixed and is_mig_resource(name, resource_name))
            if name not in origin and not (mixed and is_mig_resource(name, resource_name)):
                mig_note = (
                    f", or under migStrategy mixed a MIG resource such as "
                    f"{resource_domain(resource_name)}/{MIG_RESOURCE_PREFIX}1g.5gb"
                    if mixed and block.strategy == TIME_SLICING
                    else ""
                )
                raise Invalid(
                    f"{name} is not a resource this plugin serves (have: {', '.join(origin)}"
                    f"{mig_note})",
                    f"{at}.name",
                )
            if block.strategy == MPS and mig_name:
                raise Invalid(
                    f"{name} serves MIG devices: MPS shares whole GPUs (NVIDIA's plugin refuses "
                    "MPS on MIG devices too; sharing.timeSlicing can replicate them)",
                    f"{at}.name",
                )
            if name in seen:
                raise Invalid(f"{name} is already replicated by {seen[name]}", f"{at}.name")
            seen[name] = at
            rename = None
            if entry.rename is not None:
                rename = _full(entry.rename, resource_name, f"{at}.rename")
            entries.append(ReplicatedResource(name, entry.replicas, rename))
        blocks.append(replace(block, resources=tuple(entries)))
    resolved = Sharing(*blocks)
    check_served(list(origin.items()), resolved)
    return ResourceRules(tuple(patterns), rules.exclude, tuple(mig)), resolved


MIG_RESOURCE_PREFIX = "mig-"
"""Under ``mixed``, a MIG profile's resource is ``<domain>/mig-<profile>`` (NVIDIA's names)."""


def is_mig_resource(name: str, resource_name: str) -> bool:
    """Whether ``name`` is in the namespace of ``mixed``'s MIG resources (by default)."""
    return name.startswith(f"{resource_domain(resource_name)}/{MIG_RESOURCE_PREFIX}")


def check_served(bases: list[tuple[str, str]], sharing: Sharing) -> None:
    """The names resources are served under -- ``bases`` (base resource, the key path it comes
    from), renamed by sharing -- must be distinct and take distinct sockets; :class:`Invalid`
    naming the key that made the second one."""
    served: dict[str, str] = {}  # served name -> the key path that produced it
    sockets: dict[str, str] = {}
    # Resources served under their own name first, so a collision names the renaming key.
    for base, base_at in sorted(bases, key=lambda item: sharing.find(item[0]) is not None):
        name, at = base, base_at
        found = sharing.find(base)
        if found is not None:
            block, number = found
            entry = block.resources[number]
            name = block.served_name(entry)
            at = (
                f"{block.key}.resources[{number}].rename"
                if entry.rename is not None
                else f"{block.key}.renameByDefault"
                if block.rename_by_default
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


def _full(name: str, resource_name: str, at: str) -> str:
    full = full_name(name, resource_name)
    _valid(full, at)
    return full


def _valid(name: str, at: str) -> None:
    error = resource_name_error(name)
    if error is not None:
        raise Invalid(error, at)
