"""A values file of NVIDIA's chart -> the values for nvplugin's chart.

Each key is read against the declarations the chart itself refuses values with: a setting's
chart value (:data:`nvplugin.config.SETTINGS`, checked by the setting), or one of NVIDIA's values
(:mod:`nvplugin.chart.values`: same, honoured, accepted at NVIDIA's defaults, refused);
``config.map``'s config files are read by the plugin's own loader. What the chart would refuse is
reported as refused and left out; NVIDIA's defaults of what nvplugin does not do are dropped;
NVIDIA's image becomes nvplugin's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvplugin import yamlinput
from nvplugin.chart.values import (
    BY_PATH,
    GFD_ONLY,
    NFD_NOT_DEPLOYED,
    NVIDIA_IMAGE,
    NvidiaValue,
    Use,
    covering,
    gfd_only,
    no_default_problem,
    off_defaults,
)
from nvplugin.config import SETTINGS, load_config
from nvplugin.config.schema import Invalid, Setting
from nvplugin.errors import InputError, describe
from nvplugin.migrate.findings import Migration, Status

DEFAULT_REPOSITORY = "nvplugin"
"""nvplugin's chart's default image.repository (values.yaml)."""


def _setting_values() -> dict[str, tuple[str, Setting]]:
    """Chart value path -> (key path, setting), for every setting the chart sets."""
    out = {}
    for path, setting in SETTINGS.items():
        if setting.chart is not None:
            for value in setting.chart.values:
                out[value.path] = (path, setting)
    return out


def migrate_values(text: str, source: str, repository: str = DEFAULT_REPOSITORY) -> Migration:
    """The migration of NVIDIA's values file ``text`` (named ``source``); ``repository``:
    where nvplugin's image is. InputError when it is no YAML mapping."""
    document = yamlinput.load(text, source)
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise InputError(f"{source}: expected a mapping of chart values, got {describe(document)}")
    migration = Migration(
        "values",
        f"nvplugin migrate: NVIDIA's chart values {source} -> nvplugin's chart values "
        "(helm install nvplugin charts/nvplugin -n kube-system -f THIS_FILE)",
        {},
    )
    _walk(document, (), migration, _setting_values(), repository)
    if "image" not in document or "repository" not in (document.get("image") or {}):
        _put(migration.output, "image.repository", repository)
    _gfd(document, migration)
    _default_config(document, migration)
    return migration


def _default_config(document: Mapping[str, Any], migration: Migration) -> None:
    """NVIDIA's chart's rule: a config.map must give an unlabelled node a config (both charts
    refuse it at render, with NVIDIA's message)."""
    config = document.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("map"), dict):
        return
    fallbacks = config.get("fallbackStrategies")
    if not isinstance(fallbacks, list):
        fallbacks = list(BY_PATH["config.fallbackStrategies"].defaults()[0])
    default = config.get("default")
    problem = no_default_problem(
        [str(name) for name in config["map"]],
        default if isinstance(default, str) else None,
        [str(item) for item in fallbacks],
    )
    if problem is not None:
        migration.add("values.config.map", Status.REFUSED, problem)


def _gfd(document: Mapping[str, Any], migration: Migration) -> None:
    """``gfd.enabled``: NVIDIA's chart also deployed NFD, nvplugin's does not; without the
    plugin (a GPU-Feature-Discovery-only release) nothing would label the nodes."""
    if gfd_only(document):
        migration.add("values.devicePlugin.enabled", Status.REFUSED, GFD_ONLY, False)
    elif isinstance(gfd := document.get("gfd"), dict) and gfd.get("enabled") is True:
        migration.add("values.gfd.enabled", Status.DIFFERS, NFD_NOT_DEPLOYED, True)


def _walk(
    node: Mapping[str, Any],
    prefix: tuple[str, ...],
    migration: Migration,
    settings: dict[str, tuple[str, Setting]],
    repository: str,
) -> None:
    for key, value in node.items():
        parts = (*prefix, str(key))
        path = ".".join(parts)
        if value is None:
            continue  # null: not set, as Helm takes it
        declared = None if "." in str(key) else covering(path)  # a dotted key is no value's
        if path in settings and "." not in str(key):
            _setting_value(path, value, migration, *settings[path])
        elif declared is not None:
            if declared.path == path and declared.settings and isinstance(value, dict):
                value = _block_settings(value, path, declared, migration, settings)
                if not value:
                    continue
            _nvidia_value(path, value, declared.path, migration, repository)
        elif isinstance(value, dict) and value:
            _walk(value, parts, migration, settings, repository)
        else:
            migration.add(
                f"values.{path}",
                Status.UNKNOWN,
                "not one of NVIDIA's chart values (v0.17-v0.20) nvplugin knows; kept as it is "
                "(nvplugin's chart checks it against its schema)",
                value,
            )
            _put_parts(migration.output, parts, value)


