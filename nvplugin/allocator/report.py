"""What ``nvplugin preferred`` reads and prints: device IDs in, an answer (and its reasons) out.

Kept out of the CLI so the command stays a thin shell, and out of the policies so they stay
pure functions over indices.
"""

from __future__ import annotations

from typing import Any

from nvplugin.allocator.base import Allocation
from nvplugin.errors import InputError
from nvplugin.node.model import Topology

CONTENDERS_SHOWN = 8
"""How many of the groups that reach OPT ``--explain`` lists before summarising the rest."""


def resolve_ids(topology: Topology, text: str, option: str) -> tuple[int, ...]:
    """Comma-separated GPU UUIDs or indices -> indices, in the order given.

    Unknown IDs and the same GPU named twice (even once by UUID and once by index) are
    :class:`InputError` naming the ID as the user wrote it.
    """
    if not text.strip():
        return ()
    seen: dict[int, str] = {}
    for raw in text.split(","):
        token = raw.strip()
        if not token:
            raise InputError(f"{option}: empty device ID in {text!r}")
        if token.isdigit():
            index = int(token)
            if index >= len(topology):
                raise InputError(
                    f"{option}: unknown device {token!r} "
                    f"(node {topology.name} has GPUs 0..{len(topology) - 1})"
                )
        else:
            gpu = topology.gpu_by_uuid(token)
            if gpu is None:
                raise InputError(f"{option}: unknown device {token!r} on node {topology.name}")
            index = gpu.index
        if index in seen:
            raise InputError(f"{option}: GPU {index} given twice ({seen[index]!r} and {token!r})")
        seen[index] = token
    return tuple(seen)


def check_must_include(available: tuple[int, ...], must_include: tuple[int, ...]) -> None:
    for index in must_include:
        if index not in available:
            raise InputError(f"--must-include: GPU {index} is not in --available")


def _pairs(group: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(a, b) for x, a in enumerate(group) for b in group[x + 1 :]]


def _set(group: tuple[int, ...]) -> str:
    return "{" + ",".join(map(str, group)) + "}"


def gap(answer: Allocation) -> int | None:
    """How far the partition score may be below OPT: 0 when proven, the bound's distance when a
    time budget cut the search short, None when there is no answer."""
    if answer.partition_score is None:
        return None
    if answer.bound is None:
        return 0 if answer.proven else None
    return answer.bound - answer.partition_score


def to_json(topology: Topology, answer: Allocation, explain: bool) -> dict[str, Any]:
    """The ``--output json`` document (the five keys README.md documents, ``proven_optimal``: the
    answer is the optimum of docs/allocation.md, proven, and ``gap`` (:func:`gap`), plus
    ``explain`` on request)."""
    doc: dict[str, Any] = {
        "devices": [topology.gpus[i].uuid for i in answer.indices],
        "indices": list(answer.indices),
        "score": answer.score,
        "partition_score": answer.partition_score,
        "policy": answer.policy,
        "proven_optimal": answer.proven,
        "gap": gap(answer),
    }
    if explain:
        doc["explain"] = {
            "reason": answer.reason or None,
            "pairs": [
                {
                    "gpus": [a, b],
                    "link": topology.link(a, b).cell,
                    "score": topology.score(a, b),
                }
                for a, b in _pairs(answer.indices)
            ],
            "partition": {
                "groups": [list(g) for g in answer.groups],
                "leftover": list(answer.leftover),
            },
            "contenders": [{"indices": list(g), "score": score} for g, score in answer.contenders],
            "contenders_note": answer.contenders_note or None,
            "proven_optimal": answer.proven,
            "bound": answer.bound,
        }
    return doc


def to_text(
    topology: Topology,
    answer: Allocation,
    size: int,
    must_include: tuple[int, ...],
    explain: bool,
) -> str:
    """The ``--output text`` report: the answer, and with ``explain`` why it won."""
    if not answer.indices:
        return (
            f"no preferred allocation ({answer.policy}, size {size}): {answer.reason}; "
            "the kubelet falls back to its own choice"
        )
    lines = [
        f"{answer.policy} on {topology.name}, size {size}: "
        f"GPUs {', '.join(map(str, answer.indices))}",
        f"  devices: {', '.join(topology.gpus[i].uuid for i in answer.indices)}",
        f"  group score {answer.score}, partition score {answer.partition_score}",
    ]
    if not explain:
        return "\n".join(lines)
    lines.append("")
    lines.append(f"pairs in the group (score {answer.score}):")
    for a, b in _pairs(answer.indices):
        link = topology.link(a, b)
        lines.append(f"  GPU{a}-GPU{b}  {link.cell:<10} {link.score:>5}")
    if len(answer.indices) == 1:
        lines.append("  (a single GPU has no pairs: score 0)")
    lines.append("")
    lines.append(
        f"best partition of the available GPUs containing it (score {answer.partition_score}):"
    )
    for position, group in enumerate(answer.groups):
        mark = "  <- chosen" if position == 0 else ""
        lines.append(f"  {_set(group):<24} {topology.group_score(group):>6}{mark}")
    if answer.leftover:
        leftover = answer.leftover
        lines.append(f"  {_set(leftover):<24} {topology.group_score(leftover):>6}  (leftover)")
    lines.append("")
    if not answer.proven and gap(answer):
        lines.append(
            f"not proven optimal: the best partition found in the time budget scores "
            f"{answer.partition_score}; no partition scores more than {answer.bound}"
        )
    elif not answer.proven:
        lines.append(
            f"the best partition found in the time budget scores {answer.partition_score}, "
            "which no partition beats; another such partition may hold a group of a higher "
            "own score (not searched for)"
        )
    elif answer.policy == "best-effort":
        lines.extend(_why_best_effort(answer, must_include))
    else:
        lines.append(
            f"why: {answer.policy} takes must-include GPUs, then the lowest available indices; "
            "it does not look at links (best-effort does)."
        )
    return "\n".join(lines)


def _why_best_effort(answer: Allocation, must_include: tuple[int, ...]) -> list[str]:
    contenders = answer.contenders
    which = (
        f"with a full group holding {_set(must_include)}" if must_include else "of the available"
    )
    lines = [
        f"why: {answer.partition_score} is the best score of any partition {which}; "
        f"{len(contenders)} group(s) appear in such a partition"
        + (f" ({answer.contenders_note}):" if answer.contenders_note else ":")
    ]
    for group, score in contenders[:CONTENDERS_SHOWN]:
        lines.append(f"  {_set(group):<24} {score:>6}")
    if len(contenders) > CONTENDERS_SHOWN:
        lines.append(
            f"  ... and {len(contenders) - CONTENDERS_SHOWN} more "
            "(ranked by own score, then index order)"
        )
    ties = [g for g, score in contenders if score == answer.score]
    if len(ties) > 1:
        lines.append(
            f"{len(ties)} of them share the highest own score {answer.score}; "
            f"the lowest indices win: {_set(answer.indices)}"
        )
    else:
        lines.append(f"{_set(answer.indices)} has the highest own score ({answer.score})")
    return lines
