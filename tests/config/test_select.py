"""Per-node config selection: NVIDIA's config manager's rule (label, DEFAULT_CONFIG, fallback
strategies) and settings, and the config names of a ConfigMap volume."""

from __future__ import annotations

import os

import pytest

from nvplugin.config import load_config
from nvplugin.config.select import (
    Choice,
    NoConfig,
    Selection,
    available,
    choose,
    first_choice,
    read_selection,
)
from nvplugin.errors import InputError
from tests.support.configmap import ConfigMapVolume

TWO = ("a100-40gb", "tesla-t4")


def sel(**kwargs: object) -> Selection:
    return Selection(srcdir="/configs", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("label", "names", "selection", "expected"),
    [
        ("tesla-t4", TWO, sel(), Choice("tesla-t4", "label")),
        ("tesla-t4", TWO, sel(default_config="a100-40gb"), Choice("tesla-t4", "label")),
        (None, TWO, sel(default_config="a100-40gb"), Choice("a100-40gb", "default")),
        ("", TWO, sel(default_config="a100-40gb"), Choice("a100-40gb", "default")),
        (None, (*TWO, "default"), sel(), Choice("default", "fallback-named")),
        (None, ("only",), sel(), Choice("only", "fallback-single")),
        (None, ("only",), sel(fallbacks=("single", "named")), Choice("only", "fallback-single")),
        (None, TWO, sel(fallbacks=("named", "empty")), Choice(None, "fallback-empty")),
        (
            None,
            ("default",),
            sel(fallbacks=("single", "named")),
            Choice("default", "fallback-single"),
        ),
    ],
)
def test_choose(
    label: str | None, names: tuple[str, ...], selection: Selection, expected: Choice
) -> None:
    assert choose(label, names, selection) == expected


@pytest.mark.parametrize(
    ("label", "selection", "reason", "words"),
    [
        ("h100", sel(), "unknown", ["label nvidia.com/device-plugin.config='h100'", "a100-40gb"]),
        (None, sel(default_config="h100"), "unknown", ["DEFAULT_CONFIG 'h100'"]),
        (None, sel(), "no-fallback", ["named,single found none", "tesla-t4"]),
        (None, sel(fallbacks=()), "no-fallback", ["(none)"]),
    ],
)
def test_no_choice_says_why(
    label: str | None, selection: Selection, reason: str, words: list[str]
) -> None:
    with pytest.raises(NoConfig) as caught:
        choose(label, TWO, selection)
    assert caught.value.reason == reason
    for word in words:
        assert word in str(caught.value)


def test_a_configmap_volume_lists_its_keys_not_the_kubelets_entries() -> None:
    volume = ConfigMapVolume({"a100-40gb": "version: v1\n", "tesla-t4": "version: v1\n"})
    assert sorted(os.listdir(volume.path))[:2] == ["..2026_11_24_00_00_00.000000", "..data"]
    assert available(volume.path) == TWO
    volume.update({"tesla-t4": "version: v1\n", "default": "version: v1\n"})
    assert available(volume.path) == ("default", "tesla-t4")
    os.mkdir(os.path.join(volume.path, "subdir"))
    os.symlink("/nonexistent", os.path.join(volume.path, "dangling"))
    assert available(volume.path) == ("default", "tesla-t4")


def test_settings_from_flags_and_environment() -> None:
    assert read_selection({}, {"NODE_LABEL": "x"}) is None  # no directory: off
    env = {
        "CONFIG_FILE_SRCDIR": "/available-configs",
        "NODE_NAME": "node-1",
        "DEFAULT_CONFIG": "a100-40gb",
        "FALLBACK_STRATEGIES": "single, empty",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    selection = read_selection({"node_label": "example.com/config"}, env)
    assert selection is not None
    assert selection.srcdir == "/available-configs"
    assert selection.node_label == "example.com/config"
    assert selection.default_config == "a100-40gb"
    assert selection.fallbacks == ("single", "empty")
    assert selection.node_name == "node-1"
    assert selection.access.kubeconfig is None
    assert selection.access.service_host == "10.0.0.1"
    with pytest.raises(InputError, match="unknown strategy 'latest'"):
        read_selection({"fallback_strategies": "named,latest"}, env)
    off = read_selection({}, {"CONFIG_FILE_SRCDIR": "/c"})
    assert off is not None and "NODE_NAME" in (off.api_problem() or "")


def test_first_choice_serves_the_defaults_when_nothing_can_be_chosen() -> None:
    volume = ConfigMapVolume({"a": "version: v1\n", "b": "flags: {migStrategy: mixed}\n"})
    start = first_choice(Selection(volume.path), lambda path: load_config(path))
    assert start.choice == Choice(None, "none") and start.reason == "no-fallback"
    assert start.config.source is None
    bad = ConfigMapVolume({"default": "flags: {migStrategy: sideways}\n"})
    start = first_choice(Selection(bad.path), lambda path: load_config(path))
    assert start.choice == Choice(None, "none") and start.reason == "invalid"
    assert "sideways" in (start.problem or "")
    assert start.refused is not None and start.refused[0] == Choice("default", "fallback-named")
    good = ConfigMapVolume({"default": "flags: {migStrategy: mixed}\n"})
    start = first_choice(Selection(good.path), lambda path: load_config(path))
    assert start.choice == Choice("default", "fallback-named") and start.problem is None
    assert start.config.mig_strategy == "mixed"
    with pytest.raises(InputError, match="cannot read it"):
        first_choice(Selection("/no/such/dir"), lambda path: load_config(path))
