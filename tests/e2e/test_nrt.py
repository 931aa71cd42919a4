"""``nvplugin serve --publish-topology`` keeping the node's NodeResourceTopology object current: a
real plugin beside the fake kubelet (its device manager allocating, its pod resources API on a
real socket), a real HTTP API server (tests/support/kubeapi.py) reached through the client
library. The object appears owned by the Node and valid; an allocation and a freed pod show in it
(the kubelet's device checkpoint changes on both); an API outage delays it, never the serving."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.fakekubelet.podresources import (
    PodResourcesServer,
    allocatable_response,
    list_response,
)
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.nrt.objects import attributes_of
from tests.support.kubeapi import KubeApiServer
from tests.support.nrt import KubeletPods, check_nrt, free_devices
from tests.support.serve import Serve, new_dir
from tests.support.tinyplugin import run
from tests.support.waiting import WAIT_S

pytestmark = pytest.mark.process

GPU = "nvidia.com/gpu"
NODE = "gpu-node-1"
FAILING = "kubernetes api failing (unreachable or refusing); still serving, retrying"


async def _until(
    api: KubeApiServer, serve: Serve, holds: Callable[[dict[str, Any] | None], bool], what: str
) -> dict[str, Any]:
    try:
        await api.wait_for(lambda: holds(api.nrts.get(NODE)))
    except TimeoutError:
        raise AssertionError(
            f"the NRT object never {what}: {api.nrts.get(NODE)}\n{serve.log_tail(30)}"
        ) from None
    return api.nrts[NODE]


def test_serve_publishes_and_follows_allocations_through_an_outage() -> None:
    async def body() -> None:
        async with KubeApiServer() as api:
            api.add_node(NODE)
            directory = new_dir()
            async with FakeKubelet(directory) as kubelet:
                devices = kubelet.devices
                pods = KubeletPods(devices)
                server = pods.server
                await server.start()
                env = {"KUBECONFIG": api.kubeconfig(), "NODE_NAME": NODE}
                serve = Serve(
                    directory,
                    *("--simulate", "dgx-1", "--publish-topology"),
                    *("--pod-resources-socket", server.socket_path),
                    *("--topology-manager-policy", "single-numa-node"),
                    "--publish-numatopology",
                    *("--api-backoff-s", "0.05", "0.5"),
                    env=env,
                )
                try:
                    await kubelet.wait_registered(GPU, WAIT_S)

                    def check(obj: dict[str, Any]) -> None:
                        check_nrt(
                            obj,
                            list_response(pods.pods, devices, None),
                            allocatable_response(devices, None),
                            {GPU: 8},
                        )

                    obj = await _until(
                        api, serve, lambda o: free_devices(o) == 8, "showed 8 free GPUs"
                    )
                    check(obj)
                    assert obj["metadata"]["ownerReferences"] == [
                        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": f"uid-{NODE}"}
                    ]
                    attributes = attributes_of(obj)
                    assert attributes["topologyManagerPolicy"] == "single-numa-node"
                    assert attributes[f"nvplugin.io/best-groups.{GPU}"].startswith("1:0:1,2:")
                    version = obj["metadata"]["resourceVersion"]

                    first = Pod.of("a", [Container.of("app", limits={GPU: 3})])
                    await pods.admit(first)
                    obj = await _until(api, serve, lambda o: free_devices(o) == 5, "showed 5 free")
                    check(obj)
                    assert obj["metadata"]["resourceVersion"] != version
                    fingerprint = attributes_of(obj)["nodeTopologyPodsFingerprint"]

                    await api.down()
                    second = Pod.of("b", [Container.of("app", limits={GPU: 2})])
                    await pods.admit(second)
                    pods.delete(first)
                    await serve.wait_log(FAILING)
                    assert (await kubelet.wait_registered(GPU, WAIT_S)) is not None  # serving
                    await api.up()
                    obj = await _until(api, serve, lambda o: free_devices(o) == 6, "showed 6 free")
                    check(obj)
                    assert attributes_of(obj)["nodeTopologyPodsFingerprint"] != fingerprint

                    # Volcano's object says the same free GPUs, owned by the Node too.
                    def volcanofree_devices() -> int:
                        found = api.numatopologies.get(NODE)
                        if found is None:
                            return -1
                        return len(found["spec"]["numares"][GPU]["allocatable"].split(","))

                    await api.wait_for(lambda: volcanofree_devices() == 6)
                    numatopology = api.numatopologies[NODE]
                    assert numatopology["metadata"]["ownerReferences"][0]["kind"] == "Node"
                    assert numatopology["spec"]["policies"]["TopologyManagerPolicy"] == (
                        "single-numa-node"
                    )

                    pods.delete(second)
                    obj = await _until(api, serve, lambda o: free_devices(o) == 8, "showed 8 free")
                    check(obj)
                    writes = [e for e in serve.lines() if "NodeResourceTopology" in e["event"]]
                    await api.wait_for(lambda: volcanofree_devices() == 8)
                    # Written on changes only: created (perhaps before the kubelet had the
                    # devices), then at most one update per state the kubelet went through.
                    assert writes[0]["event"] == "created the NodeResourceTopology object"
                    assert len(writes) <= 6, writes
                    puts = [
                        r
                        for r in api.requests
                        if r.method == "PUT" and "noderesourcetopologies" in r.path
                    ]
                    assert len(puts) == len(writes) - 1
                finally:
                    assert serve.stop() == 0, serve.text()
                    await server.stop()
            assert NODE in api.nrts  # left in place: the Node owns it

    run(body())


def test_a_kubelet_without_pod_resources_yet_delays_the_object_not_the_serving() -> None:
    async def body() -> None:
        async with KubeApiServer() as api:
            api.add_node(NODE)
            directory = new_dir()
            async with FakeKubelet(directory) as kubelet:
                server = PodResourcesServer(
                    os.path.join(new_dir(), "pod-resources"), list, kubelet.devices
                )
                serve = Serve(
                    directory,
                    *("--simulate", "dgx-1", "--publish-topology"),
                    *("--pod-resources-socket", server.socket_path),
                    *("--api-backoff-s", "0.05", "0.5"),
                    env={"KUBECONFIG": api.kubeconfig(), "NODE_NAME": NODE},
                )
                try:
                    await kubelet.wait_registered(GPU, WAIT_S)  # serving, pod resources or not
                    await serve.wait_log("cannot read the kubelet's pod resources; retrying")
                    assert NODE not in api.nrts
                    await server.start()
                    obj = await _until(api, serve, lambda o: free_devices(o) == 8, "showed 8 free")
                    assert obj["metadata"]["name"] == NODE
                    await serve.wait_log("kubelet's pod resources answering again")
                finally:
                    assert serve.stop() == 0, serve.text()
                    await server.stop()

    run(body())
