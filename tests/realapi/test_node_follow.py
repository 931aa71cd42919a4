"""The plugin's own Node, followed on a real kube-apiserver (tests/support/realapi.py) with the
token of the chart's ServiceAccount: refused by the real RBAC authorizer until the chart's
rendered ClusterRole and ClusterRoleBinding are applied, then every label change seen."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient

from nvplugin.backoff import Backoff
from nvplugin.kube import ApiAccess
from nvplugin.kube.client import open_client
from nvplugin.kube.node import NodeLabels, follow_labels, get_node
from tests.support.helm import render
from tests.support.realapi import RealAPI
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
    """A namespace and the RBAC objects the chart renders into it for per-node configs (not yet
    applied; the cluster-scoped ones are removed after)."""
    namespace = real_api.namespace("follow")
    rendered = render({"config": {"map": CONFIGS}}, name="nvplugin", namespace=namespace)
    rbac = [
        o
        for o in rendered.objects
        if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    assert len(rbac) == 3, rendered.kinds()
    yield namespace, rbac
    for obj in rbac:
        real_api.delete(obj)


@contextlib.asynccontextmanager
async def client_of(kubeconfig: Path) -> AsyncIterator[AsyncClient]:
    client = await asyncio.to_thread(open_client, ApiAccess(kubeconfig=str(kubeconfig)))
    try:
        yield client
    finally:
        await client.close()


def test_the_charts_service_account_is_refused_until_its_rbac_then_follows_the_label(
    real_api: RealAPI, node: str, chart_rbac: tuple[str, list[dict[str, Any]]]
) -> None:
    namespace, rbac = chart_rbac
    (account,) = [o for o in rbac if o["kind"] == "ServiceAccount"]
    real_api.apply(account)
    kubeconfig = real_api.service_account_kubeconfig(namespace, account["metadata"]["name"])

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
                await asyncio.to_thread(real_api.label_node, node, {LABEL: "tesla-t4"})
                await until_label("tesla-t4")
                await asyncio.to_thread(real_api.label_node, node, {LABEL: None})
                await until_label(None)
                assert seen[-1].exists
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    run(body)
