"""The chart's schema and template data, derived from the settings' declarations
(:mod:`nvplugin.config.model`) and NVIDIA's chart values (:mod:`nvplugin.chart.values`): the chart
values that set settings, their JSON Schemas, what the templates turn into flags and environment
(``settings.json``) and ``values.schema.json``. ``charts/generate_schema.py`` writes them into the
chart; nothing at run time reads this module."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nvplugin.chart.values import (
    BY_PATH,
    GFD_ONLY,
    NO_DEFAULT,
    NVIDIA_IMAGE,
    NVIDIA_TAG,
    NVIDIA_TAG_WHY,
    NVIDIA_VALUES,
    NvidiaValue,
    Use,
)
from nvplugin.config import SCHEMA, SETTINGS
from nvplugin.config.schema import (
    Chart,
    ChartValue,
    Nullable,
    Setting,
    plain,
)

FALLBACK_STRATEGIES = ["named", "single", "empty"]
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}


class Stale(Exception):
    """A file cannot be brought up to date from the declarations (its markers are missing, or a
    value it does not write disagrees with them)."""


# --- the chart values that set settings -----------------------------------------------------------


@dataclass(frozen=True)
class Value:
    """One chart value that sets a setting: ``role`` is ``enabled``/``port`` for an address's two
    values, else ``value``."""

    path: str  # the setting's key path
    setting: Setting
    chart: Chart
    value: ChartValue
    role: str

    @property
    def parts(self) -> list[str]:
        return self.value.path.split(".")


def chart_values() -> list[Value]:
    """Every chart value that sets a setting, in the settings' order."""
    out = []
    for path, setting in SETTINGS.items():
        chart = setting.chart
        if chart is None:
            continue
        assert chart.to in Chart.TO, (path, chart.to)
        if chart.to == "address":
            enabled, port = chart.values
            out.append(Value(path, setting, chart, enabled, "enabled"))
            out.append(Value(path, setting, chart, port, "port"))
        else:
            (value,) = chart.values
            out.append(Value(path, setting, chart, value, "value"))
    return out


def _unset(text: str) -> bool:
    return text in ("null", '""', "[]")


def value_schema(v: Value) -> dict[str, Any]:
    """The value's JSON Schema: given, or the setting's (its kind's) as a chart value; a null or
    "" default means "not set" and is allowed."""
    if v.value.schema is not None:
        base = dict(v.value.schema)
    elif v.role == "enabled":
        base = {"type": "boolean"}
    elif v.role == "port":
        base = dict(PORT)
    else:
        kind = v.setting.kind
        base = (kind.inner if isinstance(kind, Nullable) else kind).schema()
    description = describe(v)
    if v.value.default is None:
        return {"description": description, "anyOf": [base, {"type": "null"}]}
    if v.value.default == "" and "enum" in base:
        base["enum"] = ["", *base["enum"]]
    elif v.value.default == "" and ("pattern" in base or "minLength" in base):
        return {"description": description, "anyOf": [{"type": "string", "maxLength": 0}, base]}
    return {**base, "description": description}


def _env(v: Value) -> str:
    return v.setting.env[0]


def _supported(v: Value) -> list[str] | None:
    supported = v.setting.supported
    return None if supported is None else [json.dumps(plain(s)) for s in supported]


def how(v: Value) -> str:
    """How the value reaches the plugin, in words."""
    key = f"config key `{v.path}`"
    to = v.chart.to
    if to == "env":
        return f"Passed as `{_env(v)}` ({key})."
    if to == "true" and v.chart.only_with:
        return f"`true` with `{v.chart.only_with}` passes `{_env(v)}=true` ({key})."
    if to == "true":
        return f"`true` passes `{_env(v)}=true` ({key})."
    if to == "when":
        return f"`true` passes `{_env(v)}={v.chart.constant}` ({key})."
    if to == "flag":
        return f"Passed as `--{v.setting.flags[0]}` ({key})."
    if to == "check":
        allowed = " or ".join(f"`{s}`" for s in ["null", *(_supported(v) or [])])
        return f"Not passed; anything but {allowed} fails rendering ({key})."
    if v.role == "enabled":
        return f"On: passed as `{_env(v)}=0.0.0.0:<port>` ({key})."
    return ""


def describe(v: Value) -> str:
    return " ".join(part for part in (v.value.help, how(v)) if part)


def refusal(v: Value) -> str:
    """The render-time message for a value the setting does not support."""
    if v.chart.refused:
        return v.chart.refused
    name = v.value.path
    allowed = " or ".join(["null", *(_supported(v) or [])])
    return f"nvplugin does not support {name} yet; leave it {allowed}"


