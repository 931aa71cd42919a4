"""Kubernetes Pod manifests as the fake kubelet needs them: containers, init containers
(restartable sidecars included), resource requests and limits, QoS class, effective requests.

Only what admission uses is read and checked; the rest of a manifest (images, commands, ...) is
the API server's business and is passed over. Defaulting follows the API server: every quantity
is rounded up to ``1m`` (``1999999999n`` is ``2``: the QoS class and the fit see that), and a
resource with a limit and no request gets the limit as its request. Validation follows it where
admission depends on it: quantities must parse and not be negative; extended resources
(``vendor/name``, e.g. ``nvidia.com/gpu``) must be whole numbers with requests equal to limits;
cpu and memory requests may not exceed their limits; container names are unique in the pod.
``spec.overhead`` is read too: the resource fit counts it.

Every problem is an :class:`~nvplugin.errors.InputError` naming the source, the document (1-based
index and pod name when known) and the field path, e.g.
``pods.yaml: document 2 (pod "train"): spec.containers[0].resources.limits[nvidia.com/gpu]:
"1.5" is not a whole number``.

Public API: :func:`load_pods` / :func:`load_pod_file`, :class:`Pod`, :class:`Container`,
:func:`qos_class`, :func:`pod_requests`. Quantities: :mod:`nvplugin.fakekubelet.quantity`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from nvplugin import yamlinput
from nvplugin.errors import InputError, describe
from nvplugin.fakekubelet.quantity import (
    INT64_MAX,
    Quantity,
    add,
    int64_value,
    parse_quantity,
    round_up_to_milli,
)

QOS_GUARANTEED = "Guaranteed"
QOS_BURSTABLE = "Burstable"
QOS_BEST_EFFORT = "BestEffort"

CPU = "cpu"
MEMORY = "memory"
_QOS_RESOURCES = (CPU, MEMORY)

_UID_NAMESPACE = uuid.UUID("6f1c7c1e-4b7a-5d59-9a43-6e7670706c67")
"""Fixed namespace for generated pod UIDs: the same namespace/name always gets the same UID."""

_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(
    chr(c) for c in range(0x2000, 0x200B)
)
"""What the API server trims around a quantity (Go's ``unicode.IsSpace``); Python's ``strip()``
also trims control characters such as ``\\x1c`` that the API server keeps (and then refuses)."""
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_extended_resource(name: str) -> bool:
    """Extended (device) resources: ``vendor/name`` outside the ``kubernetes.io`` domains."""
    domain = name.split("/", 1)[0]
    return "/" in name and not domain.endswith("kubernetes.io") and not name.startswith("requests.")


@dataclass(frozen=True)
class Container:
    """One container (app or init) with defaulted requests and its limits."""

    name: str
    requests: Mapping[str, Quantity] = field(default_factory=dict)
    limits: Mapping[str, Quantity] = field(default_factory=dict)
    init: bool = False
    restart_policy: str | None = None

    @classmethod
    def of(
        cls,
        name: str,
        requests: Mapping[str, str | int] | None = None,
        limits: Mapping[str, str | int] | None = None,
        *,
        init: bool = False,
        restart_policy: str | None = None,
    ) -> Container:
        """Build from plain values (for tests and callers); defaults requests from limits."""
        lim = {k: round_up_to_milli(parse_quantity(str(v))) for k, v in (limits or {}).items()}
        req = {k: round_up_to_milli(parse_quantity(str(v))) for k, v in (requests or {}).items()}
        for k, q in lim.items():
            req.setdefault(k, q)
        return cls(name, req, lim, init, restart_policy)

    @property
    def restartable(self) -> bool:
        """A sidecar: an init container with ``restartPolicy: Always``."""
        return self.init and self.restart_policy == "Always"

    def count(self, resource: str) -> int:
        """Whole-number amount of an extended resource (from the limit; 0 when absent)."""
        quantity = self.limits.get(resource) or self.requests.get(resource)
        return 0 if quantity is None else quantity.int_value

    def extended_resources(self) -> dict[str, int]:
        """Extended resources in the container's limits, name -> count, sorted by name."""
        return {k: self.limits[k].int_value for k in sorted(self.limits) if is_extended_resource(k)}


@dataclass(frozen=True)
class Pod:
    """A pod as the kubelet admits it."""

    name: str
    uid: str
    containers: tuple[Container, ...]
    init_containers: tuple[Container, ...] = ()
    namespace: str = "default"
    overhead: Mapping[str, Quantity] = field(default_factory=dict)
    """``spec.overhead`` (the RuntimeClass's): the fit counts it, nothing else does."""
    qos_class: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "qos_class", qos_class(self.all_containers))

    @classmethod
    def of(
        cls,
        name: str,
        containers: Iterable[Container],
        init_containers: Iterable[Container] = (),
        *,
        uid: str | None = None,
        namespace: str = "default",
    ) -> Pod:
        inits = tuple(
            c if c.init else Container(c.name, c.requests, c.limits, True, c.restart_policy)
            for c in init_containers
        )
        return cls(name, uid or stable_uid(namespace, name), tuple(containers), inits, namespace)

    @property
    def all_containers(self) -> tuple[Container, ...]:
        """Init containers, then app containers: the order the kubelet admits them in."""
        return self.init_containers + self.containers

    def container(self, name: str) -> Container:
        for c in self.all_containers:
            if c.name == name:
                return c
        raise KeyError(name)

    def effective_requests(self) -> dict[str, Decimal]:
        return pod_requests(self)

    def effective_count(self, resource: str) -> int:
        """Effective pod request of a resource as the kubelet counts it (``Value()``: rounded
        up, at most 2^63-1)."""
        return int64_value(pod_requests(self).get(resource, Decimal(0)))


