"""The building blocks of the config schema: value kinds, settings (with their reload mode and
chart value) and sections.

Each setting is declared once (:mod:`nvplugin.config.model`, as the typed field that holds its
value; :mod:`nvplugin.config.declare` builds the tree of sections from those fields): its kind,
default, help text, the flag and environment names that also set it, what a reload does with it
and the Helm value that sets it. Everything else is derived from that tree by the code here --
checking a file's values (strict: an unknown key is an error with its path), parsing flag and
environment strings, and the JSON Schema the Helm chart checks values against -- so no key can be
known to one of them and unknown to another.

Checking never raises anything but :class:`Invalid`, whatever the value (a 5000-digit integer, a
megabyte string, a mapping where a list belongs): messages show values through
:func:`nvplugin.errors.describe`, which bounds them.
"""

from __future__ import annotations

import difflib
import enum
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvplugin.errors import describe, shortened, show

JsonSchema = dict[str, Any]


class Invalid(Exception):
    """A value's problem. ``at`` is where inside the value (``[1].replicas``; "" = the value
    itself); the loader prefixes the source and the key path."""

    def __init__(self, message: str, at: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.at = at


def unknown_key(name: object, valid: Sequence[str], prefix: str = "") -> Invalid:
    """The error for key ``name`` among ``valid``: "did you mean" only when one is really close
    (a typo, not any word sharing a few letters), else the list of valid keys."""
    text = shortened(str(name), 100)
    path = f"{prefix}.{text}" if prefix else text
    close = difflib.get_close_matches(str(name)[:200], list(valid), n=1, cutoff=0.8)
    if close:
        hint = f'did you mean "{f"{prefix}.{close[0]}" if prefix else close[0]}"?'
    else:
        hint = f"valid keys here: {', '.join(valid)}"
    return Invalid(f'unknown key "{path}"; {hint}')


# --- value kinds ---------------------------------------------------------------------------------


class Kind:
    """How one setting's values look. ``check`` validates a value from a file (YAML/JSON types) and
    returns it in its stored form; ``parse`` turns a flag or environment string into a file value
    (then checked); ``schema`` is its JSON Schema."""

    name = "value"

    def check(self, value: object) -> object:
        raise NotImplementedError

    def parse(self, text: str) -> object:
        return text

    def schema(self) -> JsonSchema:
        raise NotImplementedError


_TRUE = ("1", "t", "true")
_FALSE = ("0", "f", "false")


class Bool(Kind):
    """true or false. Flag and environment strings as NVIDIA's plugin reads them (Go's
    ``strconv.ParseBool``: 1, t, true, 0, f, false, any case)."""

    name = "boolean"

    def check(self, value: object) -> object:
        if not isinstance(value, bool):
            raise Invalid(f"expected true or false, got {describe(value)}")
        return value

    def parse(self, text: str) -> object:
        lowered = text.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise Invalid(f"expected true or false, got {show(text)}")

    def schema(self) -> JsonSchema:
        return {"type": "boolean"}


@dataclass(frozen=True)
class Str(Kind):
    """A string: one of ``choices`` when given; ``rule`` returns why a value is wrong (or None).
    ``pattern`` (a regular expression, full match) goes into the JSON Schema too."""

    choices: tuple[str, ...] = ()
    rule: Callable[[str], str | None] | None = None
    pattern: str | None = None
    non_empty: bool = False

    name = "string"

    def check(self, value: object) -> object:
        if not isinstance(value, str):
            raise Invalid(f"expected a string, got {describe(value)}")
        if self.choices and value not in self.choices:
            raise Invalid(f"{show(value)} is not one of {', '.join(self.choices)}")
        if self.non_empty and not value:
            raise Invalid("expected a non-empty string")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise Invalid(f"{show(value)} does not match {self.pattern}")
        if self.rule is not None:
            problem = self.rule(value)
            if problem:
                raise Invalid(problem)
        return value

    def schema(self) -> JsonSchema:
        out: JsonSchema = {"type": "string"}
        if self.choices:
            out["enum"] = list(self.choices)
        if self.non_empty:
            out["minLength"] = 1
        if self.pattern is not None:
            out["pattern"] = f"^(?:{self.pattern})$"
        return out


@dataclass(frozen=True)
class Int(Kind):
    """An integer within ``[minimum, maximum]`` (the bounds keep huge numbers out)."""

    minimum: int = 0
    maximum: int = 2**31 - 1

    name = "integer"

    def check(self, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"expected an integer, got {describe(value)}")
        if not self.minimum <= value <= self.maximum:
            raise Invalid(f"{show(value)} is not between {self.minimum} and {self.maximum}")
        return value

    def parse(self, text: str) -> object:
        stripped = text.strip()
        if not re.fullmatch(r"[-+]?[0-9]{1,20}", stripped):
            raise Invalid(f"expected an integer, got {show(text)}")
        return int(stripped)

    def schema(self) -> JsonSchema:
        return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION_UNITS |= {"m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_NUMBER_UNIT = r"([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)"
DURATION_PATTERN = rf"0|({_DURATION_NUMBER_UNIT})+"
MAX_DURATION_S = 366 * 24 * 3600.0


def parse_duration(text: str) -> float:
    """A Kubernetes-style duration (Go's ``time.ParseDuration``: ``30s``, ``1m30s``, ``500ms``,
    ``0``) in seconds; ValueError when it is not one. Negative durations are refused."""
    if len(text) > 64 or not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(
            f"{show(text)} is not a duration (a number and a unit: ns, us, ms, s, m, h; "
            "e.g. 30s, 1m30s, 500ms)"
        )
    if text == "0":
        return 0.0
    total = 0.0
    for number, unit in _DURATION_PART.findall(text):
        total += float(number) * _DURATION_UNITS[unit]
    if not math.isfinite(total) or total > MAX_DURATION_S:
        raise ValueError(f"{show(text)} is longer than a year")
    return total


def format_duration(seconds: float) -> str:
    """Seconds as a duration string (``30s``, ``1.5s``), for logs and the effective config."""
    return f"{seconds:g}s"


@dataclass(frozen=True)
class Duration(Kind):
    """A duration string (``30s``), stored as seconds (float); at least ``minimum`` seconds."""

    minimum: float = 0.0

    name = "duration"

    def check(self, value: object) -> object:
        if not isinstance(value, str):
            raise Invalid(f"expected a duration string such as 30s, got {describe(value)}")
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        if seconds < self.minimum:
            raise Invalid(f"{show(value)} is shorter than {format_duration(self.minimum)}")
        return seconds

    def schema(self) -> JsonSchema:
        return {"type": "string", "pattern": f"^(?:{DURATION_PATTERN})$"}


@dataclass(frozen=True)
class List(Kind):
    """A list of ``item`` values, stored as a tuple. ``comma``: a string is also taken, split at
    commas (NVIDIA's list flags and environment variables are comma-separated), and flags may be
    repeated. ``unique``: no value twice."""

    item: Kind
    comma: bool = False
    unique: bool = False
    min_items: int = 0

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"list of {self.item.name}s"

    def check(self, value: object) -> object:
        if self.comma and isinstance(value, str):
            value = [part.strip() for part in value.split(",")] if value.strip() else []
        if not isinstance(value, list | tuple):
            raise Invalid(f"expected a {self.name}, got {describe(value)}")
        out = []
        for number, item in enumerate(value):
            try:
                out.append(self.item.check(item))
            except Invalid as exc:
                raise Invalid(exc.message, f"[{number}]{exc.at}") from None
            if self.unique and out[-1] in out[:-1]:
                raise Invalid(f"{show(item)} is listed twice", f"[{number}]")
        if len(out) < self.min_items:
            raise Invalid(f"expected at least {self.min_items} item(s)")
        return tuple(out)

    def parse(self, text: str) -> object:
        items = [part.strip() for part in text.split(",")] if text.strip() else []
        return [self.item.parse(item) for item in items]

    def schema(self) -> JsonSchema:
        listed: JsonSchema = {"type": "array", "items": self.item.schema()}
        if self.unique:
            listed["uniqueItems"] = True
        if self.min_items:
            listed["minItems"] = self.min_items
        if not self.comma:
            return listed
        text: JsonSchema = {"type": "string"}
        if isinstance(self.item, Str) and self.item.choices:
            one = "|".join(re.escape(choice) for choice in self.item.choices)
            text["pattern"] = rf"^\s*({one})\s*(,\s*({one})\s*)*$"
        return {"anyOf": [text, listed]}


@dataclass(frozen=True)
class Member:
    """One key of an :class:`Obj`: its kind, and whether it must be given (else ``default``)."""

    kind: Kind
    required: bool = False
    default: object = None
    help: str = ""


@dataclass(frozen=True)
class Obj(Kind):
    """A mapping with exactly these keys (``members``), stored as ``make(checked values)`` (keys
    as written; absent optional keys get their default)."""

    members: Mapping[str, Member]
    make: Callable[[dict[str, Any]], object] = dict
    label: str = "mapping"

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.label} {{{', '.join(self.members)}}}"

    def check(self, value: object) -> object:
        if not isinstance(value, dict):
            raise Invalid(f"expected a {self.name}, got {describe(value)}")
        for key in value:
            if key not in self.members:
                raise Invalid(unknown_key(key, list(self.members)).message)
        out: dict[str, Any] = {}
        for key, member in self.members.items():
            if key not in value:
                if member.required:
                    raise Invalid("is missing", f".{key}")
                out[key] = member.default
                continue
            try:
                out[key] = member.kind.check(value[key])
            except Invalid as exc:
                raise Invalid(exc.message, f".{key}{exc.at}") from None
        return self.make(out)

    def schema(self) -> JsonSchema:
        out: JsonSchema = {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                key: _described(member.kind.schema(), member.help)
                for key, member in self.members.items()
            },
        }
        required = [key for key, member in self.members.items() if member.required]
        if required:
            out["required"] = required
        return out


class AnyMapping(Kind):
    """Any mapping (or null): for blocks nvplugin recognises but does not read (GFD's part)."""

    name = "mapping"

    def check(self, value: object) -> object:
        if value is not None and not isinstance(value, dict):
            raise Invalid(f"expected a mapping, got {describe(value)}")
        return value

    def schema(self) -> JsonSchema:
        return {"type": ["object", "null"]}


@dataclass(frozen=True)
class Nullable(Kind):
    """``inner`` or null."""

    inner: Kind

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.inner.name} or null"

    def check(self, value: object) -> object:
        return None if value is None else self.inner.check(value)

    def parse(self, text: str) -> object:
        return self.inner.parse(text)

    def schema(self) -> JsonSchema:
        return {"anyOf": [self.inner.schema(), {"type": "null"}]}


