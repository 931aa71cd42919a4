"""``nvplugin place``: NRT objects from files or the API, and the table it prints."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nvplugin import yamlinput
from nvplugin.errors import InputError, NvpluginError, reason
from nvplugin.extender.nrt import NodeTopology, parse_nrt

MAX_FILE = 64 * 1024 * 1024


def load_nrts(paths: Iterable[str]) -> list[NodeTopology]:
    """NRT objects from YAML or JSON files: one or many documents, or a ``List``."""
    out: list[NodeTopology] = []
    for path in paths:
        text = yamlinput.read_text(path, f"NRT file {path}", MAX_FILE)
        for document in yamlinput.load_all(text, path):
            items = document.get("items") if isinstance(document, dict) else None
            for obj in items if isinstance(items, list) else [document]:
                if obj is None:
                    continue
                try:
                    out.append(parse_nrt(obj))
                except InputError as exc:
                    raise InputError(f"{path}: {exc}") from None
    return out


def read_api_nrts(kubeconfig: str | None) -> list[NodeTopology]:
    """Every NRT object the API holds now (one LIST)."""
    import asyncio
    import os

    from nvplugin.kube.client import open_client
    from nvplugin.kube.collection import NRT
    from nvplugin.kube.kubeconfig import ApiAccess

    env = dict(os.environ)
    access = ApiAccess.of(kubeconfig or env.get("KUBECONFIG"), env)

    async def listed() -> list[dict[str, Any]]:
        client = open_client(access)
        async with asyncio.timeout(120):
            return [o.to_dict() async for o in client.list(NRT, chunk_size=500)]  # type: ignore[no-untyped-call]

    try:
        objects = asyncio.run(listed())
    except NvpluginError:
        raise
    except Exception as exc:
        raise NvpluginError(f"cannot list NodeResourceTopology objects: {reason(exc)}") from None
    return [parse_nrt(o) for o in objects]


def render_table(pod: str, rows: Sequence[Mapping[str, object]]) -> str:
    lines = [f"pod {pod}:", f"  {'NODE':<24} {'VERDICT':<8} {'SCORE':>5}  {'NUMA':<8} WHY"]
    order = sorted(rows, key=lambda r: (r["admit"] is not True, -int(r["score"]), r["node"]))  # type: ignore[call-overload]
    for row in order:
        verdict = {True: "admit", False: "reject", None: "unknown"}[row["admit"]]  # type: ignore[index]
        numa = ",".join(map(str, row["numa_nodes"])) or "-"  # type: ignore[call-overload]
        why = "" if row["admit"] else f"{row['reason'] or ''}: {row['message']}".lstrip(": ")
        lines.append(f"  {row['node']!s:<24} {verdict:<8} {row['score']!s:>5}  {numa:<8} {why}")
    return "\n".join(lines)
