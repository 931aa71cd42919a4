"""kube-scheduler's extender protocol, restated from ``k8s.io/kube-scheduler/extender/v1``
(``types.go``): the Go structs have no JSON tags, so the scheduler sends and expects the field
names as written there (``Pod``, ``Nodes``, ``NodeNames``; ``FailedNodes``,
``FailedAndUnresolvableNodes``, ``Error``; ``Host``, ``Score``), and Go's decoder matches names
case-insensitively, which :func:`field` does too. Scores run 0..``MaxExtenderPriority`` (10).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvplugin.errors import InputError, show
from nvplugin.fakekubelet.pods import Pod, parse_pod

MAX_EXTENDER_PRIORITY = 10


def field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]`` matched as Go's encoding/json matches: exact first, then ignoring case."""
    if name in obj:
        return obj[name]
    lowered = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


@dataclass(frozen=True)
class ExtenderArgs:
    """What filter and prioritize receive: the pod, and the candidate nodes -- by name
    (``nodeCacheCapable: true``) or whole (``Nodes``, a NodeList)."""

    pod: Pod
    raw_pod: Mapping[str, Any]
    node_names: tuple[str, ...]
    nodes: tuple[Mapping[str, Any], ...] | None
    """The NodeList's items when the scheduler sent them (echoed back by filter)."""


def parse_args(body: bytes) -> ExtenderArgs:
    """An ExtenderArgs JSON body; InputError naming what is wrong."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"ExtenderArgs: not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InputError(f"ExtenderArgs: not an object ({show(obj)})")
    raw = field(obj, "Pod")
    if not isinstance(raw, dict):
        raise InputError("ExtenderArgs: Pod: missing")
    # The scheduler's cached pods carry no TypeMeta; the manifest reader wants it.
    raw = {"apiVersion": "v1", "kind": "Pod", **raw}
    pod = parse_pod(raw)
    names = field(obj, "NodeNames")
    items: list[Any] | None = None
    listed = field(obj, "Nodes")
    if isinstance(listed, dict):
        found = field(listed, "items")
        items = found if isinstance(found, list) else []
    if names is None and items is not None:
        names = [n.get("metadata", {}).get("name") for n in items if isinstance(n, dict)]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InputError("ExtenderArgs: NodeNames: not a list of node names")
    return ExtenderArgs(
        pod,
        raw,
        tuple(names),
        None if items is None else tuple(i for i in items if isinstance(i, dict)),
    )


def filter_result(
    args: ExtenderArgs,
    passed: Sequence[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult: ``NodeNames`` (or ``Nodes`` when the scheduler sent nodes)."""
    out: dict[str, Any] = {
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }
    if args.nodes is not None:
        keep = set(passed)
        out["Nodes"] = {
            "items": [n for n in args.nodes if n.get("metadata", {}).get("name") in keep]
        }
    else:
        out["NodeNames"] = list(passed)
    return out


def priority_list(scores: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    """HostPriorityList."""
    return [{"Host": host, "Score": int(score)} for host, score in scores]
