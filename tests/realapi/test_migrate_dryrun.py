"""``nvplugin migrate``'s output, applied as printed: what it makes of NVIDIA's chart output with
per-node configs, GFD and MPS (tests/fixtures/nvidia/), sent to a real kube-apiserver with
server-side dry-run, so a field or value the API refuses fails here (tests/e2e checks the same
objects against the published OpenAPI schemas and runs the printed plugin container)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.realapi import RealAPI, RealAPIError

FIXTURE = (
    Path(__file__).parents[1] / "fixtures" / "nvidia" / "chart-v0.20.0-config-map-gfd-mps.yaml"
)


def test_the_server_accepts_every_object_migrate_prints(real_api: RealAPI) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nvplugin", "migrate", "--daemonset", "-"],
        input=FIXTURE.read_text(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert sorted(o["kind"] for o in objects) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "ServiceAccount",
    ]
    namespace = real_api.namespace("migrated")
    refused = []
    for obj in objects:
        if obj["metadata"].get("namespace"):
            obj["metadata"]["namespace"] = namespace
        try:
            (applied,) = real_api.apply(obj, dry_run=True)
        except RealAPIError as exc:
            refused.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc}")
            continue
        assert applied["kind"] == obj["kind"]
    assert refused == []
