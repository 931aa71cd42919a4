"""The plugin's own Node, followed on a real kube-apiserver (tests/support/realapi.py) with the
token of the chart's ServiceAccount: refused by the real RBAC authorizer until the chart's
rendered ClusterRole and ClusterRoleBinding are applied, then every label change seen -- by the
client in process, and by ``nvplugin serve`` beside the fake kubelet, switching its per-node
config when the label changes."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import ApiError

from nvplugin.backoff import Backoff
from nvplugin.fakekubelet.devicemanager import DeviceManager
from nvplugin.kube.node import NodeLabels, follow_labels, get_node
from tests.support.configmap import ConfigMapVolume
from tests.support.helm import render
from tests.support.realapi import RealAPI, client_of, cluster_rbac
from tests.support.serve import kubelet_with, new_dir
from tests.support.waiting import WAIT_S

LABEL = "nvidia.com/device-plugin.config"
FAST = Backoff(initial_s=0.05, maximum_s=0.5)
CONFIGS = {"default": "version: v1\n", "tesla-t4": "version: v1\n"}


def run(body: Any, timeout: float = 120) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


@pytest.fixture
def node(real_api: RealAPI) -> Iterator[str]:
    """A Node of this test's own (cluster-scoped: removed after)."""
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    real_api.add_node(name, labels={LABEL: "a100-40gb"})
    yield name
    real_api.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


