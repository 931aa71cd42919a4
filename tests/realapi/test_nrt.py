"""``nvplugin serve --publish-topology`` against a real kube-apiserver (tests/support/realapi.py)
with the NodeResourceTopology CRD installed (tests/fixtures/crds) and exactly the RBAC the chart
renders for ``topology.publish``: the object is created (the real API validates it against the
CRD's schema), owned by its Node, updated as pods are allocated and freed, and kept through an
API outage -- published once the API is back, the serving untouched."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.nrt.objects import attributes_of
from tests.support.helm import render
from tests.support.nrt import CRD, KubeletPods, free_devices
from tests.support.realapi import RealAPI, RealAPIError, cluster_rbac
from tests.support.serve import Serve, new_dir
from tests.support.waiting import WAIT_S

GPU = "nvidia.com/gpu"
NRTS = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
FAILING = "kubernetes api failing (unreachable or refusing); still serving, retrying"


def run(body: Any, timeout: float = 180) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


@pytest.fixture
def node(real_api: RealAPI) -> Iterator[dict[str, Any]]:
    """A Node of this test's own, and its NRT object removed after (no garbage collector)."""
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    created = real_api.add_node(name)
    yield created
    real_api.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    real_api.delete(
        {
            "apiVersion": "topology.node.k8s.io/v1alpha2",
            "kind": "NodeResourceTopology",
            "metadata": {"name": name},
        }
    )


@pytest.fixture
def kubeconfig(real_api: RealAPI) -> Iterator[str]:
    """The CRD, and a kubeconfig of the chart's ServiceAccount with the chart's RBAC for
    ``topology.publish`` applied (the cluster-scoped objects removed after)."""
    real_api.install_crd(CRD)
    namespace = real_api.namespace("nrt")
    rendered = render({"topology": {"publish": True}}, name="nvplugin", namespace=namespace)
    rbac = cluster_rbac(rendered.objects)
    assert len(rbac) == 3, rendered.kinds()
    real_api.apply(rbac)
    yield str(real_api.account_kubeconfig(namespace, rbac))
    for obj in rbac:
        if obj["kind"] != "ServiceAccount":
            real_api.delete(obj)


async def _object(
    real_api: RealAPI, name: str, serve: Serve, holds: Callable[[dict[str, Any] | None], bool]
) -> dict[str, Any]:
    """The object once ``holds`` accepts it (None: there is none)."""

    def get() -> dict[str, Any] | None:
        try:
            return real_api.request("GET", f"{NRTS}/{name}")
        except RealAPIError as exc:
            if exc.status == 404:
                return None
            raise

    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    found = await asyncio.to_thread(get)
    while not holds(found):
        if loop.time() > deadline:
            raise AssertionError(f"the NRT object never held: {found}\n{serve.log_tail(30)}")
        await asyncio.sleep(0.05)
        found = await asyncio.to_thread(get)
    assert found is not None
    return found


def test_serve_creates_updates_and_keeps_the_object_through_an_outage(
    real_api: RealAPI, node: dict[str, Any], kubeconfig: str
) -> None:
    name = node["metadata"]["name"]

    async def body() -> None:
        directory = new_dir()
        async with FakeKubelet(directory) as kubelet:
            pods = KubeletPods(kubelet.devices)
            server = pods.server
            await server.start()
            env = {"KUBECONFIG": kubeconfig, "NODE_NAME": name}
            serve = Serve(
                directory,
                *("--simulate", "dgx-1", "--publish-topology"),
                *("--pod-resources-socket", server.socket_path),
                *("--cpu-manager-policy", "none"),
                *("--api-backoff-s", "0.05", "0.5"),
                env=env,
            )

            try:
                await kubelet.wait_registered(GPU, WAIT_S)
                obj = await _object(real_api, name, serve, lambda o: free_devices(o) == 8)
                assert obj["metadata"]["ownerReferences"] == [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": name,
                        "uid": node["metadata"]["uid"],
                    }
                ]
                assert attributes_of(obj)["cpuManagerPolicy"] == "none"
                assert [z["name"] for z in obj["zones"]] == ["node-0", "node-1"]

                first = Pod.of("a", [Container.of("app", limits={GPU: 3})])
                await pods.admit(first)
                obj = await _object(real_api, name, serve, lambda o: free_devices(o) == 5)
                version = obj["metadata"]["resourceVersion"]

                outage = real_api.outage()
                await asyncio.to_thread(outage.__enter__)
                try:
                    second = Pod.of("b", [Container.of("app", limits={GPU: 2})])
                    await pods.admit(second)
                    pods.delete(first)
                    await serve.wait_log(FAILING)
                    assert kubelet.devices.is_registered(GPU)  # serving on
                finally:
                    await asyncio.to_thread(outage.__exit__, None, None, None)
                obj = await _object(real_api, name, serve, lambda o: free_devices(o) == 6)
                assert obj["metadata"]["resourceVersion"] != version
                assert obj["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
            finally:
                assert serve.stop() == 0, serve.text()
                await server.stop()

    run(body)
