"""Per-GPU cordon by Node annotation: an operator takes GPUs out of service, live, with
``kubectl annotate node``; every unit of a cordoned GPU (its MIG devices, replicas, MPS shares)
is Unhealthy until the annotation no longer names it. Nothing restarts.

Two annotations are read, their GPUs added up: nvplugin's own, :data:`ANNOTATION`, and HAMi's
``hami.io/device-cordon`` (HAMi's form: comma-separated GPU UUIDs), so a node moved from HAMi
keeps its cordons. Either takes GPU UUIDs or GPU indices, comma-separated. An entry naming no
GPU of this node is logged once (per distinct value) and ignored.

The Node is followed through :mod:`nvplugin.kube.node` (list + watch, resumed, capped backoff)
whenever ``NODE_NAME`` is set and the API can be reached; it needs get, list and watch of Nodes,
as per-node configs do, and nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nvplugin.backoff import Backoff
from nvplugin.config.pod import PodIdentity, name_problem
from nvplugin.log import get_logger
from nvplugin.node.model import Gpu

ANNOTATION = "nvplugin.feature.node.kubernetes.io/gpu-cordon"
"""nvplugin's annotation: under the one prefix nvplugin already owns (its node labels'), which
NFD leaves alone (it removes only what it wrote itself)."""
HAMI_ANNOTATION = "hami.io/device-cordon"
"""HAMi's (Project-HAMi/HAMi#2289): comma-separated GPU UUIDs."""
ANNOTATIONS = (ANNOTATION, HAMI_ANNOTATION)
MAX_VALUE_CHARS = 16384
"""An annotation value longer than this is ignored as a whole (and said once)."""


def entries(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The cordon entries both annotations give, in order, without blanks or repeats."""
    out: list[str] = []
    for key in ANNOTATIONS:
        value = annotations.get(key)
        if not value or len(value) > MAX_VALUE_CHARS:
            continue
        for entry in value.split(","):
            entry = entry.strip()
            if entry and entry not in out:
                out.append(entry)
    return tuple(out)


def resolve(items: Sequence[str], gpus: Sequence[Gpu]) -> tuple[frozenset[int], tuple[str, ...]]:
    """The GPU indices ``items`` name (UUID, case as NVML gives it, or index) and the entries
    that name no GPU of the node."""
    by_uuid = {gpu.uuid.lower(): gpu.index for gpu in gpus}
    indices = {gpu.index for gpu in gpus}
    found: set[int] = set()
    unknown: list[str] = []
    for item in items:
        index = by_uuid.get(item.lower())
        if index is None and item.isdecimal() and int(item) in indices:
            index = int(item)
        if index is None:
            unknown.append(item)
        else:
            found.add(index)
    return frozenset(found), tuple(unknown)


class Cordon:
    """What the annotations say, applied to the served GPUs through ``apply`` (the resources'
    health). ``update`` takes new annotation entries; ``node`` the discovered GPUs (cordons
    given before discovery wait for it)."""

    def __init__(self, apply: Callable[[frozenset[int]], None]) -> None:
        self._apply = apply
        self._entries: tuple[str, ...] = ()
        self._gpus: Sequence[Gpu] | None = None
        self._said: set[str] = set()  # unknown entries already logged
        self._applied: frozenset[int] | None = None
        self._log = get_logger("nvplugin.health")

    @property
    def indices(self) -> frozenset[int]:
        """The GPUs cordoned now (none before discovery)."""
        return self._applied or frozenset()

    def update(self, items: tuple[str, ...]) -> None:
        self._entries = items
        self._refresh()

    def node(self, gpus: Sequence[Gpu]) -> None:
        self._gpus = gpus
        self._refresh()

    def _refresh(self) -> None:
        if self._gpus is None:
            return
        indices, unknown = resolve(self._entries, self._gpus)
        for entry in unknown:
            if entry not in self._said:
                self._said.add(entry)
                self._log.warning(
                    "cordon annotation names no GPU of this node; ignored",
                    entry=entry,
                    annotations=list(ANNOTATIONS),
                )
        if indices != self._applied:
            self._log.info("gpu cordon", gpus=sorted(indices))
            self._applied = indices
            self._apply(indices)


async def follow(
    pod: PodIdentity,
    cordon: Cordon,
    *,
    backoff: Backoff | None = None,
    watch_s: int | None = None,
) -> None:
    """Follow the own Node's cordon annotations into ``cordon`` until cancelled; returns at
    once (said once) when there is no Node to follow."""
    log = get_logger("nvplugin.health", node=pod.node_name)
    problem = (
        "NODE_NAME is not set (the downward API's spec.nodeName)"
        if not pod.node_name
        else name_problem("NODE_NAME", pod.node_name) or pod.access.problem()
    )
    if problem is not None:
        log.info("gpu cordon by node annotation off", reason=problem)
        return
    # Only here is the client library imported: without the API, serve never loads it.
    from nvplugin.kube.client import ApiUnavailable, open_client
    from nvplugin.kube.node import API_BACKOFF, follow_labels

    try:
        client = await asyncio.to_thread(open_client, pod.access)
    except ApiUnavailable as exc:
        log.warning("gpu cordon by node annotation off", reason=str(exc))
        return
    extra = {} if watch_s is None else {"watch_s": watch_s}
    try:
        if await _forbidden(client, pod.node_name or ""):
            log.warning(
                "gpu cordon by node annotation off",
                reason="no permission to read the Node (the cordon needs get, list and watch "
                "of nodes, as per-node configs do)",
            )
            return
        async for state in follow_labels(
            client, pod.node_name or "", backoff=backoff or API_BACKOFF, **extra
        ):
            cordon.update(entries(state.annotations))
    finally:
        with contextlib.suppress(Exception):
            await client.close()


async def _forbidden(client: Any, name: str) -> bool:
    """Whether the API refuses (403) to show us our Node: then there is nothing to follow, and
    retrying for ever would only load the API server. Any other failure (the API away) is left
    to the follower's retries."""
    from lightkube import ApiError

    from nvplugin.kube.node import get_node

    try:
        await get_node(client, name)
    except ApiError as exc:
        return exc.status is not None and exc.status.code == 403
    except Exception:
        return False
    return False
