"""``nvplugin migrate`` on NVIDIA's deployments as users have them: every change listed by key
path, its values render with real Helm, and it refuses exactly what nvplugin's chart refuses
(both read the same declarations)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvplugin.migrate import Migration, Status
from nvplugin.migrate.daemonset import migrate_daemonset
from nvplugin.migrate.findings import to_text
from nvplugin.migrate.values import migrate_values
from tests.support.helm import render, render_error
from tests.support.nvidia import (
    FIXTURES,
    NVIDIA_IMAGE,
    NVPLUGIN_IMAGE,
    VALUES_VERSIONS,
    values,
)


def _values(data: dict[str, Any]) -> Migration:
    return migrate_values(yaml.safe_dump(data, sort_keys=False), "values.yaml", NVPLUGIN_IMAGE)


def _by_status(migration: Migration) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for finding in migration.findings:
        out.setdefault(finding.status.value, []).append(finding.key)
    return out


@pytest.mark.parametrize("version", VALUES_VERSIONS)
def test_nvidias_values_file_lists_every_change_and_renders(version: str) -> None:
    migration = _values(values(version))
    found = _by_status(migration)
    assert found["changed"] == ["values.image.repository"]
    assert found["dropped"][:2] == ["values.gfd", "values.nfd"]
    assert set(found["dropped"][2:]) <= {"values.mps.enableHostPID", "values.mps.enableHostNetwork"}
    assert "refused" not in found and "unknown" not in found
    assert {"values.securityContext", "values.resources", "values.image.tag"} <= set(
        found["differs"]
    )
    out = migration.output
    assert out["image"]["repository"] == NVPLUGIN_IMAGE
    assert not {"gfd", "nfd", "cdi"} & set(out)  # NVIDIA's defaults: nothing to say
    assert out.get("mps", {}).get("root", "/run/nvidia/mps") == "/run/nvidia/mps"  # mps.root kept
    rendered = render(out)
    assert rendered.container["image"] == f"{NVPLUGIN_IMAGE}:0.1.0"


def _cannot(version: str) -> dict[str, Any]:
    data = values(version)
    data["gfd"]["enabled"] = True  # honoured: kept
    data["gfd"]["nameOverride"] = "gfd"
    data["nfd"]["worker"]["config"]["sources"]["pci"]["deviceClassWhitelist"] = ["03"]
    data["mps"]["enableHostNetwork"] = True
    data["gdsEnabled"] = True
    data["deviceDiscoveryStrategy"] = "tegra"
    data["cdi"]["featureFlags"] = "disable-nvsandboxutils"
    data["migStrategy"] = "mixed"  # fine: kept
    return data


@pytest.mark.parametrize("version", VALUES_VERSIONS)
def test_it_refuses_exactly_what_the_chart_refuses(version: str) -> None:
    data = _cannot(version)
    migration = _values(data)
    refused = sorted(f.key.removeprefix("values.") for f in migration.refused)
    error = render_error(data)  # NVIDIA's image too, which migrate changes instead
    listed = sorted(re.findall(r"^  - values\.([A-Za-z0-9_.]+):", error, re.M))
    assert listed == sorted([*refused, "image.repository"])
    assert migration.output["migStrategy"] == "mixed"
    assert migration.output["gfd"] == {"enabled": True}
    render(migration.output)  # what is left renders


def test_a_config_file_the_plugin_would_refuse_is_named() -> None:
    data = values("v0.20.0")
    data["config"]["map"] = {
        "default": "version: v1\nflags:\n  migStrategy: none\n",
        "a100": "version: v1\nimex:\n  channelIDs: [1]\n",
    }
    migration = _values(data)
    (refused,) = migration.refused
    assert refused.key == "values.config.map.a100"
    assert refused.message.startswith('key "imex.channelIDs": nvplugin does not support IMEX')


def test_values_nvidia_never_had_are_kept_and_said() -> None:
    migration = _values({"legacyDaemonsetAPI": False, "image": {"repository": NVIDIA_IMAGE}})
    assert _by_status(migration)["unknown"] == ["values.legacyDaemonsetAPI"]
    assert migration.output["legacyDaemonsetAPI"] is False


# --- DaemonSets ---------------------------------------------------------------------------------


def _daemonset(name: str, change: Any = None) -> Migration:
    docs = list(yaml.safe_load_all((FIXTURES / name).read_text()))
    if change is not None:
        change(docs[0]["spec"]["template"]["spec"]["containers"][0])
    return migrate_daemonset(yaml.safe_dump_all(docs), name, NVPLUGIN_IMAGE)


@pytest.mark.parametrize(
    "name",
    [
        "static-nvidia-device-plugin-v0.17.1.yml",
        "static-compat-with-cpumanager-v0.20.1.yml",
        "chart-v0.20.0-defaults.yaml",
        "chart-v0.20.0-mig-mixed.yaml",
    ],
)
def test_nvidias_daemonsets_need_only_the_image(name: str) -> None:
    migration = _daemonset(name)
    ((key, status),) = [(f.key, f.status) for f in migration.findings]
    assert status is Status.CHANGED and key.endswith("containers[nvidia-device-plugin-ctr].image")
    (daemonset,) = migration.output
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{NVPLUGIN_IMAGE}:0.1.0"


def test_what_stops_a_daemonset_is_named_by_its_key() -> None:
    def change(container: dict[str, Any]) -> None:
        container["env"] += [
            {"name": "GDS_ENABLED", "value": "true"},
            {"name": "NODE_NAME", "value": "gpu-1"},  # read by the plugin (per-node configs)
            {"name": "GPU_OPERATOR_VERSION", "value": "v25.3.0"},
            {"name": "DP_DISABLE_HEALTHCHECKS", "value": "all"},
            {"name": "DP_ENABLE_HEALTHCHECKS", "value": "48"},
        ]
        container["args"] = ["-mig-strategy=split", "--device-id-strategy", "index", "--gpus"]
        container["securityContext"]["runAsUser"] = 10001

    migration = _daemonset("chart-v0.20.0-defaults.yaml", change)
    prefix = "DaemonSet nvidia-device-plugin/nvdp-nvidia-device-plugin: "
    found = {(f.status.value, f.key.removeprefix(prefix)): f for f in migration.findings}
    ctr = "containers[nvidia-device-plugin-ctr]"
    assert set(found) == {
        ("changed", f"{ctr}.image"),
        ("refused", f"{ctr}.env.GDS_ENABLED"),
        ("unknown", f"{ctr}.env.GPU_OPERATOR_VERSION"),
        ("refused", f"{ctr}.args"),
        ("refused", f"{ctr}.securityContext.runAsUser"),
    }
    assert (
        "environment variable GDS_ENABLED" in found[("refused", f"{ctr}.env.GDS_ENABLED")].message
    )
    args = [f for f in migration.refused if f.key.endswith(".args")]
    assert sorted(str(f.value) for f in args) == ["--gpus", "-mig-strategy=split"]


def test_nvidias_programs_without_the_plugin_beside_them_are_refused() -> None:
    """A pod of NVIDIA's image running GFD or the MPS daemon beside the plugin, or the config
    manager alone: nothing to hand their work to in that pod; named, with what to do."""
    docs = list(yaml.safe_load_all((FIXTURES / "chart-v0.20.0-defaults.yaml").read_text()))
    pod = docs[0]["spec"]["template"]["spec"]
    image = pod["containers"][0]["image"]
    pod["containers"].append({"name": "gfd", "image": image, "command": ["gpu-feature-discovery"]})
    pod["containers"].append({"name": "mps", "image": image, "command": ["mps-control-daemon"]})
    lone = copy.deepcopy(docs[0])
    lone["metadata"]["name"] = "lone"
    lone["spec"]["template"]["spec"]["containers"] = [
        {"name": "cm", "image": image, "command": ["config-manager"]}
    ]
    migration = migrate_daemonset(yaml.safe_dump_all([*docs, lone]), "ds.yaml", NVPLUGIN_IMAGE)
    refused = {f.key.split(": ", 1)[1]: f.message for f in migration.refused}
    assert sorted(refused) == [
        "containers[cm].command",
        "containers[gfd].command",
        "containers[mps].command",
    ]
    assert "writes GFD's labels itself" in refused["containers[gfd].command"]
    assert "runs the MPS control daemons itself" in refused["containers[mps].command"]
    assert "follows the node's label itself" in refused["containers[cm].command"]


PER_NODE = "chart-v0.20.0-config-map-gfd-mps.yaml"


def test_nvidias_per_node_gfd_mps_chart_output_translates_naming_each_change() -> None:
    migration = migrate_daemonset((FIXTURES / PER_NODE).read_text(), PER_NODE, NVPLUGIN_IMAGE)
    assert migration.refused == []
    prefix = "DaemonSet nvidia-device-plugin/nvdp-nvidia-device-plugin"
    found = {(f.status.value, f.key.removeprefix(prefix)) for f in migration.findings}
    ctr = ": containers[nvidia-device-plugin-ctr]"
    assert {
        ("dropped", "-mps-control-daemon"),
        ("dropped", "-gpu-feature-discovery"),
        ("differs", "-gpu-feature-discovery"),  # NVIDIA's chart also deployed NFD
        ("dropped", ": initContainers[nvidia-device-plugin-init]"),
        ("dropped", ": containers[nvidia-device-plugin-sidecar]"),
        ("dropped", ": shareProcessNamespace"),
        ("dropped", f"{ctr}.env.CONFIG_FILE"),
        ("changed", f"{ctr}.env.CONFIG_FILE_SRCDIR"),
        ("changed", f"{ctr}.env.FALLBACK_STRATEGIES"),
        ("changed", f"{ctr}.env.NODE_NAME"),
        ("changed", f"{ctr}.env.GFD_OUTPUT_FILE"),
        ("changed", f"{ctr}.volumeMounts[output-dir]"),
        ("changed", ": volumes[output-dir]"),
        ("dropped", f"{ctr}.volumeMounts[config]"),
        ("dropped", ": volumes[config]"),
        ("changed", ": initContainers[mps-shm]"),
        ("changed", f"{ctr}.securityContext.privileged"),
        ("changed", f"{ctr}.volumeMounts[mps-root].mountPropagation"),
        ("changed", f"{ctr}.image"),
    } == found
    daemonsets = [o for o in migration.output if o["kind"] == "DaemonSet"]
    (daemonset,) = daemonsets
    pod = daemonset["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["mps-shm"]
    assert pod["initContainers"][0]["image"] == f"{NVPLUGIN_IMAGE}:0.1.0"
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CONFIG_FILE_SRCDIR"] == "/available-configs"
    assert env["FALLBACK_STRATEGIES"] == "named,single"
    assert "DEFAULT_CONFIG" not in env and "CONFIG_FILE" not in env  # NVIDIA's was empty
    assert container["securityContext"] == {"privileged": True}
    assert {v["name"] for v in pod["volumes"]} == {
        "kubelet-device-plugins-dir",
        "mps-root",
        "mps-shm",
        "cdi-root",
        "available-configs",
        "output-dir",
    }


def test_a_default_config_and_label_of_the_config_manager_reach_the_plugin() -> None:
    text = (FIXTURES / PER_NODE).read_text()
    text = text.replace('"nvidia.com/device-plugin.config"', '"example.com/gpu-config"')
    text = text.replace(
        "- name: DEFAULT_CONFIG\n          value:\n",
        "- name: DEFAULT_CONFIG\n          value: tesla-t4\n",
    )
    migration = migrate_daemonset(text, PER_NODE, NVPLUGIN_IMAGE)
    (daemonset,) = [o for o in migration.output if o["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DEFAULT_CONFIG"] == "tesla-t4" and env["NODE_LABEL"] == "example.com/gpu-config"


def test_a_config_of_the_configmap_the_plugin_would_refuse_is_named() -> None:
    text = (FIXTURES / PER_NODE).read_text().replace("replicas: 4", "replicas: 0")
    migration = migrate_daemonset(text, PER_NODE, NVPLUGIN_IMAGE)
    (refused,) = migration.refused
    assert refused.key == "ConfigMap nvdp-nvidia-device-plugin-configs: data.tesla-t4"
    assert "replicas" in refused.message


def test_without_mps_in_the_configs_the_plugin_stays_unprivileged() -> None:
    docs = list(yaml.safe_load_all((FIXTURES / PER_NODE).read_text()))
    del docs[0]["data"]["mps-2"]
    migration = migrate_daemonset(yaml.safe_dump_all(docs), PER_NODE, NVPLUGIN_IMAGE)
    (daemonset,) = [o for o in migration.output if o["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert pod["containers"][0]["securityContext"] == {"capabilities": {"add": ["SYS_ADMIN"]}}


# --- the command ---------------------------------------------------------------------------------


def _migrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", "migrate", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.process
def test_the_command_prints_installable_values_and_exits_by_what_it_found() -> None:
    fixture = str(FIXTURES / "values-v0.18.2.yaml")
    done = _migrate("--values", fixture, "--image-repository", NVPLUGIN_IMAGE)
    assert done.returncode == 0, done.stderr
    header = " ".join(
        line.removeprefix("# ") for line in done.stdout.splitlines() if line.startswith("# ")
    )  # the title is wrapped at 96 columns, wherever the fixture's path makes it break
    assert header.startswith(f"nvplugin migrate: NVIDIA's chart values {fixture} -> ")
    assert "# changed  values.image.repository" in done.stdout
    assert yaml.safe_load(done.stdout)["image"]["repository"] == NVPLUGIN_IMAGE
    both = _migrate(
        "--values",
        fixture,
        "--daemonset",
        str(FIXTURES / "chart-v0.20.0-defaults.yaml"),
        "--output",
        "json",
    )
    assert both.returncode == 0, both.stderr
    data = json.loads(both.stdout)
    assert set(data) == {"values", "daemonset"}
    assert data["values"]["output"]["image"]["repository"] == "nvplugin"
    work = Path(tempfile.mkdtemp())
    try:
        bad = copy.deepcopy(values("v0.18.2"))
        bad["gfd"]["nameOverride"] = "gfd"
        (work / "bad.yaml").write_text(yaml.safe_dump(bad))
        refused = _migrate("--values", str(work / "bad.yaml"))
        assert refused.returncode == 2
        assert '# refused  values.gfd.nameOverride "gfd":' in refused.stdout
        assert refused.stderr.startswith("error: 1 key(s) nvplugin cannot use")
        nothing = _migrate()
        assert nothing.returncode == 2 and "give --values FILE, --daemonset FILE" in nothing.stderr
    finally:
        for path in work.iterdir():
            path.unlink()
        work.rmdir()


def test_flags_as_args_without_a_command_get_nvidias_command() -> None:
    """NVIDIA's manifests before v0.12 passed flags as args to the image's entrypoint
    (nvidia-device-plugin); nvplugin's entrypoint is nvplugin, so the command is named."""

    def change(container: dict[str, Any]) -> None:
        container["args"] = ["--fail-on-init-error=false"]
        del container["env"]

    migration = _daemonset("static-nvidia-device-plugin-v0.17.1.yml", change)
    changed = {f.key.rsplit(".", 1)[1] for f in migration.findings if f.status is Status.CHANGED}
    assert changed == {"image", "command"} and migration.refused == []
    (container,) = migration.output[0]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["nvidia-device-plugin"]
    assert container["args"] == ["--fail-on-init-error=false"]


