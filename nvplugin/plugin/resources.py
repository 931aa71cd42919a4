"""Resource names: the kubelet's extended-resource-name rule, the names derived from one, and
which GPU is served under which name.

This is the only copy of the rule in the package. The plugin checks it at config time (so a bad
name is an exit-2 error naming the key, not a silent registration failure), and the fake kubelet
checks it in ``Register`` exactly as the real kubelet does (kubelet-behaviour.md §1).

The rule (upstream ``v1helper.IsExtendedResourceName``): the name contains ``/``; it is not in the
``kubernetes.io/`` namespace; it does not start with ``requests.``; and ``requests.<name>`` is a
qualified name: an optional DNS-1123 subdomain prefix (<= 253 characters) and a ``/``, then a name
part of 1-63 characters, alphanumeric at both ends, ``[-_.A-Za-z0-9]`` inside.

Resources by model (``resources.gpus``: first matching pattern wins, the rest stay the default
resource; ``resources.exclude`` hides GPUs from all) and time-slicing renames make several
resource names out of one node. :func:`resolve_layout` checks them once, at config load (so a
collision or a bad name is exit 2 naming the key); :func:`plan_resources` applies them to the
discovered GPUs (one server, socket and registration per non-empty resource) and says which parts
of the config do nothing on this node (warnings, logged once at start).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from nvplugin.errors import InputError, describe
from nvplugin.node.model import Gpu
from nvplugin.plugin.sharing import (
    NOT_SHARED,
    Replicas,
    ReplicatedResource,
    TimeSlicing,
    ValueProblem,
    check_keys,
    string_field,
)

DEFAULT_RESOURCE_NAME = "nvidia.com/gpu"

_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1123_SUBDOMAIN_MAX = 253
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_QUALIFIED_NAME_MAX = 63
_REQUESTS_PREFIX = "requests."


def _qualified_name_problem(value: str, shown: str = "") -> str | None:
    """Why ``value`` is not a Kubernetes qualified name, or None when it is one.

    ``shown`` is removed from the front of the prefix in messages (the rule checks
    ``requests.<name>``, but the user wrote ``<name>``).
    """
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return "the prefix before '/' is empty"
        if len(prefix) > _DNS1123_SUBDOMAIN_MAX:
            limit = _DNS1123_SUBDOMAIN_MAX - len(shown)
            return f"the prefix is longer than {limit} characters"
        if not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            return (
                f"the prefix {prefix.removeprefix(shown)!r} is not a DNS-1123 subdomain "
                "(lower-case alphanumerics, '-' and '.', alphanumeric at both ends)"
            )
    else:
        return "it contains more than one '/'"
    if not name:
        return "the name part after '/' is empty"
    if len(name) > _QUALIFIED_NAME_MAX:
        return f"the name part is longer than {_QUALIFIED_NAME_MAX} characters"
    if not _QUALIFIED_NAME.fullmatch(name):
        return (
            f"the name part {name!r} must be alphanumeric at both ends "
            "with only '-', '_', '.' or alphanumerics inside"
        )
    return None


def resource_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid extended resource name, or None when it is valid."""
    if "/" not in name:
        return "it has no '/' (extended resource names look like 'vendor.com/name')"
    if "kubernetes.io/" in name:
        return "the kubernetes.io/ namespace is reserved for native resources"
    if name.startswith(_REQUESTS_PREFIX):
        return f"it starts with {_REQUESTS_PREFIX!r}"
    if name.startswith("/"):
        return "the prefix before '/' is empty"
    return _qualified_name_problem(_REQUESTS_PREFIX + name, _REQUESTS_PREFIX)


def is_extended_resource_name(name: str) -> bool:
    """True when the kubelet accepts ``name`` as an extended resource name."""
    return resource_name_problem(name) is None


def resource_name_error(name: str) -> str | None:
    """None when ``name`` is an extended resource name, else the error message: it starts the way
    the kubelet's does (``the ResourceName "<n>" is invalid``) so a user who has seen the
    kubelet's error recognises it, then says why."""
    problem = resource_name_problem(name)
    return None if problem is None else f'the ResourceName "{name}" is invalid: {problem}'


def validate_resource_name(name: str) -> None:
    """Raise :class:`InputError` (see :func:`resource_name_error`) unless ``name`` is valid."""
    error = resource_name_error(name)
    if error is not None:
        raise InputError(error)


def short_name(resource_name: str) -> str:
    """The part after ``/``: ``nvidia.com/gpu`` -> ``gpu``. Names the plugin socket."""
    return resource_name.rsplit("/", 1)[-1]


def socket_name(resource_name: str) -> str:
    """The plugin socket's basename for a resource: ``nvplugin-<short name>.sock``."""
    return f"nvplugin-{short_name(resource_name)}.sock"


def resource_domain(resource_name: str) -> str:
    """The part before ``/``: ``nvidia.com/gpu`` -> ``nvidia.com``."""
    return resource_name.split("/", 1)[0]


