"""The chart's scheduler extender (schedulerExtender.enabled): the extender's Deployment,
Service and least-privilege RBAC, and the second scheduler profile whose
KubeSchedulerConfiguration calls it."""

from __future__ import annotations

from typing import Any

import yaml

from tests.support.helm import NAMESPACE, Rendered, render

READ = (("topology.node.k8s.io", "noderesourcetopologies"), ("", "nodes"), ("", "pods"))


def objects(rendered: Rendered, kind: str) -> list[dict[str, Any]]:
    return [o for o in rendered.objects if o["kind"] == kind]


def test_off_by_default_renders_nothing_of_it() -> None:
    rendered = render({})
    assert not [o for o in rendered.objects if "scheduler" in o["metadata"]["name"]]


def test_the_extender_reads_nrts_nodes_and_pods_and_nothing_else() -> None:
    rendered = render({"schedulerExtender": {"enabled": True}})
    roles = [
        r for r in objects(rendered, "ClusterRole") if r["metadata"]["name"].endswith("extender")
    ]
    assert len(roles) == 1
    granted = {
        (group, resource, verb)
        for rule in roles[0]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        (g, r, v)
        for g, r in (
            ("topology.node.k8s.io", "noderesourcetopologies"),
            ("", "nodes"),
            ("", "pods"),
        )
        for v in ("get", "list", "watch")
    }
    deployments = {d["metadata"]["name"]: d for d in objects(rendered, "Deployment")}
    extender = deployments["nvplugin-scheduler-extender"]["spec"]["template"]["spec"]
    container = extender["containers"][0]
    assert container["command"] == ["nvplugin", "scheduler-extender"]
    assert "--listen=0.0.0.0:8888" in container["args"]
    service = objects(rendered, "Service")[0]
    assert service["spec"]["ports"][0]["port"] == 8888


def test_the_second_scheduler_calls_the_extender_for_gpu_pods() -> None:
    rendered = render(
        {"schedulerExtender": {"enabled": True, "managedResources": ["nvidia.com/gpu",
                                                                     "nvidia.com/mig-1g.5gb"]}}
    )  # fmt: skip
    config_map = next(c for c in objects(rendered, "ConfigMap") if "config.yaml" in c["data"])
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["profiles"] == [{"schedulerName": "nvplugin-scheduler"}]
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == f"http://nvplugin-scheduler-extender.{NAMESPACE}.svc:8888"
    assert extender["filterVerb"] == "filter" and extender["prioritizeVerb"] == "prioritize"
    assert extender["nodeCacheCapable"] is True
    assert [m["name"] for m in extender["managedResources"]] == [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.5gb",
    ]
    deployments = {d["metadata"]["name"]: d for d in objects(rendered, "Deployment")}
    scheduler = deployments["nvplugin-scheduler"]["spec"]["template"]["spec"]
    assert scheduler["containers"][0]["image"].startswith("registry.k8s.io/kube-scheduler:")
    bound = {b["roleRef"]["name"] for b in objects(rendered, "ClusterRoleBinding")}
    assert {"system:kube-scheduler", "system:volume-scheduler"} <= bound


def test_without_the_second_scheduler_only_the_extender() -> None:
    rendered = render({"schedulerExtender": {"enabled": True, "scheduler": {"enabled": False}}})
    assert [d["metadata"]["name"] for d in objects(rendered, "Deployment")] == [
        "nvplugin-scheduler-extender"
    ]
