"""The node's NodeResourceTopology object (``topology.node.k8s.io/v1alpha2``, cluster-scoped,
named after the node) written through the API, owned by the Node (an ``ownerReference`` with the
Node's uid: Kubernetes' garbage collector removes it with the node).

:func:`publish` makes the object say what is given, in as few requests as it can: GET it; absent
(404): POST it; different: PUT it with the resourceVersion read (another writer meanwhile: 409,
and the caller tries again); the same: nothing. :func:`node_uid` reads the owner's uid. Each
request has a deadline; failures raise (the caller retries with backoff, see
:mod:`nvplugin.plugin.nrt`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, cast

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_global_resource
from lightkube.resources.core_v1 import Node

from nvplugin.kube.client import REQUEST_S
from nvplugin.nrt import volcano
from nvplugin.nrt.objects import GROUP, KIND, PLURAL, VERSION

NodeResourceTopology = create_global_resource(GROUP, VERSION, KIND, PLURAL)
Numatopology = create_global_resource(volcano.GROUP, volcano.VERSION, volcano.KIND, volcano.PLURAL)
KINDS = {KIND: NodeResourceTopology, volcano.KIND: Numatopology}
"""The objects this module writes, by kind."""


async def node_uid(client: AsyncClient, name: str, *, request_s: float = REQUEST_S) -> str:
    """The uid of Node ``name``. Raises ApiError (404: no such node) and the client's errors."""
    async with asyncio.timeout(request_s):
        node = await client.get(Node, name=name)
    uid = node.metadata.uid if node.metadata is not None else None
    if not uid:
        raise ValueError(f"node {name} has no uid")
    return uid


def owned(obj: Mapping[str, Any], node: str, uid: str | None) -> dict[str, Any]:
    """``obj`` with the Node as its owner (no owner without a uid)."""
    out: dict[str, Any] = json.loads(json.dumps(obj))
    if uid:
        out["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
        ]
    return out


def _owners(metadata: Mapping[str, Any]) -> list[tuple[str, str]]:
    refs = metadata.get("ownerReferences") or []
    return sorted((str(ref.get("kind")), str(ref.get("uid"))) for ref in refs)


def _same(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether the object already says what is wanted: every field but the metadata, and the
    owner."""
    return all(
        current.get(key) == value
        for key, value in wanted.items()
        if key not in ("apiVersion", "kind", "metadata")
    ) and _owners(current.get("metadata") or {}) == _owners(wanted["metadata"])


async def publish(
    client: AsyncClient,
    wanted: Mapping[str, Any],
    *,
    known: Mapping[str, Any] | None = None,
    request_s: float = REQUEST_S,
) -> tuple[str, dict[str, Any]]:
    """Make the object of ``wanted``'s kind (one of :data:`KINDS`) and name say what ``wanted``
    says: ``created``, ``updated`` or ``unchanged``, with the object as stored. ``known``: the
    object as this writer last stored it; a PUT with its resourceVersion then saves the GET
    (written by another meanwhile, or gone: the GET path). Raises ApiError (409: written
    meanwhile; try again; 404 on the kind: no CRD) and the client's errors."""
    if known is not None:
        if _same(known, wanted):
            return "unchanged", dict(known)
        try:
            return "updated", await _replace(client, known, wanted, request_s)
        except ApiError as exc:
            if exc.status.code not in (404, 409):
                raise
    name = wanted["metadata"]["name"]
    try:
        async with asyncio.timeout(request_s):
            found = await client.get(KINDS[wanted["kind"]], name=name)
    except ApiError as exc:
        if exc.status.code != 404:
            raise
        async with asyncio.timeout(request_s):
            created = await client.create(_resource(dict(wanted)))
        return "created", _plain_dict(created)
    current = _plain_dict(found)
    if _same(current, wanted):
        return "unchanged", current
    return "updated", await _replace(client, current, wanted, request_s)


async def _replace(
    client: AsyncClient, current: Mapping[str, Any], wanted: Mapping[str, Any], request_s: float
) -> dict[str, Any]:
    """PUT ``wanted`` over ``current`` (its resourceVersion, the rest of its metadata kept)."""
    metadata = dict(current.get("metadata") or {})
    if "ownerReferences" in wanted["metadata"]:
        metadata["ownerReferences"] = wanted["metadata"]["ownerReferences"]
    replacement = {**current, **wanted, "metadata": metadata}
    async with asyncio.timeout(request_s):
        stored = await client.replace(_resource(replacement))
    return _plain_dict(stored)


def _plain_dict(obj: object) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(obj, default=_plain))
    return out


def _resource(data: dict[str, Any]) -> Any:
    return cast(Any, KINDS[data["kind"]])(data)


def _plain(value: object) -> object:
    return cast(Any, value).to_dict()