def full_name(name: str, default_resource: str) -> str:
    """A name as configured -> a resource name: ``a100`` gets the domain of the default resource
    (``nvidia.com/a100``); a name with ``/`` is taken as it is."""
    return name if "/" in name else f"{resource_domain(default_resource)}/{name}"


# --- resources by GPU model -----------------------------------------------------------------------


@dataclass(frozen=True)
class GpuPattern:
    """``resources.gpus[i]``: GPUs whose model matches ``pattern`` (fnmatch, case-insensitive)
    are served as resource ``name`` (full name once the config is loaded)."""

    pattern: str
    name: str

    def matches(self, gpu: Gpu) -> bool:
        return model_matches(self.pattern, gpu.name)


@dataclass(frozen=True)
class Exclude:
    """``resources.exclude``: GPUs no resource advertises (by UUID, or model pattern)."""

    uuids: tuple[str, ...] = ()
    models: tuple[str, ...] = ()

    def hides(self, gpu: Gpu) -> bool:
        return gpu.uuid in self.uuids or any(model_matches(p, gpu.name) for p in self.models)


@dataclass(frozen=True)
class ResourceRules:
    """``resources``: which GPU goes to which resource name, and which to none."""

    gpus: tuple[GpuPattern, ...] = ()
    exclude: Exclude = Exclude()

    def as_dict(self) -> dict[str, object]:
        return {
            "gpus": [{"pattern": p.pattern, "name": p.name} for p in self.gpus],
            "exclude": {"uuids": list(self.exclude.uuids), "models": list(self.exclude.models)},
        }


def model_matches(pattern: str, model: str) -> bool:
    """fnmatch (``*``, ``?``, ``[...]``), ignoring case: ``*a100*`` matches ``NVIDIA A100-SXM4``."""
    return fnmatch.fnmatchcase(model.lower(), pattern.lower())


def parse_gpu_patterns(value: object) -> tuple[GpuPattern, ...]:
    """Check ``resources.gpus``: a list of ``{pattern, name}`` (name as written)."""
    if not isinstance(value, list):
        raise ValueProblem("", f"expected a list of {{pattern, name}}, got {describe(value)}")
    out = []
    for number, item in enumerate(value):
        at = f"[{number}]"
        if not isinstance(item, dict):
            raise ValueProblem(at, f"expected a mapping {{pattern, name}}, got {describe(item)}")
        check_keys(item, ("pattern", "name"), at)
        pattern = string_field(item, "pattern", at, required=True)
        name = string_field(item, "name", at, required=True)
        assert pattern is not None and name is not None  # required
        out.append(GpuPattern(pattern, name))
    return tuple(out)


# --- the layout: names resolved and checked across keys ------------------------------------------


def resolve_layout(
    resource_name: str, rules: ResourceRules, time_slicing: TimeSlicing
) -> tuple[ResourceRules, TimeSlicing]:
    """Short names made full, then every rule that spans keys checked, with the key path in
    :class:`ValueProblem` ``at``: each resulting name valid, time-slicing entries naming a
    resource that exists (once each), and no two resources served under one name or one socket.
    """
    patterns = []
    for number, pattern in enumerate(rules.gpus):
        name = full_name(pattern.name, resource_name)
        _valid(name, f"resources.gpus[{number}].name")
        patterns.append(GpuPattern(pattern.pattern, name))
    # Where each base resource comes from, for messages: the default, then pattern names.
    origin = {resource_name: "resource_name"}
    for number, pattern in enumerate(patterns):
        origin.setdefault(pattern.name, f"resources.gpus[{number}].name")

    entries = []
    seen: dict[str, int] = {}
    for number, entry in enumerate(time_slicing.resources):
        at = f"sharing.timeSlicing.resources[{number}]"
        name = full_name(entry.name, resource_name)
        if name not in origin:
            raise ValueProblem(
                f"{at}.name",
                f"{name} is not a resource this plugin serves (have: {', '.join(origin)})",
            )
        if name in seen:
            raise ValueProblem(
                f"{at}.name", f"{name} is already replicated by resources[{seen[name]}]"
            )
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
            raise ValueProblem(at, f"{name} collides with the resource from {served[name]}")
        served[name] = at
        sock = socket_name(name)
        if sock in sockets:
            raise ValueProblem(
                at,
                f"{name} would be served on the same socket {sock} as the resource from "
                f"{sockets[sock]} (socket names use the part after '/')",
            )
        sockets[sock] = at
    return ResourceRules(tuple(patterns), rules.exclude), resolved


def _valid(name: str, at: str) -> None:
    error = resource_name_error(name)
    if error is not None:
        raise ValueProblem(at, error)


# --- the plan for one node ------------------------------------------------------------------------


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
    """
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    models = sorted({gpu.name for gpu in ordered})
    warnings = []
    for number, pattern in enumerate(rules.gpus):
        hits = [gpu for gpu in ordered if pattern.matches(gpu)]
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
        if rules.exclude.hides(gpu):
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
        if pattern.matches(gpu):
            return number
    return None