def settings_data() -> dict[str, Any]:
    values = chart_values()
    env = []
    for path in dict.fromkeys(v.path for v in values):
        mine = [v for v in values if v.path == path]
        chart = mine[0].chart
        if chart.to in ("env", "true", "address", "when"):
            entry: dict[str, Any] = {
                "setting": path,
                "to": chart.to,
                "env": _env(mine[0]),
                "values": [v.parts for v in mine],
            }
            if chart.to == "when":
                entry["constant"] = chart.constant
            if chart.only_with:
                entry["with"] = chart.only_with.split(".")
            env.append(entry)
    image = BY_PATH["image.repository"]
    return {
        "about": "Written by charts/generate_schema.py from the settings' declarations "
        "(nvplugin/config/model.py) and NVIDIA's chart values (nvplugin/chart/values.py); "
        "read by templates/_helpers.tpl. Do not edit.",
        "args": [
            {"setting": v.path, "flag": f"--{v.setting.flags[0]}", "value": v.parts}
            for v in values
            if v.chart.to == "flag"
        ],
        "env": env,
        "refused": [
            {
                "setting": v.path,
                "value": v.parts,
                "supported": _supported(v),
                "message": refusal(v),
            }
            for v in values
            if v.setting.supported is not None
        ],
        "nvidia": [
            {
                "value": n.parts,
                "defaults": n.defaults(),
                "skip": sorted(n.skipped()),
                "message": n.why,
            }
            for n in NVIDIA_VALUES
            if n.use is Use.DEFAULTS
        ],
        "image": {
            "pattern": NVIDIA_IMAGE.pattern,
            "message": image.why,
            "tagPattern": NVIDIA_TAG.pattern,
            "tagMessage": NVIDIA_TAG_WHY,
        },
        "noDefault": NO_DEFAULT,
        "gfdOnly": GFD_ONLY,
    }


# --- the schemas ----------------------------------------------------------------------------------


def config_schema() -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "nvplugin config file (NVIDIA device plugin config v1 plus nvplugin's keys)",
        **SCHEMA.schema(),
    }


DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Kubernetes object name (a ConfigMap's), as the API server checks it."""
CONFIGMAP_KEY = r"^[-._a-zA-Z0-9]+$"
"""A ConfigMap's key, as the API server checks it (a config's name in ``config.map``)."""


def config_value() -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "The plugin's config files, as in NVIDIA's chart.",
        "properties": {
            "name": {
                "type": "string",
                "maxLength": 253,
                "pattern": f"^$|{DNS_SUBDOMAIN}",
                "description": "An existing ConfigMap of config files.",
            },
            "map": {
                "type": "object",
                "description": "Config files by name: YAML strings or mappings.",
                "propertyNames": {"maxLength": 253, "pattern": CONFIGMAP_KEY},
                "additionalProperties": {
                    "anyOf": [{"type": "string"}, {"$ref": "#/$defs/nvpluginConfig"}]
                },
            },
            "default": {
                "type": "string",
                "maxLength": 253,
                "pattern": f"^$|{CONFIGMAP_KEY}",
                "description": "The config file of a node without the config label.",
            },
            "fallbackStrategies": {
                "type": "array",
                "items": {"type": "string", "enum": FALLBACK_STRATEGIES},
                "description": "How the config is chosen without config.default.",
            },
        },
    }


def nvidia_schema(n: NvidiaValue, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON Schema of one of NVIDIA's values the chart declares: a HONOURED value's type;
    anything for a block accepted at NVIDIA's defaults (the templates check it, naming every
    key that is not), but the settings' chart values inside it (``settings``: their schemas by
    key), which keep their types."""
    if n.use is Use.HONOURED:
        assert n.schema is not None, n.path
        return {**n.schema, "description": n.help}
    schema: dict[str, Any] = {
        "description": f"NVIDIA's {n.path} values: accepted at NVIDIA's defaults only ({n.why})."
    }
    if settings:
        schema.update(type=["object", "null"], properties=settings)
    return schema


def _below(n: NvidiaValue) -> dict[str, Any]:
    """The schemas of the settings' chart values below NVIDIA's block ``n``, by key: exactly its
    declared settings (Stale otherwise: a setting's value inside a block is declared there)."""
    found = {
        v.parts[len(n.parts)]: value_schema(v)
        for v in chart_values()
        if v.parts[: len(n.parts)] == n.parts and len(v.parts) == len(n.parts) + 1
    }
    if sorted(found) != sorted(n.settings):
        raise Stale(
            f"NVIDIA's block {n.path} declares settings {sorted(n.settings)}, but the settings' "
            f"chart values below it are {sorted(found)}"
        )
    return found


def _place(properties: dict[str, Any], parts: list[str], schema: dict[str, Any]) -> None:
    node = properties
    *parents, leaf = parts
    for parent in parents:
        group = node.get(parent)
        if group is None or "properties" not in group:  # new, or once a block of NVIDIA's
            group = node[parent] = {
                "type": "object",
                "additionalProperties": False,
                "properties": {},
            }
        node = group["properties"]
    node[leaf] = schema


def values_schema(current: dict[str, Any]) -> dict[str, Any]:
    properties = json.loads(json.dumps(current["properties"]))  # a copy
    properties["config"] = config_value()
    for v in chart_values():
        _place(properties, v.parts, value_schema(v))  # Helm checks values.yaml's default
    for n in NVIDIA_VALUES:
        if n.use in (Use.HONOURED, Use.DEFAULTS):
            _place(
                properties, n.parts, nvidia_schema(n, _below(n) if n.use is Use.DEFAULTS else {})
            )
        else:  # the chart's own value, written by hand
            node: Any = {"properties": properties}
            for part in n.parts:
                node = node.get("properties", {}).get(part)
                if node is None:
                    raise Stale(f"values.schema.json: NVIDIA's value {n.path} is missing")
    return {
        **{k: v for k, v in current.items() if k not in ("properties", "$defs")},
        "properties": properties,
        "$defs": {"nvpluginConfig": SCHEMA.schema()},
    }