def stable_uid(namespace: str, name: str) -> str:
    """A UID derived from namespace/name, the same on every run."""
    return str(uuid.uuid5(_UID_NAMESPACE, f"{namespace}/{name}"))


def qos_class(containers: Iterable[Container]) -> str:
    """Kubernetes QoS from cpu/memory requests and limits of all containers (init included)."""
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for c in containers:
        for name, q in c.requests.items():
            if name in _QOS_RESOURCES and q.value > 0:
                requests[name] = add(requests.get(name, Decimal(0)), q.value)
        found = set()
        for name, q in c.limits.items():
            if name in _QOS_RESOURCES and q.value > 0:
                found.add(name)
                limits[name] = add(limits.get(name, Decimal(0)), q.value)
        if found != set(_QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return QOS_BEST_EFFORT
    if guaranteed:
        for name, value in requests.items():
            if limits.get(name) != value:
                guaranteed = False
                break
    if guaranteed and len(requests) == len(limits):
        return QOS_GUARANTEED
    return QOS_BURSTABLE


def pod_requests(pod: Pod, *, overhead: bool = False) -> dict[str, Decimal]:
    """Effective pod requests per resource (docs/kubelet-behaviour.md#topology-hints, the kubelet's
    PodRequests).

    ``max(sum(app) + sum(restartable init), max over regular init i of (request_i + sum of
    restartable init containers declared before i))``, per resource; with ``overhead``, plus the
    pod's ``spec.overhead`` (the resource fit counts it; device and CPU managers do not).
    """
    total: dict[str, Decimal] = {}
    for c in pod.containers:
        _add(total, c.requests)
    restartable: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for c in pod.init_containers:
        if c.restartable:
            _add(total, c.requests)
            _add(restartable, c.requests)
            need = dict(restartable)
        else:
            need = dict(restartable)
            _add(need, c.requests)
        for name, value in need.items():
            if value > init_peak.get(name, Decimal(0)):
                init_peak[name] = value
    for name, value in init_peak.items():
        if value > total.get(name, Decimal(0)):
            total[name] = value
    if overhead:
        _add(total, pod.overhead)
    return total


def _add(into: dict[str, Decimal], resources: Mapping[str, Quantity]) -> None:
    for name, q in resources.items():
        into[name] = add(into.get(name, Decimal(0)), q.value)


# --- manifests ---


class _Doc:
    """Where we are in the input, for error messages."""

    def __init__(self, source: str, index: str) -> None:
        self.source = source
        self.index = index
        self.name: str | None = None

    def error(self, path: str, problem: str) -> InputError:
        pod = f' (pod "{self.name}")' if self.name else ""
        where = f"{path}: " if path else ""
        return InputError(f"{self.source}: document {self.index}{pod}: {where}{problem}")


def load_pod_file(path: str | Path) -> list[Pod]:
    """Pods from a YAML file (one or many documents; ``kind: List`` of Pods too)."""
    return load_pods(yamlinput.read_text(path, f"pod file {path}"), str(path))


def load_pods(text: str, source: str = "<input>") -> list[Pod]:
    """Pods from YAML text, in document order; duplicate namespace/name is an error."""
    documents = yamlinput.load_all(text, source)
    pods: list[Pod] = []
    seen: dict[tuple[str, str], str] = {}
    for number, document in enumerate(documents, start=1):
        if document is None:
            continue
        items: list[tuple[str, Any]] = [(str(number), document)]
        if isinstance(document, dict) and document.get("kind") == "List":
            entries = document.get("items")
            if not isinstance(entries, list):
                raise _Doc(source, str(number)).error("items", "a List needs a list of items")
            items = [(f"{number} item {i + 1}", item) for i, item in enumerate(entries)]
        for index, item in items:
            doc = _Doc(source, index)
            pod = parse_pod(item, doc)
            key = (pod.namespace, pod.name)
            if key in seen:
                raise doc.error(
                    "metadata.name",
                    f'pod "{pod.namespace}/{pod.name}" already defined in document {seen[key]}',
                )
            seen[key] = index
            pods.append(pod)
    return pods


def parse_pod(document: Any, doc: _Doc | None = None) -> Pod:
    """One Pod manifest (already parsed YAML/JSON)."""
    doc = doc or _Doc("<input>", "1")
    if not isinstance(document, dict):
        raise doc.error("", f"not a Pod (a {_kind_of(document)}, not a mapping)")
    metadata = document.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("name"), str):
        doc.name = metadata["name"]
    kind = document.get("kind")
    if kind != "Pod":
        what = "kind is missing" if kind is None else f"kind is {kind!r}"
        raise doc.error("kind", f"not a Pod ({what})")
    api_version = document.get("apiVersion")
    if api_version != "v1":
        raise doc.error("apiVersion", f'must be "v1" for a Pod, got {api_version!r}')
    if not isinstance(metadata, dict):
        raise doc.error("metadata", "missing (a Pod needs metadata.name)")
    name = metadata.get("name")
    if name is None or name == "":
        raise doc.error("metadata.name", "missing")
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise doc.error("metadata.name", f"{name!r} is not a valid name (lower-case DNS subdomain)")
    namespace = metadata.get("namespace", "default")
    if not isinstance(namespace, str) or not _DNS_LABEL.fullmatch(namespace):
        raise doc.error("metadata.namespace", f"{namespace!r} is not a valid namespace")
    uid = metadata.get("uid")
    if uid is None:
        uid = stable_uid(namespace, name)
    elif not isinstance(uid, str) or not uid:
        raise doc.error("metadata.uid", f"{uid!r} must be a non-empty string")
    spec = document.get("spec")
    if not isinstance(spec, dict):
        raise doc.error("spec", "missing (a Pod needs spec.containers)")
    containers = _containers(spec, "containers", doc, init=False)
    if not containers:
        raise doc.error("spec.containers", "a Pod needs at least one container")
    init_containers = _containers(spec, "initContainers", doc, init=True)
    names: set[str] = set()
    for kind_key, group in (("initContainers", init_containers), ("containers", containers)):
        for i, c in enumerate(group):
            if c.name in names:
                raise doc.error(f"spec.{kind_key}[{i}].name", f'duplicate name "{c.name}"')
            names.add(c.name)
    overhead = _resource_list(spec.get("overhead"), "spec.overhead", doc)
    return Pod(name, uid, tuple(containers), tuple(init_containers), namespace, overhead)


