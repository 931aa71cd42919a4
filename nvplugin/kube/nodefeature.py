"""GPU Feature Discovery's NodeFeature object: the node's labels as Node Feature Discovery's
``NodeFeature`` (``nfd.k8s-sigs.io/v1alpha1``), which NFD's master turns into node labels.

The object is GFD's: ``nvidia-features-for-<node>`` in the plugin's namespace, labelled
``nfd.node.kubernetes.io/node-name=<node>`` (how NFD knows which node it describes), its
``spec.labels`` the labels and ``spec.features`` empty; owned by the plugin's pod (an
``ownerReference`` with the pod's uid), so Kubernetes' garbage collector removes it with the pod.

:func:`publish` makes the object say what is given, in as few requests as it can: GET it; absent
(404): POST it; different: PUT it with the resourceVersion read (another writer meanwhile: 409,
and the caller tries again); the same: nothing. :func:`pod_uid` reads the owner's uid. Each
request has a deadline; failures raise (the caller retries with backoff, see
:mod:`nvplugin.plugin.nodefeature`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod

from nvplugin.kube.client import REQUEST_S

GROUP = "nfd.k8s-sigs.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
"""The label that tells NFD which node a NodeFeature describes."""

NodeFeature = create_namespaced_resource(GROUP, VERSION, "NodeFeature", "nodefeatures")


def object_name(node: str) -> str:
    """GFD's name for a node's NodeFeature object."""
    return f"nvidia-features-for-{node}"


@dataclass(frozen=True)
class Owner:
    """The pod that owns the object (its name and uid)."""

    name: str
    uid: str


async def pod_uid(
    client: AsyncClient, namespace: str, name: str, *, request_s: float = REQUEST_S
) -> str:
    """The uid of Pod ``namespace/name``. Raises ApiError (404: no such pod) and the client's
    errors."""
    async with asyncio.timeout(request_s):
        pod = await client.get(Pod, name=name, namespace=namespace)
    uid = pod.metadata.uid if pod.metadata is not None else None
    if not uid:
        raise ValueError(f"pod {namespace}/{name} has no uid")
    return uid


def desired(
    node: str, namespace: str, labels: Mapping[str, str], owner: Owner | None
) -> dict[str, Any]:
    """The object as it should be (no resourceVersion)."""
    metadata: dict[str, Any] = {
        "name": object_name(node),
        "namespace": namespace,
        "labels": {NODE_NAME_LABEL: node},
    }
    if owner is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner.name, "uid": owner.uid}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": "NodeFeature",
        "metadata": metadata,
        "spec": {
            "features": {"flags": {}, "attributes": {}, "instances": {}},
            "labels": dict(sorted(labels.items())),
        },
    }


def _same(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether the object already says what is wanted (labels, the node label, the owner)."""
    have, want = current.get("metadata") or {}, wanted["metadata"]
    return (
        (current.get("spec") or {}).get("labels") == wanted["spec"]["labels"]
        and (have.get("labels") or {}).get(NODE_NAME_LABEL) == node_of(wanted)
        and _owners(have) == _owners(want)
    )


def node_of(obj: Mapping[str, Any]) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(NODE_NAME_LABEL)
    return value if isinstance(value, str) else None


def _owners(metadata: Mapping[str, Any]) -> list[tuple[str, str]]:
    refs = metadata.get("ownerReferences") or []
    return sorted((str(ref.get("kind")), str(ref.get("uid"))) for ref in refs)


async def publish(
    client: AsyncClient,
    node: str,
    namespace: str,
    labels: Mapping[str, str],
    owner: Owner | None,
    *,
    request_s: float = REQUEST_S,
) -> str:
    """Make the node's NodeFeature object say ``labels``: ``created``, ``updated`` or
    ``unchanged``. Raises ApiError (409: written meanwhile; try again) and the client's
    errors."""
    wanted = desired(node, namespace, labels, owner)
    name = wanted["metadata"]["name"]
    try:
        async with asyncio.timeout(request_s):
            found = await client.get(NodeFeature, name=name, namespace=namespace)
    except ApiError as exc:
        if exc.status.code != 404:
            raise
        async with asyncio.timeout(request_s):
            await client.create(_resource(wanted))
        return "created"
    current: dict[str, Any] = json.loads(json.dumps(found, default=_plain))
    if _same(current, wanted):
        return "unchanged"
    metadata = dict(current.get("metadata") or {})
    # Keep what others set on the object (their labels, annotations); ours win.
    metadata["labels"] = {**(metadata.get("labels") or {}), **wanted["metadata"]["labels"]}
    if "ownerReferences" in wanted["metadata"]:
        metadata["ownerReferences"] = wanted["metadata"]["ownerReferences"]
    replacement = {**current, "metadata": metadata, "spec": wanted["spec"]}
    async with asyncio.timeout(request_s):
        await client.replace(_resource(replacement))
    return "updated"


def _resource(data: dict[str, Any]) -> Any:
    """The lightkube object of NodeFeature ``data`` (a generic resource is a dict)."""
    return cast(Any, NodeFeature)(data)


def _plain(value: object) -> object:
    """JSON for what lightkube may hold as a model (ObjectMeta)."""
    return cast(Any, value).to_dict()
