"""What ``nvplugin migrate`` found, and how it prints it: the migrated YAML with the findings as
comments above it (so the output is itself the file to install with), or JSON."""

from __future__ import annotations

import enum
import json
import textwrap
from dataclasses import dataclass, field
from typing import Any

import yaml


class Status(enum.Enum):
    """What happened to one key."""

    CHANGED = "changed"
    """nvplugin's equivalent is written instead (NVIDIA's image -> nvplugin's)."""
    DROPPED = "dropped"
    """Left out: NVIDIA's default of something nvplugin does not do (no effect either way)."""
    DIFFERS = "differs"
    """Kept, with NVIDIA's meaning; what nvplugin does differently is said."""
    REFUSED = "refused"
    """nvplugin cannot do it: installing the input as it is fails. Left out of the output,
    except a config file of ``config.map`` (which file is chosen depends on the entries) and
    what a DaemonSet cannot run without: those must be fixed by hand."""
    UNKNOWN = "unknown"
    """Not one of NVIDIA's values (v0.17-v0.20): kept as it is, for nvplugin's schema to judge."""


@dataclass(frozen=True)
class Finding:
    """One key of the input and what became of it."""

    source: str  # "values" or "daemonset"
    key: str  # the key path: values.gfd.enabled, or DaemonSet ns/name: path in it
    status: Status
    message: str
    value: object = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "key": self.key,
            "status": self.status.value,
            "value": self.value,
            "message": self.message,
        }

    def line(self) -> str:
        shown = "" if self.value is None else f" {_short(self.value)}"
        return f"{self.status.value:<8} {self.key}{shown}: {self.message}"


@dataclass
class Migration:
    """One input's migration: what it became (``output``: a values mapping, or manifests) and
    the findings, in input order."""

    source: str
    title: str
    output: Any
    findings: list[Finding] = field(default_factory=list)

    def add(self, key: str, status: Status, message: str, value: object = None) -> None:
        self.findings.append(Finding(self.source, key, status, message, value))

    @property
    def refused(self) -> list[Finding]:
        return [f for f in self.findings if f.status is Status.REFUSED]


class _Dumper(yaml.SafeDumper):
    """YAML as people write it: a multi-line string (a config file in config.map) as a block."""


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _string)


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def to_text(migrations: list[Migration]) -> str:
    """Each migration as YAML, its findings as comments above it; ``---`` between them."""
    parts = []
    for migration in migrations:
        lines = [f"# {line}" for line in _wrap(migration.title)]
        if migration.findings:
            lines.append("#")
            for finding in migration.findings:
                lines.extend(f"# {line}" for line in _wrap(finding.line(), " " * 11))
        else:
            lines.append("# Nothing to change: every key is used with NVIDIA's meaning.")
        output = migration.output
        documents = output if isinstance(output, list) else [output]
        body = "---\n".join(
            yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
            for doc in documents
        )
        parts.append("\n".join(lines) + "\n" + body)
    return "---\n".join(parts)


def to_json(migrations: list[Migration]) -> str:
    data = {
        migration.source: {
            "output": migration.output,
            "findings": [f.as_dict() for f in migration.findings],
        }
        for migration in migrations
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _wrap(text: str, indent: str = "") -> list[str]:
    """``text`` in lines of at most 96 characters, broken only at spaces: a path or a key stays
    whole (and can be copied) however long it is and whatever hyphens it has."""
    return textwrap.wrap(
        text, 96, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )
