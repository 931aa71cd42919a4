"""Render the chart with real Helm (the Go SDK via ``helm-python-sdk``), as ``helm install`` would.

``Chart.render`` runs what an install runs offline: values coalesced with values.yaml, checked
against values.schema.json, then every template rendered. Errors come back as the messages a user
would see from ``helm install`` / ``helm template``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "nvplugin"
RELEASE = "nvplugin"
NAMESPACE = "kube-system"


@dataclass(frozen=True)
class Rendered:
    """One render: the manifests by template path, and every Kubernetes object in them."""

    manifests: dict[str, str]
    objects: list[dict[str, Any]] = field(default_factory=list)

    def one(self, kind: str) -> dict[str, Any]:
        found = [o for o in self.objects if o["kind"] == kind]
        assert len(found) == 1, f"expected one {kind}, got {len(found)}"
        return found[0]

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)

    @property
    def daemonset(self) -> dict[str, Any]:
        return self.one("DaemonSet")

    @property
    def pod(self) -> dict[str, Any]:
        pod: dict[str, Any] = self.daemonset["spec"]["template"]["spec"]
        return pod

    @property
    def container(self) -> dict[str, Any]:
        containers = self.pod["containers"]
        assert len(containers) == 1
        container: dict[str, Any] = containers[0]
        return container

    @property
    def env(self) -> dict[str, str]:
        """The container's environment variables with a value (not those from a field)."""
        return {e["name"]: e["value"] for e in self.container.get("env") or [] if "value" in e}

    @property
    def env_fields(self) -> dict[str, str]:
        """The container's environment variables taken from a pod field: name -> field path."""
        return {
            e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
            for e in self.container.get("env") or []
            if "valueFrom" in e
        }

    @property
    def notes(self) -> str:
        return self.manifests[f"{CHART_DIR.name}/templates/NOTES.txt"]


def render(
    values: dict[str, Any] | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    chart_dir: Path = CHART_DIR,
) -> Rendered:
    """``chart_dir``: another copy of the chart (a test that takes its schema away)."""
    with helm.Chart.load(str(chart_dir)) as chart:
        manifests = chart.render(
            copy.deepcopy(values) if values is not None else None,
            name=name,
            namespace=namespace,
            is_install=True,
        )
    objects: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if not path.endswith(".yaml"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return Rendered(manifests, objects)


def render_error(values: dict[str, Any]) -> str:
    """The message rendering fails with (the test fails if it renders)."""
    try:
        render(values)
    except helm.HelmError as exc:
        return str(exc)
    raise AssertionError(f"rendering succeeded with values {values!r}")
