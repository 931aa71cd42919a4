"""GFD's NodeFeature object on a real kube-apiserver with NFD's CRD installed (restated in
tests/fixtures/nfd/nodefeature-crd.yaml): written with the token of the chart's ServiceAccount
and exactly the Role and RoleBinding the chart renders (refused before them), validated by the
CRD's schema, owned by a real Pod object; a write in between is the server's own 409. Then
``nvplugin serve`` publishes it the same way.

The object's removal with its Pod is the garbage collector's, which runs in
kube-controller-manager: not part of envtest's assets nor of the tier's archive, but lent by the
node archive beside it when there (the Makefile adds it); without it that test is skipped."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError

from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.kube import ApiAccess
from nvplugin.kube.client import open_client
from nvplugin.kube.nodefeature import NODE_NAME_LABEL, Owner, object_name, pod_uid, publish
from tests.support.helm import render
from tests.support.kubeapi import KubeApiServer
from tests.support.labelcases import TIME_SLICED, read_fixture
from tests.support.realapi import RealAPI, RealAPIError, client_of
from tests.support.serve import Serve, new_dir
from tests.support.waiting import WAIT_S

CRD = Path(__file__).resolve().parents[1] / "fixtures" / "nfd" / "nodefeature-crd.yaml"
GROUP_PATH = "/apis/nfd.k8s-sigs.io/v1alpha1"
LABELS = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "1"}
STAMP = "nvidia.com/gfd.timestamp"
GPU = "nvidia.com/gpu"
VALUES = {"gfd": {"enabled": True}, "nfd": {"enableNodeFeatureApi": True}}


def run(body: Any, timeout: float = 120) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


@dataclass
class Release:
    """The chart rendered for NodeFeatures into a namespace of its own; a real Pod there."""

    namespace: str
    account: str
    rbac: list[dict[str, Any]]
    pod: str
    pod_uid: str

    def object_path(self, node: str) -> str:
        return f"{GROUP_PATH}/namespaces/{self.namespace}/nodefeatures/{object_name(node)}"


@pytest.fixture(scope="module")
def crd(real_api: RealAPI) -> None:
    real_api.install_crd(str(CRD))  # a path as text, as tests may give it


@pytest.fixture
def release(real_api: RealAPI, crd: None) -> Iterator[Release]:
    namespace = real_api.namespace("nodefeature")
    rendered = render(VALUES, namespace=namespace)
    rbac = [o for o in rendered.objects if o["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
    assert sorted(o["kind"] for o in rbac) == ["Role", "RoleBinding", "ServiceAccount"]
    account = next(o for o in rbac if o["kind"] == "ServiceAccount")
    real_api.apply(account)
    pod = f"nvplugin-{uuid.uuid4().hex[:5]}"
    created = real_api.add_pod(
        namespace, pod, spec={"serviceAccountName": account["metadata"]["name"]}
    )
    yield Release(namespace, account["metadata"]["name"], rbac, pod, created["metadata"]["uid"])


def test_published_with_the_charts_role_owned_by_a_real_pod_and_a_real_conflict(
    real_api: RealAPI, release: Release
) -> None:
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    ns = release.namespace
    kubeconfig = real_api.service_account_kubeconfig(ns, release.account)

    async def body() -> None:
        async with client_of(kubeconfig) as client:
            # Before the chart's Role is bound: the real authorizer refuses the pod's uid.
            with pytest.raises(ApiError) as refused:
                await pod_uid(client, ns, release.pod)
            assert refused.value.status.code == 403

            await asyncio.to_thread(real_api.apply, release.rbac)
            uid: list[str] = []

            async def read_uid() -> bool:
                with contextlib.suppress(ApiError):  # 403 until the binding reaches the cache
                    uid.append(await pod_uid(client, ns, release.pod))
                return bool(uid)

            async with asyncio.timeout(WAIT_S):
                while not await read_uid():
                    await asyncio.sleep(0.05)
            assert uid[0] == release.pod_uid
            owner = Owner(release.pod, uid[0])

            assert await publish(client, node, ns, LABELS, owner) == "created"
            stored = await asyncio.to_thread(real_api.request, "GET", release.object_path(node))
            assert stored["metadata"]["labels"] == {NODE_NAME_LABEL: node}
            [reference] = stored["metadata"]["ownerReferences"]
            assert reference == {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": release.pod,
                "uid": release.pod_uid,
            }
            assert stored["spec"]["labels"] == LABELS
            # The schema kept every field written (a structural schema prunes unknown ones).
            assert stored["spec"]["features"] == {"flags": {}, "attributes": {}, "instances": {}}
            version = stored["metadata"]["resourceVersion"]
            assert await publish(client, node, ns, LABELS, owner) == "unchanged"
            check = await asyncio.to_thread(real_api.request, "GET", release.object_path(node))
            assert check["metadata"]["resourceVersion"] == version

            # Another writer between our GET and PUT: the server's optimistic concurrency.
            real_get = client.get

            async def get_then_someone_writes(*args: object, **kwargs: object) -> object:
                found = await real_get(*args, **kwargs)  # type: ignore[call-overload]
                await asyncio.to_thread(
                    real_api.request,
                    "PATCH",
                    release.object_path(node),
                    {"metadata": {"labels": {"team": "ml"}}},
                )
                return found

            shared = {**LABELS, "nvidia.com/gpu.replicas": "4"}
            client.get = get_then_someone_writes  # type: ignore[method-assign]
            with pytest.raises(ApiError) as conflict:
                await publish(client, node, ns, shared, owner)
            assert conflict.value.status.code == 409
            client.get = real_get  # type: ignore[method-assign]

            # Tried again: updated, the other writer's label kept.
            assert await publish(client, node, ns, shared, owner) == "updated"
            stored = await asyncio.to_thread(real_api.request, "GET", release.object_path(node))
            assert stored["spec"]["labels"] == shared
            assert stored["metadata"]["labels"] == {NODE_NAME_LABEL: node, "team": "ml"}

            # No pod: no owner. A pod that is not there: 404.
            other = f"{node}-2"
            assert await publish(client, other, ns, LABELS, None) == "created"
            stored = await asyncio.to_thread(real_api.request, "GET", release.object_path(other))
            assert "ownerReferences" not in stored["metadata"]
            with pytest.raises(ApiError) as missing:
                await pod_uid(client, ns, "no-such-pod")
            assert missing.value.status.code == 404

    run(body)


def test_serve_publishes_the_object_with_the_charts_rbac_and_a_reload_changes_it(
    real_api: RealAPI, release: Release
) -> None:
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    real_api.apply(release.rbac)
    pod_path = f"/api/v1/namespaces/{release.namespace}/pods/{release.pod}"
    real_api.until_allowed(real_api.token(release.namespace, release.account), "GET", pod_path)
    kubeconfig = real_api.service_account_kubeconfig(release.namespace, release.account)
    env = {
        "GFD_USE_NODE_FEATURE_API": "true",
        "KUBECONFIG": str(kubeconfig),
        "NODE_NAME": node,
        "NAMESPACE": release.namespace,
        "POD_NAME": release.pod,
    }

    def labels() -> dict[str, str]:
        try:
            found = real_api.request("GET", release.object_path(node))
        except RealAPIError as exc:
            if exc.status == 404:
                return {}
            raise
        published = dict(found["spec"]["labels"])
        published.pop(STAMP, None)
        return published

    async def until_labels(expected: dict[str, str]) -> None:
        async with asyncio.timeout(WAIT_S):
            while await asyncio.to_thread(labels) != expected:
                await asyncio.sleep(0.1)

    async def body() -> None:
        directory = new_dir()
        config = Path(new_dir()) / "config.yaml"
        config.write_text("version: v1\n")
        async with FakeKubelet(directory) as kubelet:
            args = ("--simulate", "dgx-a100", "--config", str(config))
            serve = Serve(directory, *args, "--api-backoff-s", "0.05", "0.5", env=env)
            try:
                await kubelet.wait_registered(GPU, WAIT_S)
                await until_labels(read_fixture("dgx-a100"))
                stored = real_api.request("GET", release.object_path(node))
                assert stored["metadata"]["labels"] == {NODE_NAME_LABEL: node}
                assert stored["metadata"]["ownerReferences"] == [
                    {"apiVersion": "v1", "kind": "Pod", "name": release.pod, "uid": release.pod_uid}
                ]
                assert stored["spec"]["labels"][STAMP].isdigit()
                version = stored["metadata"]["resourceVersion"]

                # A reload that changes what is served (4 replicas) changes the object.
                config.write_text(TIME_SLICED)
                serve.send(signal.SIGHUP)
                await kubelet.observer.wait_for(
                    lambda m: len(m.healthy_devices(GPU)) == 32, WAIT_S, "32 replicas"
                )
                await until_labels(read_fixture("dgx-a100.time-sliced"))
                stored = real_api.request("GET", release.object_path(node))
                assert stored["metadata"]["resourceVersion"] != version
                assert stored["metadata"]["ownerReferences"][0]["uid"] == release.pod_uid
                # GFD writes one or the other: no feature file in NodeFeature mode.
                assert not serve.events("labelled the node")
                assert "kubernetes api failing" not in serve.text()
            finally:
                assert serve.stop() == 0, serve.text()
        # Left in place at stop: the pod owns it (and the garbage collector, not here, takes it
        # with the pod).
        assert labels() == read_fixture("dgx-a100.time-sliced")

    run(body)


def test_a_node_name_too_long_for_the_objects_name_is_refused_where_our_server_took_it(
    real_api: RealAPI, crd: None
) -> None:
    """A real-API failure the hand-written server (tests/support/kubeapi.py) lets through: a
    Node name may be 253 characters (a DNS subdomain), and the API takes the Node; GFD's object
    name for it, ``nvidia-features-for-<node>``, then exceeds the 253 an object name may have,
    and the real server refuses the object (422) where ours stored it."""
    node = f"gpu-{uuid.uuid4().hex[:8]}-{'a' * 220}.example.com"
    assert len(node) <= 253 < len(object_name(node))
    real_api.add_node(node)
    namespace = real_api.namespace("longname")

    async def body() -> None:
        async with client_of(real_api.admin_kubeconfig) as client:
            with pytest.raises(ApiError) as refused:
                await publish(client, node, namespace, LABELS, None)
            assert refused.value.status.code == 422
            assert "must be no more than 253 characters" in str(refused.value.status.message)
        async with KubeApiServer() as ours:
            client = await asyncio.to_thread(open_client, ApiAccess(kubeconfig=ours.kubeconfig()))
            try:
                assert await publish(client, node, namespace, LABELS, None) == "created"
            finally:
                await client.close()

    try:
        run(body)
    finally:
        real_api.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})


@pytest.mark.usefixtures("real_garbage_collector")
def test_the_object_goes_with_its_pod(real_api: RealAPI, release: Release) -> None:
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    pod_path = f"/api/v1/namespaces/{release.namespace}/pods/{release.pod}"

    async def body() -> None:
        async with client_of(real_api.admin_kubeconfig) as client:
            owner = Owner(release.pod, release.pod_uid)
            assert await publish(client, node, release.namespace, LABELS, owner) == "created"
        await asyncio.to_thread(real_api.request, "DELETE", pod_path)
        async with asyncio.timeout(WAIT_S):
            while True:
                try:
                    await asyncio.to_thread(real_api.request, "GET", release.object_path(node))
                except RealAPIError as exc:
                    assert exc.status == 404
                    break
                await asyncio.sleep(0.1)

    run(body)