def test_a_long_hyphenated_path_stays_whole_in_the_title() -> None:
    # A checkout under a hyphenated directory: the title names the file on one line, whole.
    source = "/srv/" + "-".join(["a-rather-long-directory-name"] * 4) + "/values.yaml"
    text = to_text([migrate_values("{}", source)])
    header = [line for line in text.splitlines() if line.startswith("# ")]
    assert any(source in line for line in header), header


def test_cdi_disable_hooks_is_refused_by_name_not_kept_as_unknown() -> None:
    def change(container: dict[str, Any]) -> None:
        container["env"] += [{"name": "CDI_DISABLE_HOOKS", "value": "true"}]
        container["args"] = ["--cdi-disable-hooks"]

    migration = _daemonset("chart-v0.20.0-defaults.yaml", change)
    refused = {
        f.key.rsplit(".", 1)[-1] if ".env." in f.key else "args": f for f in migration.refused
    }
    assert set(refused) == {"CDI_DISABLE_HOOKS", "args"}
    assert "environment variable CDI_DISABLE_HOOKS='true'" in refused["CDI_DISABLE_HOOKS"].message
    assert refused["args"].value == "--cdi-disable-hooks"
    assert "does not support generating CDI specs yet" in refused["args"].message
    assert not [f for f in migration.findings if f.status is Status.UNKNOWN]