def plain(value: object) -> object:
    """A checked value as JSON data (tuples as lists)."""
    if isinstance(value, tuple | list):
        return [plain(item) for item in value]
    return value


def _described(schema: JsonSchema, help_text: str) -> JsonSchema:
    return {**schema, "description": help_text} if help_text else schema


# --- settings and sections -----------------------------------------------------------------------


class Reload(enum.Enum):
    """What a running plugin does when SIGHUP brings a new value of a setting."""

    IN_PLACE = "in place"
    """Applied while serving: the sockets, the kubelet's streams and the registrations stay."""
    RESERVE = "re-serve"
    """The resources are served again under the new config (new sockets, registered again)."""
    RESTART = "restart"
    """Read once, before the serve loop: the new value takes effect at the next start."""


@dataclass(frozen=True)
class ChartValue:
    """One value of the Helm chart (``path`` in values.yaml, e.g. ``log.level``): its default in
    values.yaml, its description, and its JSON Schema when the setting's kind cannot say it (a
    rule such as "an absolute path" is a pattern for the chart); None: derived from the kind."""

    path: str
    default: object
    help: str
    schema: JsonSchema | None = None


@dataclass(frozen=True)
class Chart:
    """The chart value(s) that set a setting, and how they reach the plugin (``to``):

    - ``env``: the value, when set (not null, "" or []), as the setting's first environment
      variable; a list joined with commas.
    - ``true``: ``true`` sets the setting's first variable to ``true``; false or null: nothing
      (``compatWithCPUManager`` -> ``PASS_DEVICE_SPECS=true``). With ``only_with`` (another
      boolean value's path), only while that one is true too (``nfd.enableNodeFeatureApi`` with
      ``gfd.enabled`` -> ``GFD_USE_NODE_FEATURE_API=true``).
    - ``address``: two values, ``<x>.enabled`` and ``<x>.port``; enabled: the variable is
      ``0.0.0.0:<port>`` (every interface of the pod's network namespace).
    - ``flag``: the value as the setting's first flag (``--device-plugin-dir <value>``).
    - ``when``: a boolean value; ``true`` sets the setting's first variable to ``constant``
      (``gfd.enabled`` -> ``GFD_OUTPUT_FILE=<NFD's features.d>/gfd``).
    - ``check``: not passed; only checked, for NVIDIA values nvplugin accepts at some values only.

    A value outside the setting's ``supported`` values fails rendering with ``refused`` (default:
    "nvplugin does not support <value> yet; leave it null or <supported>"; ``{value}`` in it is
    replaced by the value given). ``charts/generate_schema.py`` writes what the chart needs from
    this: the values' schema, the data its templates iterate over, values.yaml's entries and the
    READMEs' tables.
    """

    to: str
    values: tuple[ChartValue, ...]
    refused: str = ""
    constant: str = ""
    """What ``when`` passes."""
    only_with: str = ""
    """``true``: the other chart value that must be true too (empty: none)."""

    TO = ("env", "true", "address", "flag", "check", "when")

    @classmethod
    def env(
        cls,
        path: str,
        default: object,
        help: str,
        *,
        schema: JsonSchema | None = None,
        refused: str = "",
    ) -> Chart:
        return cls("env", (ChartValue(path, default, help, schema),), refused)

    @classmethod
    def true(cls, path: str, help: str, *, only_with: str = "") -> Chart:
        return cls(
            "true", (ChartValue(path, None, help, {"type": "boolean"}),), only_with=only_with
        )

    @classmethod
    def when(cls, path: str, constant: str, help: str) -> Chart:
        return cls("when", (ChartValue(path, False, help, {"type": "boolean"}),), constant=constant)

    @classmethod
    def address(cls, enabled: ChartValue, port: ChartValue) -> Chart:
        return cls("address", (enabled, port))

    @classmethod
    def flag(
        cls, path: str, default: object, help: str, *, schema: JsonSchema | None = None
    ) -> Chart:
        return cls("flag", (ChartValue(path, default, help, schema),))

    @classmethod
    def check(
        cls, path: str, help: str, *, schema: JsonSchema | None = None, refused: str = ""
    ) -> Chart:
        return cls("check", (ChartValue(path, None, help, schema),), refused)


