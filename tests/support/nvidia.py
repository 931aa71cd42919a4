"""NVIDIA's deployments as users have them, restated as fixtures (tests/fixtures/nvidia/): the
chart's default values of several releases, the static DaemonSet manifests, and DaemonSets
rendered by NVIDIA's chart."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia"
VALUES_VERSIONS = ("v0.18.2", "v0.20.0", "main")
"""NVIDIA's chart releases whose values files are restated (main: after v0.20.0)."""
NVIDIA_IMAGE = "nvcr.io/nvidia/k8s-device-plugin"
NVPLUGIN_IMAGE = "registry.example.com/nvplugin"


def values(version: str) -> dict[str, Any]:
    """NVIDIA's chart values of ``version``, as ``helm show values`` gives them (a fresh copy)."""
    loaded = yaml.safe_load((FIXTURES / f"values-{version}.yaml").read_text())
    assert isinstance(loaded, dict)
    return copy.deepcopy(loaded)


def with_nvplugin_image(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with image.repository pointing at nvplugin's image: the one change a user of
    NVIDIA's values file must make."""
    out = copy.deepcopy(data)
    out["image"]["repository"] = NVPLUGIN_IMAGE
    return out


def manifest(name: str) -> list[dict[str, Any]]:
    """The Kubernetes objects of the fixture manifest ``name``."""
    text = (FIXTURES / name).read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def daemonset(name: str) -> dict[str, Any]:
    (found,) = [o for o in manifest(name) if o["kind"] == "DaemonSet"]
    return found


def plugin_container(name: str) -> dict[str, Any]:
    """The device plugin's container of the DaemonSet in ``name`` (NVIDIA's image)."""
    containers = daemonset(name)["spec"]["template"]["spec"]["containers"]
    (found,) = [c for c in containers if c["name"] == "nvidia-device-plugin-ctr"]
    assert isinstance(found, dict)
    return found


def leaves(data: object, prefix: str = "") -> list[str]:
    """The key paths of ``data``'s leaves (an empty mapping is a leaf)."""
    if isinstance(data, dict) and data:
        out: list[str] = []
        for key, item in data.items():
            out.extend(leaves(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return [prefix]