def test_gfd_enabled_says_nvidias_chart_also_deployed_nfd() -> None:
    data = values("v0.20.0")
    data["gfd"]["enabled"] = True
    migration = _values(data)
    (note,) = [f for f in migration.findings if f.key == "values.gfd.enabled"]
    assert note.status is Status.DIFFERS
    assert "NVIDIA's chart with gfd.enabled also deploys Node Feature Discovery" in note.message
    assert "nvplugin's chart does not" in note.message
    assert migration.refused == [] and migration.output["gfd"] == {"enabled": True}


def test_a_gfd_only_release_is_refused_as_the_chart_refuses_it() -> None:
    data = values("v0.18.2")
    data["devicePlugin"]["enabled"] = False
    data["gfd"]["enabled"] = True
    migration = _values(data)
    (refused,) = migration.refused
    assert refused.key == "values.devicePlugin.enabled"
    error = render_error(migration.output)
    assert f"values.devicePlugin.enabled: false: {refused.message}" in error


def test_a_config_map_without_a_default_is_refused_with_nvidias_message() -> None:
    data = values("v0.20.0")
    data["config"]["map"] = {"a100-40gb": "version: v1\n", "tesla-t4": "version: v1\n"}
    migration = _values(data)
    (refused,) = migration.refused
    assert refused.key == "values.config.map"
    assert refused.message.startswith("A default config must be provided when more than one")
    assert f"values.config.map: {refused.message}" in render_error(migration.output)
    data["config"]["default"] = "tesla-t4"
    assert _values(data).refused == []


