"""The chart with ``topology.publish``: the plugin gets the setting, its node's name, the kubelet's
pod resources directory read-only (and the kubelet's config file, when named), and exactly the
NRT grants -- create/get/update/patch of noderesourcetopologies and get of Nodes; off by
default, with nothing of it."""

from __future__ import annotations

import os

from nvplugin.config.model import DEFAULT_POD_RESOURCES_SOCKET
from tests.support.helm import NAMESPACE, render

NRT_RULES = [
    {
        "apiGroups": ["topology.node.k8s.io"],
        "resources": ["noderesourcetopologies"],
        "verbs": ["create", "get", "update", "patch"],
    },
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
]


def test_publishing_gets_its_mounts_and_least_privilege() -> None:
    rendered = render(
        {
            "topology": {
                "publish": True,
                "kubeletConfig": "/var/lib/kubelet/config.yaml",
                "cpuManagerPolicy": "static",
            }
        }
    )
    assert rendered.kinds() == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "ServiceAccount",
    ]
    assert rendered.one("ClusterRole")["rules"] == NRT_RULES
    binding = rendered.one("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == rendered.one("ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nvplugin", "namespace": NAMESPACE}
    ]
    assert rendered.env["NVPLUGIN_TOPOLOGY_PUBLISH"] == "true"
    assert rendered.env["NVPLUGIN_KUBELET_CONFIG"] == "/var/lib/kubelet/config.yaml"
    assert rendered.env["NVPLUGIN_CPU_MANAGER_POLICY"] == "static"
    assert rendered.env_fields == {"NODE_NAME": "spec.nodeName"}
    assert "NVPLUGIN_POD_RESOURCES_SOCKET" not in rendered.env  # the plugin's default
    mounts = {m["name"]: m for m in rendered.container["volumeMounts"]}
    volumes = {v["name"]: v for v in rendered.pod["volumes"]}
    assert mounts["pod-resources"]["mountPath"] == os.path.dirname(DEFAULT_POD_RESOURCES_SOCKET)
    assert mounts["pod-resources"]["readOnly"] is True
    assert volumes["pod-resources"]["hostPath"] == {
        "path": "/var/lib/kubelet/pod-resources",
        "type": "Directory",
    }
    assert mounts["kubelet-config"]["readOnly"] is True
    assert volumes["kubelet-config"]["hostPath"]["type"] == "File"
    assert rendered.pod["automountServiceAccountToken"] is True
    assert "kubectl get crd noderesourcetopologies.topology.node.k8s.io" in rendered.notes


def test_volcano_adds_numatopologies_only_with_publish() -> None:
    rendered = render({"topology": {"publish": True, "volcano": True}})
    assert rendered.env["NVPLUGIN_TOPOLOGY_VOLCANO"] == "true"
    assert rendered.one("ClusterRole")["rules"] == [
        *NRT_RULES[:1],
        {
            "apiGroups": ["nodeinfo.volcano.sh"],
            "resources": ["numatopologies"],
            "verbs": ["create", "get", "update", "patch"],
        },
        NRT_RULES[1],
    ]
    alone = render({"topology": {"volcano": True}})
    assert alone.kinds() == ["DaemonSet"] and "NVPLUGIN_TOPOLOGY_VOLCANO" not in alone.env


def test_another_kubelet_root() -> None:
    socket = "/data/kubelet/pod-resources/kubelet.sock"
    rendered = render({"topology": {"publish": True, "podResourcesSocket": socket}})
    assert rendered.env["NVPLUGIN_POD_RESOURCES_SOCKET"] == socket
    volumes = {v["name"]: v for v in rendered.pod["volumes"]}
    assert volumes["pod-resources"]["hostPath"]["path"] == "/data/kubelet/pod-resources"


def test_off_by_default() -> None:
    rendered = render()
    assert "ClusterRole" not in rendered.kinds()
    assert "NVPLUGIN_TOPOLOGY_PUBLISH" not in rendered.env
    assert all(v["name"] != "pod-resources" for v in rendered.pod["volumes"])
    assert "noderesourcetopologies" not in rendered.notes
