"""The per-GPU cordon on a real kube-apiserver (tests/support/realapi.py): ``nvplugin serve``
beside the fake kubelet, reading its Node with the chart's ServiceAccount and nothing but the
chart's ClusterRole (get, list and watch of Nodes); annotating the Node through the API server
withdraws exactly the named GPUs' units, removing the annotation restores them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nvplugin.fakekubelet.devicemanager import DeviceManager
from nvplugin.nodefile.reader import load_node
from nvplugin.plugin.cordon import ANNOTATION, HAMI_ANNOTATION
from tests.support.helm import render
from tests.support.realapi import RealAPI, cluster_rbac
from tests.support.serve import kubelet_with, new_dir
from tests.support.waiting import WAIT_S

GPU = "nvidia.com/gpu"
MIG_SMALL = "nvidia.com/mig-1g.5gb"
TOPOLOGY = load_node("dgx-a100-mig").topology()


@pytest.fixture
def node(real_api: RealAPI) -> Iterator[str]:
    name = f"gpu-cordon-{uuid.uuid4().hex[:8]}"
    real_api.add_node(name)
    yield name
    real_api.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


def units(*gpus: int) -> frozenset[str]:
    out: set[str] = set()
    for index in gpus:
        gpu = TOPOLOGY.gpus[index]
        out |= {d.uuid for d in gpu.mig_devices} if gpu.mig_enabled else {gpu.uuid}
    return frozenset(out)


def exactly(expected: frozenset[str]) -> Callable[[DeviceManager], bool]:
    def check(m: DeviceManager) -> bool:
        if not (m.is_registered(GPU) and m.is_registered(MIG_SMALL)):
            return False
        return frozenset().union(*(m.unhealthy_devices(r) for r in m.resources())) == expected

    return check


def test_cordon_by_annotation_through_the_api_server_with_the_charts_rbac(
    real_api: RealAPI, node: str
) -> None:
    namespace = real_api.namespace("cordon")
    rendered = render({"config": {"map": {"default": "version: v1\n"}}}, namespace=namespace)
    rbac = cluster_rbac(rendered.objects)
    (role,) = [o for o in rbac if o["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    real_api.apply(rbac)
    kubeconfig = real_api.account_kubeconfig(namespace, rbac)
    env = real_api.env(kubeconfig, {"NODE_NAME": node})
    args = ("--simulate", "dgx-a100-mig", "--mig-strategy", "mixed")
    args += ("--api-backoff-s", "0.05", "0.5")

    def annotate(key: str, value: str | None) -> Any:
        path = f"/api/v1/nodes/{node}"
        return real_api.request("PATCH", path, {"metadata": {"annotations": {key: value}}})

    async def body() -> None:
        async with kubelet_with(new_dir(), *args, env=env) as (kubelet, serve):
            wait = kubelet.observer.wait_for
            await wait(exactly(frozenset()), WAIT_S, "everything healthy")
            await asyncio.to_thread(annotate, ANNOTATION, f"2,{TOPOLOGY.gpus[6].uuid}")
            await wait(exactly(units(2, 6)), WAIT_S, "GPU 2's MIG devices and GPU 6 out")
            await asyncio.to_thread(annotate, HAMI_ANNOTATION, TOPOLOGY.gpus[0].uuid)
            await wait(exactly(units(0, 2, 6)), WAIT_S, "GPU 0's too, by HAMi's annotation")
            await asyncio.to_thread(annotate, ANNOTATION, None)
            await wait(exactly(units(0)), WAIT_S, "only GPU 0 left out")
            await asyncio.to_thread(annotate, HAMI_ANNOTATION, None)
            await wait(exactly(frozenset()), WAIT_S, "everything healthy again")
            assert "Traceback" not in serve.text()

    try:
        asyncio.run(asyncio.wait_for(body(), 120))
    finally:
        for obj in rbac:
            if obj["kind"] != "ServiceAccount":
                real_api.delete(obj)


def test_an_account_without_node_access_turns_the_cordon_off_once(
    real_api: RealAPI, node: str
) -> None:
    """What GFD's NodeFeature mode alone gives the plugin: NODE_NAME and a token, no grant on
    Nodes. The real authorizer's 403: the cordon is off, said once, the API not asked again."""
    namespace = real_api.namespace("cordon-none")
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "nvplugin", "namespace": namespace},
    }
    real_api.apply(account)
    kubeconfig = real_api.service_account_kubeconfig(namespace, "nvplugin")
    env = real_api.env(kubeconfig, {"NODE_NAME": node})
    args = ("--simulate", "dgx-a100-mig", "--mig-strategy", "mixed")

    async def body() -> None:
        async with kubelet_with(new_dir(), *args, env=env) as (kubelet, serve):
            await kubelet.observer.wait_for(exactly(frozenset()), WAIT_S, "serving")
            line = await serve.wait_log("gpu cordon by node annotation off")
            assert "no permission to read the Node" in line["reason"]
            assert len(serve.events("gpu cordon by node annotation off")) == 1
            assert not serve.events(
                "kubernetes api failing (unreachable or refusing); still serving, retrying"
            )

    asyncio.run(asyncio.wait_for(body(), 120))