@pytest.mark.process
def test_values_read_from_standard_input() -> None:
    """helm get values nvdp | nvplugin migrate --values -"""
    command = [sys.executable, "-m", "nvplugin", "migrate", "--values", "-"]
    text = (FIXTURES / "values-v0.20.0.yaml").read_text()
    done = subprocess.run(command, input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "NVIDIA's chart values standard input ->" in done.stdout
    assert yaml.safe_load(done.stdout)["image"]["repository"] == "nvplugin"
    both = subprocess.run(
        [*command, "--daemonset", "-"], input=text, capture_output=True, text=True, timeout=60
    )
    assert both.returncode == 2 and "only one of --values and --daemonset" in both.stderr


def test_dotted_keys_of_unknown_values_stay_keys() -> None:
    """A label's name (with dots) under a value NVIDIA's chart does not have is one key, not a
    path: podLabels is nvplugin's, kept as it is."""
    labels = {"example.com/team": "ml", "app.kubernetes.io/part-of": "gpu"}
    migration = _values({"podLabels": labels, "image": {"repository": NVIDIA_IMAGE}})
    assert migration.output["podLabels"] == labels
    unknown = sorted(f.key for f in migration.findings if f.status is Status.UNKNOWN)
    assert unknown == [
        "values.podLabels.app.kubernetes.io/part-of",
        "values.podLabels.example.com/team",
    ]
    assert render(migration.output).pod is not None
