"""Write what the chart and the READMEs derive from the settings' declarations
(nvplugin/config/model.py: each setting's kind, default, help, flags, variables, reload mode and
the chart value that sets it). The schemas and the templates' data are made by
nvplugin/chart/schema.py; this script writes them and the text derived from them.

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
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvplugin.chart.schema import (
    Stale,
    _supported,
    chart_values,
    config_schema,
    describe,
    nvidia_schema,
    settings_data,
    value_schema,
    values_schema,
)
from nvplugin.chart.values import NVIDIA_VALUES, Use
from nvplugin.config import SCHEMA
from nvplugin.config.schema import (
    Duration,
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
WIDTH = 100


def render_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# --- text between marker comments -----------------------------------------------------------------


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