def _kind_of(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def _containers(spec: dict[str, Any], key: str, doc: _Doc, init: bool) -> list[Container]:
    raw = spec.get(key)
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise doc.error(f"spec.{key}", f"must be a list, got a {_kind_of(raw)}")
    out = []
    for i, item in enumerate(raw):
        path = f"spec.{key}[{i}]"
        if not isinstance(item, dict):
            raise doc.error(path, f"must be a mapping, got a {_kind_of(item)}")
        name = item.get("name")
        if name is None or name == "":
            raise doc.error(f"{path}.name", "missing")
        if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.fullmatch(name):
            raise doc.error(f"{path}.name", f"{name!r} is not a valid container name")
        restart_policy = item.get("restartPolicy")
        if restart_policy is not None:
            if not init:
                raise doc.error(
                    f"{path}.restartPolicy", "only init containers may set restartPolicy"
                )
            if restart_policy != "Always":
                raise doc.error(
                    f"{path}.restartPolicy",
                    f'{restart_policy!r}: the only allowed value is "Always"',
                )
        requests, limits = _resources(item.get("resources"), f"{path}.resources", doc)
        out.append(Container(name, requests, limits, init, restart_policy))
    return out


def _resources(raw: Any, path: str, doc: _Doc) -> tuple[dict[str, Quantity], dict[str, Quantity]]:
    if raw is None:
        return {}, {}
    if not isinstance(raw, dict):
        raise doc.error(path, f"must be a mapping, got a {_kind_of(raw)}")
    requests = _resource_list(raw.get("requests"), f"{path}.requests", doc)
    limits = _resource_list(raw.get("limits"), f"{path}.limits", doc)
    for resource, default in limits.items():
        requests.setdefault(resource, default)
    for resource, request in requests.items():
        at = f"{path}.requests[{resource}]"
        limit = limits.get(resource)
        if is_extended_resource(resource):
            if limit is None:
                raise doc.error(
                    at, "an extended resource needs a limit (requests must equal limits)"
                )
            if limit.value != request.value:
                raise doc.error(at, f"must equal the limit {limit} for an extended resource")
        elif limit is not None and resource in _QOS_RESOURCES and request.value > limit.value:
            raise doc.error(
                at, f"{request} must be less than or equal to the {resource} limit {limit}"
            )
    return requests, limits


def _resource_list(values: Any, path: str, doc: _Doc) -> dict[str, Quantity]:
    """A resource list (requests, limits, overhead): resource name -> quantity."""
    parsed: dict[str, Quantity] = {}
    if values is not None:
        if not isinstance(values, dict):
            raise doc.error(path, f"must be a mapping, got a {_kind_of(values)}")
        for resource, value in values.items():
            parsed[str(resource)] = _quantity(value, str(resource), f"{path}[{resource}]", doc)
    return parsed


def _quantity(value: Any, resource: str, path: str, doc: _Doc) -> Quantity:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise doc.error(path, f"{describe(value)} is not a quantity")
    text = value if isinstance(value, str) else repr(value)
    try:
        quantity = parse_quantity(text.strip(_GO_SPACE))
    except ValueError as exc:
        raise doc.error(path, str(exc)) from None
    if quantity.value < 0:
        raise doc.error(path, f'"{quantity}" must be greater than or equal to 0')
    # What everyone after the API server sees: its defaulting rounds up to 1m.
    quantity = round_up_to_milli(quantity)
    if is_extended_resource(resource) and quantity.whole_number is None:
        # The API server's test: the milli-value (rounded up, at most 2^63-1) is a multiple of
        # 1000. So 0.9999 counts as 1, and past 2^63-1 thousandths nothing is a whole number.
        if quantity.milli_value == INT64_MAX:
            raise doc.error(path, f'"{quantity}" is more than {INT64_MAX // 1000}')
        raise doc.error(
            path, f'"{quantity}" is not a whole number (extended resources are counted)'
        )
    return quantity
