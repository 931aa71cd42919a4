"""Write the chart's schemas from the plugin's config model (nvplugin/config/model.py).

- ``nvplugin/config.schema.json``: the config file's JSON Schema. The chart's templates read it
  (``.Files.Get``) to check every config given in ``config.map`` at render time, including the
  YAML strings Helm's own schema check cannot look into.
- ``nvplugin/values.schema.json``: the same schema under ``$defs.nvpluginConfig`` for the
  mappings in ``config.map``, plus NVIDIA's chart values with the plugin's choices. The rest of
  that file (the chart's own values) is kept as it is.

``python charts/generate_schema.py`` rewrites both; ``--check`` exits 1 when either is stale (a
test runs it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvplugin.config import SCHEMA, SETTINGS
from nvplugin.config.schema import Nullable, Str

CHART = Path(__file__).resolve().parent / "nvplugin"
CONFIG_SCHEMA = CHART / "config.schema.json"
VALUES_SCHEMA = CHART / "values.schema.json"
FALLBACK_STRATEGIES = ["named", "single", "empty"]


def config_schema() -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "nvplugin config file (NVIDIA device plugin config v1 plus nvplugin's keys)",
        **SCHEMA.schema(),
    }


def _choices(path: str) -> list[str]:
    kind = SETTINGS[path].kind
    kind = kind.inner if isinstance(kind, Nullable) else kind
    assert isinstance(kind, Str)
    return list(kind.choices)


def _nullable(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "anyOf": [schema, {"type": "null"}]}


def nvidia_values() -> dict[str, Any]:
    """NVIDIA's chart values, typed with the plugin's own choices."""
    setting = SETTINGS["flags.plugin.deviceListStrategy"]
    return {
        "migStrategy": _nullable(
            {"type": "string", "enum": _choices("flags.migStrategy")},
            "NVIDIA's value (MIG_STRATEGY); only none is supported yet.",
        ),
        "failOnInitError": _nullable({"type": "boolean"}, "NVIDIA's value (FAIL_ON_INIT_ERROR)."),
        "compatWithCPUManager": _nullable(
            {"type": "boolean"}, "NVIDIA's value: PASS_DEVICE_SPECS=true and a privileged pod."
        ),
        "deviceListStrategy": _nullable(
            setting.kind.schema(), "NVIDIA's value (DEVICE_LIST_STRATEGY)."
        ),
        "deviceIDStrategy": _nullable(
            {"type": "string", "enum": _choices("flags.plugin.deviceIDStrategy")},
            "NVIDIA's value (DEVICE_ID_STRATEGY).",
        ),
        "nvidiaDriverRoot": _nullable(
            {"type": "string", "pattern": "^/"},
            "NVIDIA's value: the host's driver root, mounted at /driver-root (NVIDIA_DRIVER_ROOT).",
        ),
        **{
            name: _nullable({"type": "boolean"}, "NVIDIA's value; nvplugin does not support it.")
            for name in ("gdrcopyEnabled", "gdsEnabled", "mofedEnabled")
        },
        "deviceDiscoveryStrategy": _nullable(
            {"type": "string"}, "NVIDIA's value; auto or nvml (DEVICE_DISCOVERY_STRATEGY)."
        ),
        **{
            name: {"description": f"NVIDIA's {name} values: not supported (fails rendering)."}
            for name in ("gfd", "nfd", "mps")
        },
    }


def config_value() -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "The plugin's config files, as in NVIDIA's chart.",
        "properties": {
            "name": {"type": "string", "description": "An existing ConfigMap of config files."},
            "map": {
                "type": "object",
                "description": "Config files by name: YAML strings or mappings.",
                "additionalProperties": {
                    "anyOf": [{"type": "string"}, {"$ref": "#/$defs/nvpluginConfig"}]
                },
            },
            "default": {"type": "string", "description": "The config file every node uses."},
            "fallbackStrategies": {
                "type": "array",
                "items": {"type": "string", "enum": FALLBACK_STRATEGIES},
                "description": "How the config is chosen without config.default.",
            },
        },
    }


def values_schema(current: dict[str, Any]) -> dict[str, Any]:
    properties = dict(current["properties"])
    properties["config"] = config_value()
    properties.update(nvidia_values())
    return {
        **{k: v for k, v in current.items() if k not in ("properties", "$defs")},
        "properties": properties,
        "$defs": {"nvpluginConfig": SCHEMA.schema()},
    }


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def outputs() -> dict[Path, str]:
    current = json.loads(VALUES_SCHEMA.read_text())
    return {CONFIG_SCHEMA: render(config_schema()), VALUES_SCHEMA: render(values_schema(current))}


def main(argv: list[str]) -> int:
    written = outputs()
    stale = [
        path for path, text in written.items() if not path.exists() or path.read_text() != text
    ]
    if "--check" in argv:
        for path in stale:
            print(f"{path} is stale: run python charts/generate_schema.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in written.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
