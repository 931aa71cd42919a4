"""Bad values fail rendering with the message a user sees from ``helm install``; the schema and the
README's values table cover every value, and agree with the package."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from nvplugin.allocator import POLICY_NAMES
from nvplugin.config import LOG_FORMATS, LOG_LEVELS
from nvplugin.plugin.responses import DEVICE_ID_STRATEGIES, DEVICE_LIST_STRATEGIES
from tests.chart.rendering import CHART_DIR, render, render_error

SCHEMA_ERROR = "values don't meet the specifications of the schema(s)"


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
        (
            {"health": {"ignoredXids": ["79"]}},
            "at '/health/ignoredXids/0': got string, want integer",
        ),
        ({"health": {"recoveryQuietSeconds": -1}}, "at '/health/recoveryQuietSeconds': minimum"),
        ({"passDeviceSpecs": "true"}, "at '/passDeviceSpecs': got string, want null or boolean"),
        ({"failOnInitError": 1}, "at '/failOnInitError': got number, want null or boolean"),
        ({"config": [1]}, "at '/config': got array, want string or object"),
        ({"resourceName": "gpu"}, "at '/resourceName': 'gpu' does not match pattern"),
        ({"devicePluginPath": "relative/dir"}, "at '/devicePluginPath'"),
        ({"allocationPolicy": "fastest"}, "at '/allocationPolicy': value must be one of"),
        ({"deviceIDStrategy": "serial"}, "at '/deviceIDStrategy': value must be one of"),
        ({"deviceListStrategy": "magic"}, "at '/deviceListStrategy': 'magic' does not match"),
        ({"deviceListStrategy": "envvar,cdi"}, "at '/deviceListStrategy': 'envvar,cdi' does not"),
        (
            {"deviceListStrategy": ["envvar", "cdi"]},
            "at '/deviceListStrategy/1': value must be one of 'envvar', 'volume-mounts'",
        ),
        ({"deviceListStrategy": 3}, "at '/deviceListStrategy': 'anyOf' failed"),
        ({"log": {"level": "trace"}}, "at '/log/level': value must be one of"),
        ({"resourceNmae": "x"}, "additional properties 'resourceNmae' not allowed"),
        ({"health": {"enable": True}}, "at '/health': additional properties 'enable' not allowed"),
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
            {"config": {"health": {"enabled": True}}, "existingConfigMap": {"name": "mine"}},
            'values.config and values.existingConfigMap.name ("mine") are both set: the plugin '
            "reads one config file. Use values.config for a ConfigMap this chart manages, or "
            "existingConfigMap.name for one you manage, not both",
        ),
        (
            {"config": "version: v1\n", "existingConfigMap": {"name": "mine"}},
            'values.config and values.existingConfigMap.name ("mine") are both set',
        ),
        (
            {"existingConfigMap": {"name": "mine"}, "health": {"enabled": False}},
            'values.health.enabled is set, but the config file comes from your ConfigMap "mine": '
            "set health.enabled there",
        ),
        (
            {"existingConfigMap": {"name": "mine"}, "deviceIDStrategy": "uuid"},
            "values.deviceIDStrategy is set, but the config file comes from your ConfigMap",
        ),
        (
            {"config": {"allocation_policy": "simple"}, "allocationPolicy": "best-effort"},
            'values.config.allocation_policy is "simple" but values.allocationPolicy is '
            '"best-effort": set it in one place (values.allocationPolicy)',
        ),
        (
            {"config": {"resource_name": "example.com/gpu"}},
            'values.config.resource_name is "example.com/gpu" but values.resourceName is '
            '"nvidia.com/gpu": set it in one place (values.resourceName)',
        ),
        (
            {"config": {"device_plugin_dir": "/srv/dp"}},
            'values.config.device_plugin_dir is "/srv/dp" but values.devicePluginPath is',
        ),
        (
            {"config": {"log": {"level": "info"}}, "log": {"level": "debug"}},
            'values.config.log.level is "info" but values.log.level is "debug"',
        ),
        (
            {"config": {"health": {"xids": {"ignore": [48]}}}, "health": {"ignoredXids": [79]}},
            "values.config.health.xids.ignore is [48] but values.health.ignoredXids is [79]",
        ),
        (
            {"config": {"health": True}, "health": {"enabled": False}},
            "values.config.health must be a mapping, not true",
        ),
        (
            {"config": {"metrics_address": "127.0.0.1:9400"}, "metrics": {"enabled": True}},
            'values.config.metrics_address is "127.0.0.1:9400" but values.metrics.port is '
            '"0.0.0.0:9400"',
        ),
        (
            {"config": "a: [1, 2"},
            "values.config: the string is not a YAML mapping (the nvplugin config file format)",
        ),
        (
            {"config": "- just\n- a list\n"},
            "values.config: the string is not a YAML mapping",
        ),
    ],
)
def test_values_that_cannot_work_together_fail_with_a_clear_message(
    values: dict[str, Any], message: str
) -> None:
    error = render_error(values)
    assert error.startswith("execution error at (nvplugin/templates/")
    assert message in error


@pytest.mark.parametrize(
    "value", ["", "envvar", "envvar,cdi-cri", "volume-mounts, cdi-annotations", ["cdi-cri"]]
)
def test_valid_device_list_strategies_render(value: object) -> None:
    render({"deviceListStrategy": value})


def test_the_same_setting_in_both_places_is_fine() -> None:
    rendered = render(
        {
            "config": {"allocation_policy": "simple", "health": {"enabled": False}},
            "allocationPolicy": "simple",
            "health": {"enabled": False},
        }
    )
    assert rendered.env["NVPLUGIN_ALLOCATION_POLICY"] == "simple"
    assert yaml.safe_load(rendered.config_text)["health"] == {"enabled": False}


def test_blank_config_string_counts_as_unset() -> None:
    rendered = render({"config": "  \n", "existingConfigMap": {"name": "mine"}})
    assert rendered.kinds() == ["DaemonSet"]


def test_rendering_does_not_change_the_values_it_merges_into() -> None:
    # The config map is built twice (ConfigMap and checksum); merging must not mutate .Values, or
    # the second build would see its own additions as conflicts.
    values = {"config": {"health": {"xids": {"critical": [13]}}}, "health": {"enabled": False}}
    once = render(values).config_text
    assert render(values).config_text == once
    assert yaml.safe_load(once)["health"] == {"enabled": False, "xids": {"critical": [13]}}


# --- the schema agrees with the package -----------------------------------------------------------


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART_DIR / "values.schema.json").read_text())
    return schema


def test_schema_choices_are_the_plugins() -> None:
    props = _schema()["properties"]
    string, array = props["deviceListStrategy"]["anyOf"]
    assert array["items"]["enum"] == list(DEVICE_LIST_STRATEGIES)
    assert string["pattern"].count("|".join(DEVICE_LIST_STRATEGIES)) == 2
    assert props["deviceIDStrategy"]["enum"] == ["", *DEVICE_ID_STRATEGIES]
    assert props["allocationPolicy"]["enum"] == ["", *POLICY_NAMES]
    assert props["log"]["properties"]["format"]["enum"] == ["", *LOG_FORMATS]
    assert props["log"]["properties"]["level"]["enum"] == ["", *LOG_LEVELS]


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Every documented value: leaves, and objects the chart does not break down further."""
    paths = []
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        if name == "global":
            continue
        if sub.get("properties") and sub.get("additionalProperties") is False:
            paths.extend(_schema_paths(sub, path + "."))
        else:
            paths.append(path)
    return paths


def _values_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> list[str]:
    paths = []
    for name, value in values.items():
        sub = schema["properties"][name]
        if isinstance(value, dict) and sub.get("additionalProperties") is False:
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
