"""Bad values fail rendering with the message a user sees from ``helm install``; the schema and the
README's values table cover every value, and agree with the package."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvplugin.allocator import POLICY_NAMES
from nvplugin.chart.values import NVIDIA_VALUES, Use
from nvplugin.config import LOG_FORMATS, LOG_LEVELS
from nvplugin.config.rules import DEVICE_ID_STRATEGIES, DEVICE_LIST_STRATEGIES
from tests.support.helm import CHART_DIR, REPO, render, render_error

SCHEMA_ERROR = "values don't meet the specifications of the schema(s)"
ACCEPTED_AT_NVIDIAS_DEFAULTS = [v.path for v in NVIDIA_VALUES if v.use is Use.DEFAULTS]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"image": {"tag": 5}}, "at '/image/tag': got number, want string"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
        ({"probes": {"enabled": "yes"}}, "at '/probes/enabled': got string, want boolean"),
        ({"metrics": {"port": 0}}, "at '/metrics/port': minimum: got 0, want 1"),
        ({"metrics": {"enabled": "on"}}, "at '/metrics/enabled': got string, want boolean"),
        ({"probes": {"timeoutSeconds": 0}}, "at '/probes/timeoutSeconds': minimum: got 0, want 1"),
        ({"probes": {"port": 0}}, "at '/probes/port': minimum: got 0, want 1"),
        ({"probes": {"rpcTimeoutSeconds": 3}}, "additional properties 'rpcTimeoutSeconds'"),
        ({"compatWithCPUManager": "true"}, "at '/compatWithCPUManager'"),
        ({"failOnInitError": 1}, "at '/failOnInitError'"),
        ({"config": [1]}, "at '/config': got array, want object"),
        ({"config": {"map": {"a": 1}}}, "at '/config/map/a'"),
        ({"config": {"maps": {}}}, "additional properties 'maps' not allowed"),
        (
            {"config": {"fallbackStrategies": ["label"]}},
            "at '/config/fallbackStrategies/0': value must be one of 'named', 'single', 'empty'",
        ),
        ({"config": {"map": {"a": {"flag": {}}}}}, "at '/config/map/a'"),
        ({"resourceName": "gpu"}, "at '/resourceName': 'gpu' does not match pattern"),
        ({"devicePluginPath": "relative/dir"}, "at '/devicePluginPath'"),
        ({"allocationPolicy": "fastest"}, "at '/allocationPolicy': value must be one of"),
        ({"deviceIDStrategy": "serial"}, "at '/deviceIDStrategy'"),
        ({"deviceListStrategy": "magic"}, "at '/deviceListStrategy'"),
        ({"deviceListStrategy": "envvar,cdi"}, "at '/deviceListStrategy'"),
        ({"deviceListStrategy": ["envvar", "cdi"]}, "at '/deviceListStrategy"),
        ({"nvidiaDriverRoot": "run/nvidia/driver"}, "at '/nvidiaDriverRoot'"),
        ({"log": {"level": "trace"}}, "at '/log/level': value must be one of"),
        ({"resourceNmae": "x"}, "additional properties 'resourceNmae' not allowed"),
        ({"nodeSelector": {"gpu": True}}, "at '/nodeSelector/gpu': got boolean, want string"),
        ({"tolerations": {"key": "x"}}, "at '/tolerations': got object, want array"),
        ({"podAnnotations": {"n": 1}}, "at '/podAnnotations/n': got number, want string"),
        ({"updateStrategy": {"type": "Recreate"}}, "at '/updateStrategy/type': value must be one"),
        ({"imagePullSecrets": ["creds"]}, "at '/imagePullSecrets/0': got string, want object"),
    ],
)
def test_wrong_types_fail_at_install_time(values: dict[str, Any], message: str) -> None:
    error = render_error(values)
    assert error.startswith(SCHEMA_ERROR)
    assert message in error


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"config": {"map": {"a": ""}, "name": "mine"}},
            'values.config.name ("mine") and values.config.map are both set',
        ),
        ({"config": {"map": {"a": "a: [1, 2"}}}, "values.config.map.a: not a YAML mapping"),
        ({"config": {"map": {"a": "- just\n- a list\n"}}}, "values.config.map.a: not a YAML"),
        (
            {"config": {"map": {"a": ""}, "default": "b"}},
            'values.config.default is "b", but the config files are: a',
        ),
        # What NVIDIA users pass: the chart's config.map entries, checked against the plugin's
        # schema with the key path.
        (
            {"config": {"map": {"default": "version: v1\nflags:\n  migStrategy: split\n"}}},
            'values.config.map.default: key "flags.migStrategy": "split" is not one of none',
        ),
        (
            {
                "config": {
                    "map": {
                        "c": "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu"
                        "\n      replicas: 64\n"
                    }
                }
            },
            'values.config.map.c: key "sharing.mps.resources[0].replicas": 64 is more than 48',
        ),
        (
            {"config": {"map": {"c": "imex:\n  channelIDs: [0]\n"}}},
            'key "imex.channelIDs": nvplugin does not support IMEX channels yet',
        ),
        (
            {"config": {"map": {"c": "default: x\n"}}},
            'values.config.map.c: unknown key "default"; valid keys here: flags, imex, nvplugin',
        ),
        (
            {"config": {"map": {"c": "nvplugin:\n  helth: {}\n"}}},
            'unknown key "nvplugin.helth"; valid keys here:',
        ),
        (
            {"config": {"map": {"c": "flags:\n  plugin:\n    deviceIDStrategy: serial\n"}}},
            'key "flags.plugin.deviceIDStrategy": "serial" is not one of uuid, index',
        ),
        (
            {
                "config": {
                    "map": {
                        "c": "sharing:\n  timeSlicing:\n    resources:\n"
                        "    - {name: gpu, replicas: 1}\n"
                    }
                }
            },
            'key "sharing.timeSlicing.resources[0].replicas": 1 is less than 2',
        ),
        (
            {
                "config": {
                    "map": {
                        "c": "nvplugin:\n  health:\n    recovery:\n      quietPeriod: 5 minutes\n"
                    }
                }
            },
            'key "nvplugin.health.recovery.quietPeriod": "5 minutes" does not match',
        ),
        ({"gdsEnabled": True}, "values.gdsEnabled: nvplugin does not support gdsEnabled yet"),
        ({"deviceDiscoveryStrategy": "tegra"}, "values.deviceDiscoveryStrategy: nvplugin does"),
        (
            {"gfd": {"nameOverride": "gfd"}},
            'values.gfd.nameOverride: "gfd": nvplugin\'s chart deploys no GPU Feature Discovery',
        ),
        ({"nfd": {"enabled": True}}, "values.nfd.enabled: true: nvplugin's chart does not deploy"),
        (
            {"mps": {"enableHostPID": "yes"}},
            'values.mps.enableHostPID: "yes": nvplugin runs each MPS control daemon in its own pod',
        ),
        (
            {"cdi": {"nvidiaHookPath": "/usr/local/bin/nvidia-cdi-hook"}},
            "values.cdi.nvidiaHookPath: nvplugin does not generate CDI specs yet",
        ),
    ],
)
def test_values_that_cannot_work_fail_with_a_clear_message(
    values: dict[str, Any], message: str
) -> None:
    error = render_error(values)
    assert error.startswith("execution error at (nvplugin/templates/"), error
    assert message in error


@pytest.mark.parametrize(
    "value", ["envvar", "envvar,cdi-cri", "volume-mounts, cdi-annotations", ["cdi-cri"]]
)
def test_valid_device_list_strategies_render(value: object) -> None:
    assert render({"deviceListStrategy": value}).env["DEVICE_LIST_STRATEGY"]


def test_nvidia_defaults_of_unsupported_values_render() -> None:
    given = render(
        {
            "gfd": {"enabled": False},
            "mps": {"root": "/run/nvidia/mps"},
            "cdi": {"nvidiaHookPath": None, "featureFlags": None},
            "gdsEnabled": False,
            "mofedEnabled": False,
            "gdrcopyEnabled": False,
            "deviceDiscoveryStrategy": "auto",
            "migStrategy": "none",
        }
    )
    plain = render({})
    # Accepted at NVIDIA's defaults, they change nothing: the same objects as with no values,
    # but for the two settings given, passed on as given (the plugin's defaults too).
    assert given.env == {**plain.env, "MIG_STRATEGY": "none", "DEVICE_DISCOVERY_STRATEGY": "auto"}
    given.container.pop("env")
    plain.container.pop("env")
    assert given.daemonset == plain.daemonset
    others = sorted(set(given.manifests) | set(plain.manifests))
    assert [given.manifests.get(m) for m in others if "daemonset" not in m] == [
        plain.manifests.get(m) for m in others if "daemonset" not in m
    ]


def test_rendering_does_not_change_the_values() -> None:
    values = {"config": {"map": {"a": {"nvplugin": {"preStartRequired": True}}}}}
    once = render(values).one("ConfigMap")
    assert render(values).one("ConfigMap") == once


# --- the schema agrees with the package -----------------------------------------------------------


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART_DIR / "values.schema.json").read_text())
    return schema


def test_schema_choices_are_the_plugins() -> None:
    props = _schema()["properties"]
    strategies = props["deviceListStrategy"]["anyOf"][0]["anyOf"]
    string, array = strategies
    assert array["items"]["enum"] == list(DEVICE_LIST_STRATEGIES)
    assert string["pattern"].count("|".join(DEVICE_LIST_STRATEGIES).replace("-", "\\-")) == 2
    assert props["deviceIDStrategy"]["anyOf"][0]["enum"] == list(DEVICE_ID_STRATEGIES)
    assert props["allocationPolicy"]["enum"] == ["", *POLICY_NAMES]
    assert props["log"]["properties"]["format"]["enum"] == ["", *LOG_FORMATS]
    assert props["log"]["properties"]["level"]["enum"] == ["", *LOG_LEVELS]


def _broken_down(path: str, schema: dict[str, Any]) -> bool:
    """Whether the chart documents an object value key by key: its own objects, and the
    settings' values inside NVIDIA's blocks (``gfd.enabled``)."""
    return bool(schema.get("properties")) and (
        schema.get("additionalProperties") is False or path in ACCEPTED_AT_NVIDIAS_DEFAULTS
    )


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Every documented value: leaves, and objects the chart does not break down further."""
    paths = []
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        if name == "global":
            continue
        if _broken_down(path, sub):
            paths.extend(_schema_paths(sub, path + "."))
        elif path in ACCEPTED_AT_NVIDIAS_DEFAULTS:
            continue  # in the schema, not in values.yaml
        else:
            paths.append(path)
    return paths


