"""nvplugin.kube.nodefeature against a real HTTP API server (tests/support/kubeapi.py) through
lightkube: the NodeFeature object created as GPU Feature Discovery names and labels it, owned by
the pod; left alone when it already says the labels; updated with the version read (what others
set on it kept); a write in between refused (409) for the caller to retry; a missing pod said."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from lightkube import ApiError, AsyncClient

from nvplugin.kube import ApiAccess
from nvplugin.kube.client import open_client
from nvplugin.kube.nodefeature import NODE_NAME_LABEL, Owner, object_name, pod_uid, publish
from tests.support.kubeapi import KubeApiServer

NODE = "gpu-node-1"
NAMESPACE = "gpu-system"
POD = "nvplugin-abcde"
LABELS = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "1"}


def run(body: Callable[[], Awaitable[None]], timeout: float = 60) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


@contextlib.asynccontextmanager
async def cluster() -> AsyncIterator[tuple[KubeApiServer, AsyncClient]]:
    async with KubeApiServer() as api:
        client = await asyncio.to_thread(open_client, ApiAccess(kubeconfig=api.kubeconfig()))
        try:
            yield api, client
        finally:
            await client.close()


def test_created_owned_by_the_pod_then_unchanged_then_updated() -> None:
    async def body() -> None:
        async with cluster() as (api, client):
            uid = api.add_pod(NAMESPACE, POD)
            assert await pod_uid(client, NAMESPACE, POD) == uid
            owner = Owner(POD, uid)
            assert await publish(client, NODE, NAMESPACE, LABELS, owner) == "created"
            name = object_name(NODE)
            assert name == "nvidia-features-for-gpu-node-1"
            stored = api.nodefeatures[(NAMESPACE, name)]
            assert stored["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1"
            assert stored["kind"] == "NodeFeature"
            assert stored["metadata"]["labels"] == {NODE_NAME_LABEL: NODE}
            assert stored["metadata"]["ownerReferences"] == [
                {"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": uid}
            ]
            assert stored["spec"]["labels"] == LABELS
            writes = sum(r.method in ("POST", "PUT") for r in api.requests)

            assert await publish(client, NODE, NAMESPACE, LABELS, owner) == "unchanged"
            assert sum(r.method in ("POST", "PUT") for r in api.requests) == writes

            # Someone labels the object too; an update keeps their label, ours win.
            stored["metadata"]["labels"]["team"] = "ml"
            shared = {**LABELS, "nvidia.com/gpu.replicas": "4"}
            assert await publish(client, NODE, NAMESPACE, shared, owner) == "updated"
            stored = api.nodefeatures[(NAMESPACE, name)]
            assert stored["spec"]["labels"] == shared
            assert stored["metadata"]["labels"] == {NODE_NAME_LABEL: NODE, "team": "ml"}
            put = [r for r in api.requests if r.method == "PUT"]
            assert put[-1].path == (
                f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{NAMESPACE}/nodefeatures/{name}"
            )

    run(body)


def test_a_write_in_between_is_a_conflict_and_a_missing_pod_is_said() -> None:
    async def body() -> None:
        async with cluster() as (api, client):
            assert await publish(client, NODE, NAMESPACE, LABELS, None) == "created"
            stored = api.nodefeatures[(NAMESPACE, object_name(NODE))]
            assert "ownerReferences" not in stored["metadata"]
            real_get = client.get

            async def get_then_someone_writes(*args: object, **kwargs: object) -> object:
                found = await real_get(*args, **kwargs)  # type: ignore[call-overload]
                stored["metadata"]["resourceVersion"] = "999999"  # another writer
                return found

            client.get = get_then_someone_writes  # type: ignore[method-assign]
            with pytest.raises(ApiError) as conflict:
                await publish(client, NODE, NAMESPACE, {"nvidia.com/gpu.count": "7"}, None)
            assert conflict.value.status.code == 409
            client.get = real_get  # type: ignore[method-assign]
            assert await publish(client, NODE, NAMESPACE, {"nvidia.com/gpu.count": "7"}, None) == (
                "updated"
            )
            with pytest.raises(ApiError) as missing:
                await pod_uid(client, NAMESPACE, "no-such-pod")
            assert missing.value.status.code == 404

    run(body)