def _block_settings(
    value: dict[str, Any],
    path: str,
    declared: NvidiaValue,
    migration: Migration,
    settings: dict[str, tuple[str, Setting]],
) -> dict[str, Any]:
    """NVIDIA's block ``value`` at ``path`` less the settings' chart values inside it
    (``declared.settings``: ``gfd.enabled``), each read as the setting's; one at NVIDIA's
    default stays in the block, which is then dropped as NVIDIA's defaults."""
    defaults = [d for d in declared.defaults() if isinstance(d, dict)]
    rest = dict(value)
    for key in declared.settings:
        given = value.get(key)
        if given is None or any(d.get(key) == given for d in defaults):
            continue
        _setting_value(f"{path}.{key}", given, migration, *settings[f"{path}.{key}"])
        del rest[key]
    return rest


def _setting_value(
    path: str, value: object, migration: Migration, key: str, setting: Setting
) -> None:
    """A setting's chart value: checked by the setting, as the plugin would check it."""
    assert setting.chart is not None
    if value == "" or value == [] or (setting.chart.to == "check" and value is False):
        return  # not set, or NVIDIA's "off": nothing to pass
    if setting.chart.to in ("when", "true") and not isinstance(value, bool):
        migration.add(f"values.{path}", Status.REFUSED, "expected true or false", value)
        return
    if setting.chart.to == "when":  # a switch for a constant the chart passes
        _put(migration.output, path, value)
        return
    try:
        setting.check(value)
    except Invalid as exc:
        message = setting.chart.refused.replace("{value}", repr(value)) or exc.message
        migration.add(f"values.{path}", Status.REFUSED, message, value)
        return
    if setting.chart.to == "check":
        return  # accepted, and not passed to the plugin
    _put(migration.output, path, value)


def _nvidia_value(
    path: str, value: object, declared: str, migration: Migration, repository: str
) -> None:
    entry = BY_PATH[declared]
    key = f"values.{path}"
    if path == "image.tag" and value and _nvidias_image(migration):
        migration.add(
            key,
            Status.CHANGED,
            "NVIDIA's version -> \"\": nvplugin's (the chart's appVersion)",
            value,
        )
        _put(migration.output, path, "")
        return
    if entry.use is Use.REFUSED:
        if path == "image.repository" and isinstance(value, str) and NVIDIA_IMAGE.search(value):
            migration.add(
                key,
                Status.CHANGED,
                f"NVIDIA's plugin image -> {repository}, nvplugin's (built from its Dockerfile "
                "and pushed there; --image-repository says where)",
                value,
            )
            _put(migration.output, path, repository)
        else:
            _put(migration.output, path, value)
        return
    if entry.use is Use.DEFAULTS:
        off = off_defaults(value, entry.defaults(), path, entry.skipped())
        for leaf in off:
            migration.add(f"values.{leaf}", Status.REFUSED, entry.why, _get(value, leaf, path))
        if not off:
            migration.add(key, Status.DROPPED, f"NVIDIA's defaults; {entry.why.split(';')[0]}")
        return
    if path == "config.map" and isinstance(value, dict):
        _config_map(value, migration)
    if entry.why and entry.use in (Use.SAME, Use.HONOURED):
        migration.add(key, Status.DIFFERS, entry.why, value)
    _put(migration.output, path, value)


def _nvidias_image(migration: Migration) -> bool:
    """Whether the input's image.repository (read before image.tag) was NVIDIA's."""
    return any(f.key == "values.image.repository" for f in migration.findings)


def _config_map(entries: Mapping[str, Any], migration: Migration) -> None:
    """Each config file in ``config.map``, read by the plugin's loader as the plugin would."""
    import yaml

    for name, entry in entries.items():
        text = entry if isinstance(entry, str) else yaml.safe_dump(entry)
        try:
            load_config(f"config.map.{name}", text=text)
        except InputError as exc:
            message = str(exc).removeprefix(f"config file config.map.{name}: ")
            migration.add(f"values.config.map.{name}", Status.REFUSED, message)


def _get(value: object, leaf: str, prefix: str) -> object:
    for part in leaf[len(prefix) + 1 :].split(".") if leaf != prefix else []:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _put(out: dict[str, Any], path: str, value: object) -> None:
    _put_parts(out, tuple(path.split(".")), value)


def _put_parts(out: dict[str, Any], parts: tuple[str, ...], value: object) -> None:
    """``value`` at the keys ``parts`` (a key may hold dots: a label's name)."""
    *parents, leaf = parts
    node = out
    for parent in parents:
        node = node.setdefault(parent, {})
    node[leaf] = value