def _values_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> list[str]:
    paths = []
    for name, value in values.items():
        sub = schema["properties"][name]
        if isinstance(value, dict) and _broken_down(f"{prefix}{name}", sub):
            paths.extend(_values_paths(value, sub, f"{prefix}{name}."))
        else:
            paths.append(f"{prefix}{name}")
    return paths


def test_schema_covers_every_value_in_values_yaml() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert sorted(_values_paths(values, _schema())) == sorted(_schema_paths(_schema()))


def _readme_table() -> dict[str, str]:
    """Value path -> default cell, from the README's values table."""
    rows = {}
    text = (CHART_DIR / "README.md").read_text()
    for line in text.splitlines():
        match = re.match(r"^\| `([A-Za-z0-9.]+)` \| (.*?) \| (.*?) \| .* \|$", line)
        if match:
            rows[match.group(1)] = match.group(3)
    return rows


def _lookup(values: dict[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        node = node[part]
    return node


def test_readme_table_lists_every_value_with_its_default() -> None:
    table = _readme_table()
    assert sorted(table) == sorted(_schema_paths(_schema()))
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    checked = 0
    for path, cell in table.items():
        match = re.fullmatch(r"`(.*)`", cell)
        if match is None:
            continue  # a structured default, described in words
        assert json.loads(match.group(1)) == _lookup(values, path), path
        checked += 1
    assert checked >= 30


@pytest.mark.process
def test_committed_schemas_are_generated_from_the_config_model() -> None:
    """charts/generate_schema.py writes config.schema.json, values.schema.json's config and
    settings parts, settings.json, values.yaml's settings and the READMEs' tables of settings and
    values from nvplugin/config/model.py; run it after changing a setting."""
    done = subprocess.run(
        [sys.executable, str(CHART_DIR.parent / "generate_schema.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


# Every file the generator writes, and a line in it that only the generator writes.
GENERATED = {
    "charts/nvplugin/config.schema.json": '"title": "nvplugin config file',
    "charts/nvplugin/values.schema.json": '"description": "NVIDIA\'s: exit when NVML',
    "charts/nvplugin/settings.json": '"env": "MIG_STRATEGY"',
    "charts/nvplugin/values.yaml": "migStrategy: null",
    "charts/nvplugin/README.md": "| `failOnInitError` | bool or null |",
    "README.md": "  failOnInitError: true ",
}


@pytest.fixture(scope="module")
def repo_copy() -> Iterator[Path]:
    """The generator and the files it writes, copied (it writes next to itself)."""
    work = Path(tempfile.mkdtemp(prefix="nvp-generated-"))
    try:
        shutil.copytree(REPO / "charts", work / "charts")
        shutil.copy2(REPO / "README.md", work / "README.md")
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _generate(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / "charts" / "generate_schema.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.process
@pytest.mark.parametrize("name", list(GENERATED))
def test_a_stale_generated_file_fails_the_check_and_is_rewritten(
    repo_copy: Path, name: str
) -> None:
    path = repo_copy / name
    fresh = path.read_text()
    assert GENERATED[name] in fresh
    path.write_text(fresh.replace(GENERATED[name], GENERATED[name].replace(" ", "  ", 1), 1))
    checked = _generate(repo_copy, "--check")
    assert checked.returncode == 1
    assert checked.stderr == f"{path} is stale: run python charts/generate_schema.py\n"
    assert _generate(repo_copy).returncode == 0
    assert path.read_text() == fresh
    assert _generate(repo_copy, "--check").returncode == 0
