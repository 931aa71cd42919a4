"""CDI's schema and rules as nvplugin's validator restates them: each rule catches its breach."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nvplugin.cdi.validate import minimum_version, problems

GOOD: dict[str, Any] = {
    "cdiVersion": "0.5.0",
    "kind": "k8s.device-plugin.nvidia.com/gpu",
    "devices": [
        {
            "name": "0",
            "containerEdits": {
                "deviceNodes": [
                    {
                        "path": "/dev/nvidia0",
                        "hostPath": "/dev/nvidia0",
                        "type": "c",
                        "major": 195,
                        "minor": 0,
                        "permissions": "rw",
                    }
                ]
            },
        }
    ],
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "mounts": [{"hostPath": "/usr/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi"}],
        "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook"}],
    },
}


def changed(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GOOD)
    node: Any = spec
    *parents, leaf = path.split(".")
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is None:
        del node[leaf]
    else:
        node[leaf] = value
    return spec


def test_the_good_spec_is_valid() -> None:
    assert problems(GOOD) == []


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        ("kind", "nvidia.com", "is not a CDI kind"),
        ("kind", "-nvidia.com/gpu", "is not a CDI kind"),
        ("kind", "nvidia.com/g.pu", "is not a CDI kind"),
        ("devices.0.name", "GPU 0", "cannot name a CDI device"),
        ("devices.0.name", "gpu-", "cannot name a CDI device"),
        ("devices.0.containerEdits", {}, "edits cannot be empty"),
        ("devices.0.containerEdits.deviceNodes.0.major", None, "needs both major and minor"),
        ("devices.0.containerEdits.deviceNodes.0.minor", -1, "non-negative integer"),
        ("devices.0.containerEdits.deviceNodes.0.type", "x", "is not one of"),
        ("devices.0.containerEdits.deviceNodes.0.permissions", "rwx", "are not of r, w, m"),
        ("devices.0.containerEdits.deviceNodes.0.path", "dev/nvidia0", "absolute path"),
        ("containerEdits.hooks.0.hookName", "preStart", "is not one of"),
        ("containerEdits.mounts.0.containerPath", None, "'containerPath' is required"),
        ("containerEdits.env", ["NVIDIA_VISIBLE_DEVICES"], "is not KEY=VALUE"),
        ("cdiVersion", "0.4.0", "lower than the 0.5.0 its fields need"),
        ("cdiVersion", "0.9.9", "is not a released CDI version"),
        ("devices.0.extra", 1, "unknown field 'extra'"),
        ("devices", None, "'devices' is required"),
    ],
)
def test_each_rule_catches_its_breach(path: str, value: Any, says: str) -> None:
    found = problems(changed(path, value))
    assert any(says in problem for problem in found), found


def test_two_devices_of_one_name_are_refused() -> None:
    spec = copy.deepcopy(GOOD)
    spec["devices"].append(copy.deepcopy(spec["devices"][0]))
    assert any("named twice" in p for p in problems(spec))


@pytest.mark.parametrize(
    ("path", "value", "version"),
    [
        ("devices.0.name", "gpu0", "0.5.0"),  # the node's hostPath still needs 0.5.0
        ("devices.0.containerEdits.deviceNodes.0.hostPath", None, "0.5.0"),  # name "0"
        ("containerEdits.mounts.0.type", "bind", "0.5.0"),
        ("annotations", {"a": "b"}, "0.6.0"),
        ("containerEdits.additionalGids", [44], "0.7.0"),
    ],
)
def test_the_minimum_version_follows_the_fields_used(path: str, value: Any, version: str) -> None:
    assert minimum_version(changed(path, value)) == version


def test_the_oldest_versions_without_newer_fields() -> None:
    spec = changed("devices.0.name", "gpu0")
    del spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"]
    assert minimum_version(spec) == "0.3.0"
    spec["containerEdits"]["mounts"][0]["type"] = "bind"
    assert minimum_version(spec) == "0.4.0"
