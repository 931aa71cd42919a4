"""``nvplugin serve`` publishing the node's labels as NFD's NodeFeature object, as GPU Feature
Discovery does with ``GFD_USE_NODE_FEATURE_API=true``: a real plugin beside the fake kubelet, a
real HTTP API server of the project's own (tests/support/kubeapi.py) reached through the client
library with the pod's ``NODE_NAME``, ``NAMESPACE``, ``POD_NAME`` and a kubeconfig: an API away
at start delays the object, never the serving; a per-node config switch changes it. Publishing it
owned by the pod, and a reload changing it, run on a real kube-apiserver with NFD's CRD and the
chart's RBAC (tests/realapi/test_nodefeature.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nvplugin.fakekubelet.kubelet import FakeKubelet
from tests.e2e.test_serve import run
from tests.support.configmap import ConfigMapVolume
from tests.support.kubeapi import KubeApiServer
from tests.support.labelcases import read_fixture
from tests.support.serve import Serve, new_dir, scrape
from tests.support.waiting import WAIT_S

GPU = "nvidia.com/gpu"
NODE = "gpu-node-1"
NAMESPACE = "gpu-system"
POD = "nvplugin-x7k2p"
OBJECT = (NAMESPACE, f"nvidia-features-for-{NODE}")
STAMP = "nvidia.com/gfd.timestamp"
FAILING = "kubernetes api failing (unreachable or refusing); still serving, retrying"


def _env(api: KubeApiServer, **extra: str) -> dict[str, str]:
    return {
        "GFD_USE_NODE_FEATURE_API": "true",
        "KUBECONFIG": api.kubeconfig(),
        "NODE_NAME": NODE,
        "NAMESPACE": NAMESPACE,
        "POD_NAME": POD,
        **extra,
    }


def _labels(api: KubeApiServer) -> dict[str, str]:
    """The object's labels without the timestamp ({} while there is no object)."""
    found = api.nodefeatures.get(OBJECT)
    labels = dict(found["spec"]["labels"]) if found else {}
    labels.pop(STAMP, None)
    return labels


async def _until(
    api: KubeApiServer, serve: Serve, holds: Callable[[dict[str, str]], bool], what: str
) -> dict[str, Any]:
    """The object once ``holds`` accepts its labels (without the timestamp)."""
    try:
        await api.wait_for(lambda: holds(_labels(api)))
    except TimeoutError:
        raise AssertionError(
            f"the NodeFeature object never {what}: {_labels(api)}\n{serve.log_tail(30)}"
        ) from None
    return api.nodefeatures[OBJECT]


def test_an_api_away_at_start_delays_the_object_not_the_serving() -> None:
    async def body() -> None:
        async with KubeApiServer() as api:
            api.add_pod(NAMESPACE, POD)
            env = _env(api, NVPLUGIN_METRICS_ADDRESS="127.0.0.1:0")
            await api.down()
            directory = new_dir()
            async with FakeKubelet(directory) as kubelet:
                args = ("--simulate", "dgx-a100", "--api-backoff-s", "0.05", "0.5")
                serve = Serve(directory, *args, env=env)
                try:
                    await kubelet.wait_registered(GPU, WAIT_S)  # serving, API or not
                    # The publisher's own failure (the cordon follows the Node too, and says
                    # the same of its own requests).
                    await serve.wait_log(
                        FAILING, where=lambda line: line.get("logger") == "nvplugin.labels"
                    )
                    assert OBJECT not in api.nodefeatures
                    await api.up()
                    await _until(api, serve, lambda now: now == read_fixture("dgx-a100"), "came")
                    await serve.wait_log("kubernetes api answering again")
                    metrics = await scrape(serve)
                    failures = [
                        line
                        for line in metrics.splitlines()
                        if line.startswith("nvplugin_node_feature_failures_total ")
                    ]
                    assert failures and float(failures[0].split()[1]) >= 1, metrics
                    assert 'nvplugin_node_feature_writes_total{result="created"} 1.0' in metrics
                finally:
                    assert serve.stop() == 0, serve.text()

    run(body)


def test_a_per_node_config_switch_changes_the_object() -> None:
    async def body() -> None:
        label = "nvidia.com/device-plugin.config"
        shared = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        shared += "    - name: nvidia.com/gpu\n      replicas: 4\n"
        volume = ConfigMapVolume({"default": "version: v1\n", "shared": shared})
        async with KubeApiServer() as api:
            api.add_node(NODE, {})
            api.add_pod(NAMESPACE, POD)
            env = _env(api, CONFIG_FILE_SRCDIR=volume.path)
            directory = new_dir()
            async with FakeKubelet(directory) as kubelet:
                args = ("--simulate", "dgx-a100", "--api-backoff-s", "0.05", "0.5")
                serve = Serve(directory, *args, env=env)
                try:
                    await kubelet.wait_registered(GPU, WAIT_S)
                    await _until(
                        api, serve, lambda now: now == read_fixture("dgx-a100"), "held the labels"
                    )
                    api.label(NODE, label, "shared")
                    await _until(
                        api,
                        serve,
                        lambda now: now == read_fixture("dgx-a100.time-sliced"),
                        "followed the node's config",
                    )
                finally:
                    assert serve.stop() == 0, serve.text()

    run(body)


def test_a_missing_pod_is_said_as_such_and_a_bad_node_name_is_refused() -> None:
    """Before: POD_NAME naming no pod stopped publishing with "kubernetes api
    failing"; NODE_NAME went into the object's URL unescaped. The first is said as what it is
    (and publishing starts once the pod is there); the second is refused, naming the variable."""

    async def body() -> None:
        async with KubeApiServer() as api:
            directory = new_dir()
            async with FakeKubelet(directory) as kubelet:
                args = ("--simulate", "dgx-a100", "--api-backoff-s", "0.05", "0.5")
                serve = Serve(directory, *args, env=_env(api))
                try:
                    await kubelet.wait_registered(GPU, WAIT_S)
                    line = await serve.wait_log("cannot publish the NodeFeature object")
                    assert f"POD_NAME {POD}: no such pod" in line["reason"]
                    assert serve.events(FAILING) == []
                    api.add_pod(NAMESPACE, POD)
                    await _until(api, serve, lambda now: now == read_fixture("dgx-a100"), "came")
                    assert len(serve.events("cannot publish the NodeFeature object")) == 1
                finally:
                    assert serve.stop() == 0, serve.text()
                bad = Serve(directory, *args, env=_env(api, NODE_NAME="bad/node?name=x"))
                try:
                    line = await bad.wait_log("cannot publish the NodeFeature object")
                    assert "NODE_NAME 'bad/node?name=x' is not a Kubernetes object name" in str(
                        line["reason"]
                    )
                    assert not [r for r in api.requests if "bad/node" in r.path]
                finally:
                    assert bad.stop() == 0, bad.text()

    run(body)
