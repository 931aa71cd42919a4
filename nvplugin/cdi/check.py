"""Whether every name the plugin would hand out resolves in a node's specs, and what to change
when one does not: the cases users meet (no spec of the kind at all; the container toolkit's
spec naming devices by index only while the plugin returns UUIDs, as in
NVIDIA/nvidia-container-toolkit#1895, or the other way round; a stale spec; two specs naming one
device).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from nvplugin.cdi.registry import Entry, Registry
from nvplugin.cdi.spec import ALL
from nvplugin.cdi.writer import spec_file_name
from nvplugin.config.rules import DEFAULT_CDI_KIND, DEFAULT_CDI_SPEC_DIR, TOOLKIT_CDI_KIND

_INDEX = re.compile(r"\d+(:\d+)?")


@dataclass(frozen=True)
class Finding:
    """One name: the spec entry it resolves to, or why it does not."""

    name: str
    entry: Entry | None
    reason: str = ""


def check_names(names: Sequence[str], registry: Registry) -> list[Finding]:
    found = []
    for name in names:
        if name in registry.conflicts:
            paths = ", ".join(registry.conflicts[name])
            found.append(
                Finding(name, None, f"defined by more than one spec of a directory: {paths}")
            )
            continue
        entry = registry.resolve(name)
        found.append(Finding(name, entry, "" if entry else "no spec defines it"))
    return found


def _form(names: Sequence[str]) -> str:
    named = [n for n in names if n != ALL]
    if named and all(_INDEX.fullmatch(n) for n in named):
        return "index"
    if named and all(n.startswith(("GPU-", "MIG-")) for n in named):
        return "uuid"
    return "mixed"


def advice(
    kind: str,
    id_strategy: str,
    findings: Sequence[Finding],
    registry: Registry,
    dirs: Sequence[str],
) -> list[str]:
    """What to change so that the unresolved names of ``findings`` resolve."""
    unresolved = [f for f in findings if f.entry is None]
    if not unresolved:
        return []
    out: list[str] = []
    conflicted = [f.name for f in unresolved if f.name in registry.conflicts]
    if conflicted:
        out.append(
            f"{len(conflicted)} name(s) are defined by two specs of one directory "
            f"({conflicted[0]}: {', '.join(registry.conflicts[conflicted[0]])}): remove one of them"
        )
    files = registry.kinds.get(kind, [])
    where = " and ".join(dirs)
    if not files:
        if kind == TOOLKIT_CDI_KIND:
            out.append(
                f"no spec of kind {kind} in {where}: generate it on the node (nvidia-ctk cdi "
                "generate --output=/var/run/cdi/nvidia.yaml), or let nvplugin write its own: "
                f"nvplugin.cdi.kind {DEFAULT_CDI_KIND} (the default)"
            )
        else:
            out.append(
                f"no spec of kind {kind} in {where}: nvplugin serve writes "
                f"{spec_file_name(kind)} into nvplugin.cdi.specDir "
                f"(default {DEFAULT_CDI_SPEC_DIR}) "
                "before it registers, with a cdi-annotations or cdi-cri deviceListStrategy; check "
                "that this directory is the runtime's and is mounted in the plugin's pod, or write "
                "it now: nvplugin cdi generate --output "
                f"{DEFAULT_CDI_SPEC_DIR}/{spec_file_name(kind)}"
            )
        return out
    have = _form(registry.names_of(kind))
    shown = ", ".join(files)
    if id_strategy == "uuid" and have == "index":
        out.append(
            f"the spec {shown} of kind {kind} names devices by index only (0, 1, 0:1, ...) while "
            "the plugin returns UUIDs (deviceIDStrategy uuid): set deviceIDStrategy to index, "
            "or generate the spec with UUID names too (nvidia-ctk cdi generate "
            "--device-name-strategy=index --device-name-strategy=uuid)"
            + (
                f", or let nvplugin write its own spec (nvplugin.cdi.kind {DEFAULT_CDI_KIND})"
                if kind == TOOLKIT_CDI_KIND
                else ""
            )
        )
    elif id_strategy == "index" and have == "uuid":
        out.append(
            f"the spec {shown} of kind {kind} names devices by UUID only while the plugin returns "
            "indices (deviceIDStrategy index): set deviceIDStrategy to uuid, or generate the spec "
            "with index names too (nvidia-ctk cdi generate --device-name-strategy=index "
            "--device-name-strategy=uuid)"
        )
    else:
        fix = (
            "reload or restart nvplugin serve, which writes it again"
            if kind != TOOLKIT_CDI_KIND
            else "generate it again (nvidia-ctk cdi generate)"
        )
        out.append(
            f"the spec {shown} of kind {kind} lacks {len(unresolved)} of the plugin's names "
            f"(first: {unresolved[0].name}); it was written for other devices (MIG repartitioned, "
            f"GPUs changed?): {fix}"
        )
    return out
