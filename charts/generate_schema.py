"""Write what the chart and the READMEs derive from the settings' declarations
(nvplugin/config/model.py: each setting's kind, default, help, flags, variables, reload mode and
the chart value that sets it).

- ``nvplugin/config.schema.json``: the config file's JSON Schema. The chart's templates read it
  (``.Files.Get``) to check every config given in ``config.map`` at render time, including the
  YAML strings Helm's own schema check cannot look into.
- ``nvplugin/values.schema.json``: the same schema under ``$defs.nvpluginConfig`` for the
  mappings in ``config.map``, every chart value that sets a setting, typed with the setting's own
  choices, and NVIDIA's values the chart honours or accepts at NVIDIA's defaults
  (``nvplugin/chart/values.py``). The rest of that file (the chart's own values) is kept as
  it is.
- ``nvplugin/settings.json``: what the templates turn into the container's flags and environment
  ("nvplugin.env"), and what "nvplugin.validate" refuses: the values nvplugin accepts at some
  values only, NVIDIA's values accepted at NVIDIA's defaults only, NVIDIA's image.
- ``nvplugin/values.yaml``: the values that set settings, and NVIDIA's values the chart honours,
  between marker comments.
- ``nvplugin/README.md``: the tables of those values and of every NVIDIA value, between marker
  comments.
- ``../README.md``: every key of the config file with its default, flags, variables, chart value
  and what a reload does with it, between marker comments.

``python charts/generate_schema.py`` rewrites them; ``--check`` exits 1 when any is stale (a test
runs it).
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvplugin.config import SCHEMA, SETTINGS
from nvplugin.chart.values import BY_PATH, NVIDIA_IMAGE, NVIDIA_VALUES, NvidiaValue, Use
from nvplugin.config.schema import (
    Chart,
    ChartValue,
    Duration,
    Nullable,
    Reload,
    Section,
    Setting,
    format_duration,
    plain,
)

CHARTS = Path(__file__).resolve().parent
CHART = CHARTS / "nvplugin"
CONFIG_SCHEMA = CHART / "config.schema.json"
VALUES_SCHEMA = CHART / "values.schema.json"
SETTINGS_DATA = CHART / "settings.json"
VALUES_YAML = CHART / "values.yaml"
CHART_README = CHART / "README.md"
README = CHARTS.parent / "README.md"
FALLBACK_STRATEGIES = ["named", "single", "empty"]
WIDTH = 100
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}


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
        "image": {"pattern": NVIDIA_IMAGE.pattern, "message": image.why},
    }


# --- the schemas ----------------------------------------------------------------------------------


def config_schema() -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "nvplugin config file (NVIDIA device plugin config v1 plus nvplugin's keys)",
        **SCHEMA.schema(),
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
            "default": {
                "type": "string",
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
                    raise Stale(f"{VALUES_SCHEMA}: NVIDIA's value {n.path} is missing")
    return {
        **{k: v for k, v in current.items() if k not in ("properties", "$defs")},
        "properties": properties,
        "$defs": {"nvpluginConfig": SCHEMA.schema()},
    }


def render_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# --- text between marker comments -----------------------------------------------------------------


class Stale(Exception):
    """A file cannot be brought up to date by this script (its markers are missing, or a value
    it does not write disagrees with the declarations)."""


def replace_between(text: str, begin: str, end: str, block: str, where: Path) -> str:
    """``text`` with the lines from the one starting with ``begin`` to the one starting with
    ``end`` (both kept) replaced by ``block``."""
    lines = text.splitlines(keepends=True)
    starts = [n for n, line in enumerate(lines) if line.startswith(begin)]
    ends = [n for n, line in enumerate(lines) if line.startswith(end)]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise Stale(f"{where}: expected one line starting {begin!r} and one after it {end!r}")
    return "".join(lines[: starts[0] + 1]) + block + "".join(lines[ends[0] :])


def _wrap(text: str, first: str, rest: str, width: int = WIDTH) -> list[str]:
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _scalar(value: object) -> str:
    """A value in YAML's flow style, as values.yaml and the README write it."""
    if isinstance(value, str) and value:
        try:
            if yaml.safe_load(value) == value and "#" not in value:
                return value
        except yaml.YAMLError:
            pass
    if isinstance(value, str | int | bool) or value is None:
        return json.dumps(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
    return text.removesuffix("\n...").strip()


# --- values.yaml ----------------------------------------------------------------------------------

VALUES_BEGIN = "# --- Values that set the plugin's settings"
VALUES_END = "# --- end of the values that set the plugin's settings"


def values_yaml(current: str) -> str:
    """values.yaml with its settings' values written: every chart value whose top-level key is
    not written by hand elsewhere in the file (those are checked against their default)."""
    lines = current.splitlines(keepends=True)
    inside, own = False, set()
    for line in lines:
        if line.startswith(VALUES_BEGIN):
            inside = True
        elif line.startswith(VALUES_END):
            inside = False
        elif not inside and (match := re.match(r"([A-Za-z][A-Za-z0-9]*):", line)):
            own.add(match.group(1))
    loaded = yaml.safe_load(current) or {}
    header = (
        "Written by charts/generate_schema.py from the settings' declarations "
        "(nvplugin/config/model.py): change them there and run it, not these lines. Each value "
        "reaches the plugin as its environment variable or flag, which wins over the config "
        "file; null or \"\" = not set. NVIDIA's values keep NVIDIA's names and meaning."
    )
    block = [line + "\n" for line in _wrap(header, "# ", "# ")] + ["\n"]
    opened: str | None = None
    for v in chart_values():
        top, *rest = v.parts
        if top in own:
            node: Any = loaded
            for part in v.parts:
                if not isinstance(node, dict) or part not in node:
                    raise Stale(f"{VALUES_YAML}: {v.value.path} is missing")
                node = node[part]
            if node != v.value.default:
                raise Stale(
                    f"{VALUES_YAML}: {v.value.path} is {node!r}, declared {v.value.default!r}"
                )
            continue
        assert len(rest) <= 1, f"{v.value.path}: one level of nesting only"
        indent = ""
        if rest:
            if opened != top:
                block.append(f"{top}:\n")
                opened = top
            indent = "  "
        else:
            opened = None
        block.extend(line + "\n" for line in _wrap(describe(v), f"{indent}# -- ", f"{indent}# "))
        block.append(f"{indent}{v.parts[-1]}: {_scalar(v.value.default)}\n")
    written = replace_between(current, VALUES_BEGIN, VALUES_END, "".join(block), VALUES_YAML)
    return replace_between(written, NVIDIA_BEGIN, NVIDIA_END, nvidia_yaml(), VALUES_YAML)


NVIDIA_BEGIN = "# --- NVIDIA's values the chart honours"
NVIDIA_END = "# --- end of NVIDIA's values the chart honours"


def nvidia_yaml() -> str:
    """values.yaml's block of NVIDIA's values the chart honours, nested as their paths say."""
    header = (
        "Written by charts/generate_schema.py from nvplugin/chart/values.py: change them "
        "there and run it. NVIDIA's values (v0.17 to v0.20) with NVIDIA's meaning; NVIDIA's "
        "gfd, nfd and mps values are accepted at NVIDIA's defaults only (see README.md)."
    )
    block = [line + "\n" for line in _wrap(header, "# ", "# ")] + ["\n"]
    opened: list[str] = []
    for n in NVIDIA_VALUES:
        if n.use is not Use.HONOURED:
            continue
        *parents, leaf = n.parts
        common = 0
        while common < min(len(opened), len(parents)) and opened[common] == parents[common]:
            common += 1
        for depth in range(common, len(parents)):
            block.append(f"{'  ' * depth}{parents[depth]}:\n")
        opened = parents
        indent = "  " * len(parents)
        block.extend(line + "\n" for line in _wrap(n.help, f"{indent}# -- ", f"{indent}# "))
        block.append(f"{indent}{leaf}: {_scalar(n.default)}\n")
    return "".join(block)


# --- the chart's README: the table of values that set settings ----------------------------------

TABLE_BEGIN = "<!-- The values that set the plugin's settings"
TABLE_END = "<!-- end of the values that set the plugin's settings -->"


def type_text(schema: dict[str, Any]) -> str:
    """A value's type in words, from its JSON Schema."""
    if "anyOf" in schema:
        kinds = [s for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = len(kinds) < len(schema["anyOf"])
        if len(kinds) == 1 and "enum" in kinds[0] and nullable:
            return ", ".join(["null", *kinds[0]["enum"]])
        words = ", ".join(type_text(s) for s in kinds)
        return f"{words} or null" if nullable else words
    if "enum" in schema:
        return ", ".join(json.dumps(e) if e == "" else str(e) for e in schema["enum"])
    kind = schema.get("type")
    if kind == "string" and schema.get("pattern") == "^/":
        return "absolute path"
    if kind == "string" and schema.get("maxLength") == 0:
        return '""'
    return {"boolean": "bool", "array": "list"}.get(str(kind), str(kind))


def chart_table() -> str:
    rows = ["| Value | Type | Default | Description |\n", "|---|---|---|---|\n"]
    for v in chart_values():
        schema = value_schema(v)
        cells = [
            f"`{v.value.path}`",
            type_text(schema),
            f"`{json.dumps(v.value.default)}`",
            describe(v).replace("|", "\\|"),
        ]
        rows.append(f"| {' | '.join(cells)} |\n")
    return "".join(rows)


NVIDIA_TABLE_BEGIN = "<!-- Every value of NVIDIA's chart"
NVIDIA_TABLE_END = "<!-- end of every value of NVIDIA's chart -->"

_USE = {
    Use.SAME: "same",
    Use.HONOURED: "honoured",
    Use.DEFAULTS: "accepted at NVIDIA's defaults only",
    Use.REFUSED: "refused",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _nvidia_default(values: list[Any]) -> str:
    if not values:
        return "(absent)"
    texts = [_scalar(value) for value in values]
    if len(texts) > 1 or len(texts[0]) > 40:
        return "(a list)" if isinstance(values[0], list) else "(a mapping)"
    return _cell(f"`{texts[0]}`")


def nvidia_table() -> str:
    """Every value of NVIDIA's chart: the settings' values, then the ones declared in
    chartvalues.py, with what nvplugin's chart does with each."""
    rows = ["| NVIDIA's value | NVIDIA's default | nvplugin's chart |\n", "|---|---|---|\n"]
    for v in chart_values():
        if v.path.startswith("nvplugin."):
            continue  # nvplugin's own
        if v.chart.to == "check":
            what = f"accepted at `null` or {', '.join(f'`{s}`' for s in _supported(v) or [])} only"
        else:
            what = f"same: sets `{v.path}`"
        default = "null" if v.value.default in (None, "") else _scalar(v.value.default)
        rows.append(f"| `{v.value.path}` | `{default}` | {_cell(what)} |\n")
    for n in NVIDIA_VALUES:
        nvidia = n.defaults()
        if n.use is Use.DEFAULTS:
            default = "NVIDIA's defaults of every version"
        else:
            default = _nvidia_default(nvidia)
        what = _USE[n.use] + (f": {n.why}" if n.why else "")
        star = ".*" if n.use is Use.DEFAULTS else ""
        rows.append(f"| `{n.path}{star}` | {default} | {_cell(what)} |\n")
    rows += [
        "\nThe ones the chart implements (values.yaml holds them at nvplugin's defaults):\n\n",
        "| Value | Type | Default | Description |\n",
        "|---|---|---|---|\n",
    ]
    for n in NVIDIA_VALUES:
        if n.use is Use.HONOURED:
            cells = [
                f"`{n.path}`",
                type_text(nvidia_schema(n)),
                f"`{json.dumps(n.default)}`",
                _cell(n.help),
            ]
            rows.append(f"| {' | '.join(cells)} |\n")
    return "".join(rows)


# --- the README: every key of the config file ----------------------------------------------------

KEYS_BEGIN = "<!-- Every key of the config file"
KEYS_END = "<!-- end of every key of the config file -->"
COMMENT_AT = 37


def _default(setting: Setting) -> str:
    value = setting.default
    if isinstance(setting.kind, Duration):
        return format_duration(float(str(value)))
    return _scalar(plain(value))


def _setting_comment(setting: Setting) -> str:
    names = [f"--{flag}" for flag in setting.flags] + list(setting.env)
    if setting.chart is not None:
        names.append("Helm " + " + ".join(f"{value.path}" for value in setting.chart.values))
    text = f"{', '.join(names)}: {setting.help}" if names else setting.help
    if setting.reload is Reload.RESTART:
        text += " SIGHUP: takes effect at the next start."
    elif setting.reload is Reload.IN_PLACE and not setting.inert:
        text += " SIGHUP: applied in place."
    return text


def _commented(line: str, comment: str) -> list[str]:
    if not comment:
        return [line]
    column = max(COMMENT_AT, len(line) + 1)
    first = line.ljust(column) + "# "
    return _wrap(comment, first, " " * COMMENT_AT + "#   ")


def _keys(section: Section, depth: int) -> list[str]:
    out: list[str] = []
    for key, member in section.members.items():
        indent = "  " * depth
        if isinstance(member, Section):
            out.extend(_commented(f"{indent}{key}:", member.help))
            out.extend(_keys(member, depth + 1))
        else:
            line = f"{indent}{key}: {_default(member)}"
            out.extend(_commented(line, _setting_comment(member)))
    return out


def readme_keys() -> str:
    lines = ["```yaml", *_keys(SCHEMA, 0), "```"]
    return "".join(line.rstrip() + "\n" for line in lines)


# --- all of it ------------------------------------------------------------------------------------


def outputs() -> dict[Path, str]:
    current = json.loads(VALUES_SCHEMA.read_text())
    return {
        CONFIG_SCHEMA: render_json(config_schema()),
        VALUES_SCHEMA: render_json(values_schema(current)),
        SETTINGS_DATA: render_json(settings_data()),
        VALUES_YAML: values_yaml(VALUES_YAML.read_text()),
        CHART_README: replace_between(
            replace_between(
                CHART_README.read_text(), TABLE_BEGIN, TABLE_END, chart_table(), CHART_README
            ),
            NVIDIA_TABLE_BEGIN,
            NVIDIA_TABLE_END,
            nvidia_table(),
            CHART_README,
        ),
        README: replace_between(README.read_text(), KEYS_BEGIN, KEYS_END, readme_keys(), README),
    }


def main(argv: list[str]) -> int:
    try:
        written = outputs()
    except Stale as exc:
        print(exc, file=sys.stderr)
        return 1
    stale = [
        path for path, text in written.items() if not path.exists() or path.read_text() != text
    ]
    if "--check" in argv:
        for path in stale:
            print(f"{path} is stale: run python charts/generate_schema.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(written[path])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
