"""NVIDIA's chart values against facts written from NVIDIA's files, key by key: the restated
values files (tests/fixtures/nvidia/values-*.yaml) and nvplugin's declarations of NVIDIA's values
(nvplugin/chart/values.py, the settings' chart values) each checked against
tests/fixtures/nvidia/chart-values-facts.yaml, the oracle that neither of them is written from."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from nvplugin.chart.values import NVIDIA_VALUES, Use, covering, off_defaults
from nvplugin.config import SETTINGS
from tests.support.nvidia import FIXTURES, VALUES_VERSIONS, leaves, values

FACTS: dict[str, Any] = yaml.safe_load((FIXTURES / "chart-values-facts.yaml").read_text())
SETTING_VALUES = {
    value.path for setting in SETTINGS.values() if setting.chart for value in setting.chart.values
}


def _value_at(flat: dict[str, Any], path: str) -> tuple[bool, Any]:
    """The value at ``path`` in a tag's flat facts: a leaf, or the block rebuilt from the leaves
    below it (False: the tag has no such key)."""
    if path in flat:
        return True, flat[path]
    below = {key[len(path) + 1 :]: v for key, v in flat.items() if key.startswith(path + ".")}
    if not below:
        return False, None
    block: dict[str, Any] = {}
    for key, value in below.items():
        *parents, leaf = key.split(".")
        node = block
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return True, block


def test_the_facts_name_every_restated_release() -> None:
    assert sorted(FACTS) == sorted(VALUES_VERSIONS)
    for tag, facts in FACTS.items():
        assert "values.yaml" in facts["source"], tag


@pytest.mark.parametrize("tag", VALUES_VERSIONS)
def test_the_restated_values_file_says_what_nvidias_says_key_by_key(tag: str) -> None:
    restated = values(tag)
    flat = {path: _value_at_file(restated, path) for path in leaves(restated)}
    facts = FACTS[tag]["values"]
    assert [k for k in facts if k not in flat] == [], f"{tag}: keys NVIDIA has, missing"
    assert [k for k in flat if k not in facts] == [], f"{tag}: keys NVIDIA does not have"
    for key, fact in facts.items():
        assert flat[key] == fact, f"{tag}: {key} is {flat[key]!r}, NVIDIA's default {fact!r}"


def _value_at_file(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


@pytest.mark.parametrize("tag", VALUES_VERSIONS)
def test_every_key_of_nvidias_is_declared(tag: str) -> None:
    undeclared = [
        key for key in FACTS[tag]["values"] if key not in SETTING_VALUES and covering(key) is None
    ]
    assert undeclared == [], f"{tag}: keys declared nowhere"


@pytest.mark.parametrize("tag", VALUES_VERSIONS)
def test_each_release_default_is_one_the_declarations_accept(tag: str) -> None:
    """Where a declaration states NVIDIA's defaults, each release's default is one of them: a
    values file of that release passes as NVIDIA's defaults, key by key."""
    flat = FACTS[tag]["values"]
    for declared in NVIDIA_VALUES:
        if not declared.nvidia:
            continue
        present, value = _value_at(flat, declared.path)
        if not present:
            continue
        if declared.use is Use.DEFAULTS:
            off = off_defaults(value, declared.defaults(), declared.path, declared.skipped())
            assert off == [], f"{tag}: NVIDIA's default refused at {off}"
        else:
            assert value in declared.defaults(), (
                f"{tag}: {declared.path} is {value!r} at NVIDIA's, declared {declared.defaults()}"
            )


def test_no_declared_default_is_one_nvidia_never_had() -> None:
    """Each default a declaration attributes to NVIDIA is, leaf by leaf, NVIDIA's at some
    release: in its values.yaml, or a key its templates read when absent (``absent``)."""
    invented = []
    for declared in NVIDIA_VALUES:
        for default in declared.defaults():
            for leaf in leaves(default, declared.path):
                if not any(_nvidias(FACTS[tag], leaf, default, declared.path) for tag in FACTS):
                    invented.append(leaf)
    assert invented == []


def _nvidias(facts: dict[str, Any], leaf: str, default: Any, base: str) -> bool:
    want = default
    for part in leaf[len(base) + 1 :].split(".") if leaf != base else []:
        want = want[part]
    present, value = _value_at(facts["values"], leaf)
    if present:
        return bool(value == want)
    absent = (facts.get("absent") or {}).get(leaf)
    return absent is not None and absent["default"] == want


def test_the_facts_that_corrected_the_fixtures() -> None:
    """The two facts the fixtures and declarations once got wrong."""
    assert "devicePlugin.containers.main.env" not in FACTS["v0.20.0"]["values"]
    assert FACTS["v0.18.2"]["values"]["mps.enableHostPID"] is False
    assert "devicePlugin.containers.main.env" in FACTS["main"]["values"]
