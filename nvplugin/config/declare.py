"""Declaring settings as typed dataclass fields, and what is derived from those fields.

A setting is declared once, as the field of :class:`~nvplugin.config.model.Config` (or of one of
its groups, such as ``Config.log``) that holds its effective value::

    pre_start_required: bool = setting(
        "nvplugin.preStartRequired", Bool(), False, help="...", flags=(...), env=(...)
    )

The field's type is what the rest of the code reads (``config.pre_start_required``, checked by
mypy); :func:`setting` keeps the declaration (a :class:`~nvplugin.config.schema.Setting`: key
path, kind, default, help, flags, environment variables, reload mode, chart value) in the field's
metadata. :func:`tree` walks the fields in order and builds the config file's tree from their key
paths, so the fields' order is the file's key order (the effective-config log line, "valid keys
here", ``serve --help``); a group's settings are therefore neighbours in the file.
:func:`field_values` fills the fields from every setting's checked value, and :func:`value_at`
reads one back by key path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from nvplugin.config.schema import Chart, Kind, Reload, Section, Setting

T = TypeVar("T")

_SETTING = "nvplugin.setting"


def setting(
    path: str,
    kind: Kind,
    default: T,
    *,
    help: str = "",
    flags: tuple[str, ...] = (),
    env: tuple[str, ...] = (),
    supported: tuple[object, ...] | None = None,
    unsupported: str = "",
    note: str = "",
    reload: Reload | None = None,
    chart: Chart | None = None,
    inert: bool = False,
) -> T:
    """The dataclass field of the setting at key ``path`` (see :class:`Setting` for the rest).
    ``reload`` defaults to re-serving, or to in place for an ``inert`` setting (nothing to
    apply)."""
    mode = reload if reload is not None else Reload.IN_PLACE if inert else Reload.RESERVE
    declared = Setting(
        kind, default, help, flags, env, supported, unsupported, note, mode, chart, inert
    )
    return dataclasses.field(
        default=default, compare=not inert, metadata={_SETTING: (path, declared)}
    )


GROUP: Mapping[str, object] = MappingProxyType({"nvplugin.group": True})
"""The metadata of a field holding a group of settings (a dataclass of :func:`setting` fields,
such as ``LogConfig``), at its place in the file's key order:
``log: LogConfig = field(default_factory=LogConfig, metadata=GROUP)``."""


def _members(cls: type) -> list[tuple[str, str, Setting | type]]:
    """(field name, key path or "", setting or group class) for each declaring field of ``cls``,
    in order."""
    out: list[tuple[str, str, Setting | type]] = []
    for field in dataclasses.fields(cls):
        if _SETTING in field.metadata:
            path, declared = field.metadata[_SETTING]
            out.append((field.name, path, declared))
        elif field.metadata.get("nvplugin.group"):
            assert isinstance(field.default_factory, type), field.name
            out.append((field.name, "", field.default_factory))
    return out


def declared(cls: type) -> list[tuple[str, tuple[str, ...], Setting]]:
    """Every setting declared in ``cls`` and its groups, in order: (key path, attribute path,
    setting). The attribute path of ``nvplugin.log.level`` is ``("log", "level")``."""
    out: list[tuple[str, tuple[str, ...], Setting]] = []
    for name, path, member in _members(cls):
        if isinstance(member, Setting):
            out.append((path, (name,), member))
        else:
            out.extend((p, (name, *attrs), s) for p, attrs, s in declared(member))
    return out


def tree(cls: type, helps: Mapping[str, str]) -> Section:
    """The config file's tree of the settings declared in ``cls``: sections named by the key
    paths, in the order their first setting is declared; ``helps``: each section's help by its
    path ("" = the whole file)."""
    root: dict[str, Any] = {}
    for path, _, member in declared(cls):
        node = root
        *parents, leaf = path.split(".")
        for parent in parents:
            node = node.setdefault(parent, {})
            assert isinstance(node, dict), f"{path}: {parent} is a setting, not a section"
        assert leaf not in node, f"{path} is declared twice"
        node[leaf] = member
    unknown = set(helps) - {""} - set(_section_paths(root, ""))
    assert not unknown, f"help for sections that hold no setting: {sorted(unknown)}"
    return _section(root, "", helps)


def _section_paths(node: dict[str, Any], prefix: str) -> list[str]:
    out = []
    for key, member in node.items():
        if isinstance(member, dict):
            path = f"{prefix}.{key}" if prefix else key
            out.append(path)
            out.extend(_section_paths(member, path))
    return out


def _section(node: dict[str, Any], prefix: str, helps: Mapping[str, str]) -> Section:
    members: dict[str, Setting | Section] = {}
    for key, member in node.items():
        path = f"{prefix}.{key}" if prefix else key
        members[key] = _section(member, path, helps) if isinstance(member, dict) else member
    return Section(members, helps.get(prefix, ""))


def field_values(cls: type, values: Mapping[str, object]) -> dict[str, Any]:
    """The keyword arguments that fill ``cls``'s setting fields (its groups made the same way)
    from ``values``, every setting's checked value by key path."""
    out: dict[str, Any] = {}
    for name, path, member in _members(cls):
        if isinstance(member, Setting):
            out[name] = values[path]
        else:
            out[name] = member(**field_values(member, values))
    return out


def value_at(obj: object, attrs: tuple[str, ...]) -> object:
    """The value at attribute path ``attrs`` (from :func:`declared`) of ``obj``."""
    for attr in attrs:
        obj = getattr(obj, attr)
    return obj