@dataclass(frozen=True)
class Setting:
    """One key of the config tree that holds a value.

    ``flags``: ``serve`` options that set it (first = the main name); ``env``: environment
    variables that set it (NVIDIA's names for NVIDIA's settings, ``NVPLUGIN_*`` for ours).
    ``supported``: for NVIDIA settings nvplugin does not implement, the values it accepts (the
    default, typically; None: every valid value); any other value is refused with
    ``unsupported`` as the reason. ``note``:
    logged once at start when the key is present (a block that is not for the plugin).
    ``reload``: what SIGHUP does with a new value. ``chart``: the Helm value that sets it.
    ``inert``: accepted (for NVIDIA's files) but not acted on: its value is no part of the
    effective config's equality, and a reload has nothing to apply.
    """

    kind: Kind
    default: object
    help: str = ""
    flags: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    supported: tuple[object, ...] | None = None
    unsupported: str = ""
    note: str = ""
    reload: Reload = Reload.RESERVE
    chart: Chart | None = None
    inert: bool = False

    def check(self, value: object) -> object:
        checked = self.kind.check(value)
        if self.supported is not None and plain(checked) not in [plain(v) for v in self.supported]:
            raise Invalid(self.unsupported or "is not supported by nvplugin yet")
        return checked

    def schema(self) -> JsonSchema:
        out = _described(self.kind.schema(), self.help)
        if self.supported is not None:
            # The chart's render-time check refuses these with the reason (Helm's own schema
            # check can only say "not allowed").
            out["x-nvplugin-supported"] = [plain(value) for value in self.supported]
            out["x-nvplugin-unsupported"] = self.unsupported
        if self.note:
            out["x-nvplugin-note"] = self.note
        return out


