"""Each setting is one typed field of Config (or of one of its groups): the field, its type, its
default and the file's key tree agree, whatever is declared."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping

import pytest

from nvplugin.config import SCHEMA, SETTINGS, Config, HealthConfig, LogConfig, load_config
from nvplugin.config.declare import declared, value_at
from nvplugin.config.model import ATTRIBUTES, GfdConfig, HealthServiceConfig, TopologyConfig
from nvplugin.config.schema import (
    AnyMapping,
    Bool,
    Duration,
    Int,
    Kind,
    List,
    Nullable,
    Obj,
    Setting,
    Str,
    format_duration,
)

GROUPS = {
    "log": LogConfig,
    "health": HealthConfig,
    "health_service": HealthServiceConfig,
    "gfd": GfdConfig,
    "topology": TopologyConfig,
}


def _hint(attrs: tuple[str, ...]) -> object:
    owner: type = Config
    for attr in attrs[:-1]:
        owner = GROUPS[attr]
    return typing.get_type_hints(owner)[attrs[-1]]


def _matches(kind: Kind, hint: object) -> bool:
    """Whether values of ``kind`` are what the type hint ``hint`` says."""
    args = typing.get_args(hint)
    if isinstance(kind, Nullable):
        others = [a for a in args if a is not type(None)]
        inner = others[0] if len(others) == 1 else typing.Union[tuple(others)]  # noqa: UP007
        return type(None) in args and _matches(kind.inner, inner)
    if isinstance(kind, AnyMapping):
        return type(None) in args and any(typing.get_origin(a) is Mapping for a in args)
    if isinstance(kind, List):
        return typing.get_origin(hint) is tuple and args[1] is Ellipsis
    expected = {Bool: bool, Int: int, Str: str, Duration: float}
    for cls, python in expected.items():
        if isinstance(kind, cls):
            return hint is python
    return isinstance(kind, Obj)


@pytest.mark.parametrize("path", list(SETTINGS))
def test_each_setting_is_a_field_of_its_type(path: str) -> None:
    setting: Setting = SETTINGS[path]
    attrs = ATTRIBUTES[path]
    hint = _hint(attrs)
    assert not isinstance(hint, types.GenericAlias) or typing.get_origin(hint) is tuple
    assert _matches(setting.kind, hint), (path, setting.kind, hint)
    # The default is a valid value, in its stored form, and the field's default.
    default = setting.default
    given = format_duration(float(str(default))) if isinstance(setting.kind, Duration) else default
    assert setting.check(given) == default
    assert value_at(Config(), attrs) == setting.default


def test_the_tree_holds_every_declared_setting_once_in_field_order() -> None:
    paths = [path for path, _, _ in declared(Config)]
    assert paths == list(SETTINGS) == [path for path, _ in SCHEMA.settings()]
    assert len(set(paths)) == len(paths)


def test_a_loaded_config_holds_every_value_in_its_fields() -> None:
    config = load_config(None, env={"NVPLUGIN_LOG_LEVEL": "debug", "MIG_STRATEGY": "mixed"})
    assert config.log.level == config.values["nvplugin.log.level"] == "debug"
    assert config.mig_strategy == config.values["flags.migStrategy"] == "mixed"
    assert list(config.values) == list(SETTINGS)


def test_settings_nvplugin_does_not_act_on_are_no_part_of_equality() -> None:
    env = {"DEVICE_DISCOVERY_STRATEGY": "nvml", "IMEX_REQUIRED": "true"}
    config = load_config(None, env=env)
    assert config.device_discovery_strategy == "nvml" and config.imex_required is True
    assert config == Config()