@pytest.fixture
def chart_rbac(real_api: RealAPI) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A namespace and the RBAC objects the chart renders into it for per-node configs (only the
    ServiceAccount applied yet; the cluster-scoped ones are removed after)."""
    namespace = real_api.namespace("follow")
    rendered = render({"config": {"map": CONFIGS}}, name="nvplugin", namespace=namespace)
    rbac = cluster_rbac(rendered.objects)
    assert len(rbac) == 3, rendered.kinds()
    (account,) = [o for o in rbac if o["kind"] == "ServiceAccount"]
    real_api.apply(account)
    yield namespace, rbac
    for obj in rbac:
        real_api.delete(obj)


def test_the_charts_account_is_refused_until_its_rbac_then_follows_the_node(
    real_api: RealAPI, node: str, chart_rbac: tuple[str, list[dict[str, Any]]]
) -> None:
    namespace, rbac = chart_rbac
    kubeconfig = real_api.account_kubeconfig(namespace, rbac)

    async def body() -> None:
        async with client_of(kubeconfig) as client:
            # The real authorizer: no binding, no Node.
            with pytest.raises(ApiError) as refused:
                await get_node(client, node)
            assert refused.value.status.code == 403
            assert 'cannot get resource "nodes"' in str(refused.value.status.message)

            # The chart's ClusterRole and binding: the Node, then every label change.
            await asyncio.to_thread(real_api.apply, rbac)
            seen: list[NodeLabels] = []
            changed = asyncio.Event()

            async def follow() -> None:
                async for state in follow_labels(client, node, backoff=FAST):
                    seen.append(state)
                    changed.set()

            async def until_label(value: str | None) -> None:
                async with asyncio.timeout(WAIT_S):
                    while not seen or seen[-1].labels.get(LABEL) != value:
                        changed.clear()
                        await changed.wait()

            task = asyncio.create_task(follow())
            try:
                # The binding reaches the authorizer's cache after a moment: the follower
                # retries through the 403s meanwhile.
                await until_label("a100-40gb")
                assert not (await get_node(client, f"no-such-{node}")).exists  # 404
                await asyncio.to_thread(real_api.label_node, node, {LABEL: "tesla-t4"})
                await until_label("tesla-t4")
                await asyncio.to_thread(real_api.label_node, node, {LABEL: None})
                await until_label(None)
                assert seen[-1].exists
                # Deleted, and made again: said both times.
                gone = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
                await asyncio.to_thread(real_api.delete, gone)
                async with asyncio.timeout(WAIT_S):
                    while seen[-1].exists:
                        changed.clear()
                        await changed.wait()
                await asyncio.to_thread(real_api.add_node, node, labels={LABEL: "h100"})
                await until_label("h100")
                assert [(s.exists, s.labels.get(LABEL)) for s in seen] == [
                    (True, "a100-40gb"),
                    (True, "tesla-t4"),
                    (True, None),
                    (False, None),
                    (True, "h100"),
                ]
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    run(body)


GPU = "nvidia.com/gpu"
MIG_SMALL = "nvidia.com/mig-1g.5gb"
FAILING = "kubernetes api failing (unreachable or refusing); still serving, retrying"
SERVE_CONFIGS = {
    "default": "version: v1\nflags:\n  migStrategy: none\n",
    "a100-40gb": "version: v1\nflags:\n  migStrategy: mixed\n",
    "tesla-t4": "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n"
    "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
}


def gpus(count: int) -> Callable[[DeviceManager], bool]:
    return lambda m: m.is_registered(GPU) and len(m.devices(GPU)) == count


def mig_mixed(m: DeviceManager) -> bool:
    return m.is_registered(MIG_SMALL) and len(m.devices(MIG_SMALL)) == 16 and gpus(2)(m)


def test_serve_switches_config_by_a_real_label_change_once_the_charts_rbac_binds(
    real_api: RealAPI, node: str, chart_rbac: tuple[str, list[dict[str, Any]]]
) -> None:
    namespace, rbac = chart_rbac
    kubeconfig = real_api.account_kubeconfig(namespace, rbac)
    volume = ConfigMapVolume(SERVE_CONFIGS)
    env = {
        "KUBECONFIG": str(kubeconfig),
        "CONFIG_FILE_SRCDIR": volume.path,
        "NODE_NAME": node,
    }
    args = ("--simulate", "dgx-a100-mig", "--api-backoff-s", "0.05", "0.5")

    async def body() -> None:
        async with kubelet_with(new_dir(), *args, env=env) as (kubelet, serve):
            # Refused by the real authorizer: the refusal said, and (a first start, no choice
            # recorded) nothing served until the label is read.
            await serve.wait_log("waiting for the node's label before serving")
            line = await serve.wait_log(FAILING)
            assert 'cannot list resource "nodes"' in line["error"], line
            assert not kubelet.devices.is_registered(GPU)

            # The chart's ClusterRole and binding: the Node's label chooses.
            await asyncio.to_thread(real_api.apply, rbac)
            await kubelet.observer.wait_for(mig_mixed, WAIT_S, "the a100-40gb config")
            await serve.wait_log("kubernetes api answering again")

            # A real label change through the API: the watch sees it, re-served.
            await asyncio.to_thread(real_api.label_node, node, {LABEL: "tesla-t4"})
            await kubelet.observer.wait_for(gpus(32), WAIT_S, "4 replicas per GPU")
            assert "Traceback" not in serve.text()

    run(body)


def test_the_follower_goes_on_across_a_real_apiserver_restart(real_api: RealAPI, node: str) -> None:
    """kube-apiserver stopped and started again (etcd keeps the data): the watch breaks, the
    follower retries, and a label change made after the restart is seen."""

    async def body() -> None:
        async with client_of(real_api.admin_kubeconfig) as client:
            seen: list[NodeLabels] = []

            async def follow() -> None:
                async for state in follow_labels(client, node, backoff=FAST):
                    seen.append(state)

            async def until_label(value: str | None) -> None:
                async with asyncio.timeout(WAIT_S):
                    while not seen or seen[-1].labels.get(LABEL) != value:
                        await asyncio.sleep(0.02)

            task = asyncio.create_task(follow())
            try:
                await until_label("a100-40gb")
                outage = real_api.outage()
                await asyncio.to_thread(outage.__enter__)
                await asyncio.to_thread(outage.__exit__, None, None, None)
                await asyncio.to_thread(real_api.label_node, node, {LABEL: "tesla-t4"})
                await until_label("tesla-t4")
                assert [s.labels.get(LABEL) for s in seen] == ["a100-40gb", "tesla-t4"]
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    run(body)