@dataclass(frozen=True)
class Section:
    """A mapping of keys to settings and further sections."""

    members: Mapping[str, Setting | Section]
    help: str = ""

    def settings(self, prefix: str = "") -> list[tuple[str, Setting]]:
        """Every setting below, as (dotted path, setting), in declaration order."""
        out: list[tuple[str, Setting]] = []
        for key, member in self.members.items():
            path = f"{prefix}.{key}" if prefix else key
            if isinstance(member, Section):
                out.extend(member.settings(path))
            else:
                out.append((path, member))
        return out

    def check(self, value: object, prefix: str, out: dict[str, object], seen: list[str]) -> None:
        """Check the mapping ``value`` found at ``prefix``; checked values go to ``out`` by dotted
        path, and the paths of settings given (with notes) to ``seen``. Raises Invalid with
        ``at`` = the full key path."""
        if not isinstance(value, dict):
            raise Invalid(f"expected a mapping, got {describe(value)}", prefix)
        for key, item in value.items():
            member = self.members.get(key) if isinstance(key, str) else None
            path = f"{prefix}.{key}" if prefix else str(key)
            if member is None:
                error = unknown_key(key, list(self.members), prefix)
                raise Invalid(error.message, "")
            if isinstance(member, Section):
                if item is None:
                    continue  # an empty section, as YAML writes `flags:` with nothing under it
                member.check(item, path, out, seen)
                continue
            try:
                out[path] = member.check(item)
            except Invalid as exc:
                raise Invalid(exc.message, f"{path}{exc.at}") from None
            seen.append(path)

    def schema(self) -> JsonSchema:
        out: JsonSchema = {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {key: member.schema() for key, member in self.members.items()},
        }
        return _described(out, self.help)
