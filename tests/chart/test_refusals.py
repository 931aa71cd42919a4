"""What nvplugin's chart refuses at render, and what it can no longer be made to render: NVIDIA's
version in image.tag, a config.map that leaves an unlabelled node without a config (NVIDIA's
chart's own rule and message), and values that would inject YAML into the pod spec."""

from __future__ import annotations

import shutil
from pathlib import Path

import helm_python as helm
import pytest

from nvplugin.chart.values import NO_DEFAULT, no_default_problem
from tests.support.helm import CHART_DIR, render, render_error
from tests.support.nvidia import NVPLUGIN_IMAGE, values, with_nvplugin_image

INJECTED = "x\nhostPID: true"
SCHEMA_ERROR = r"values don.t meet the specifications|jsonschema"


@pytest.mark.parametrize("tag", ["v0.17.4", "v0.20.0", "v0.17.1-ubi9"])
def test_nvidias_version_in_image_tag_fails_the_render_naming_the_key(tag: str) -> None:
    data = with_nvplugin_image(values("v0.20.0"))
    data["image"]["tag"] = tag
    error = render_error(data)
    assert f'values.image.tag: "{tag}" is a version of NVIDIA\'s plugin, not of nvplugin' in error
    assert "cannot use these values (1)" in error


@pytest.mark.parametrize("tag", ["", "0.1.0", "0.1.0-rc1", "latest", "v1.2.3"])
def test_nvplugins_own_tags_render(tag: str) -> None:
    rendered = render({"image": {"repository": NVPLUGIN_IMAGE, "tag": tag}})
    assert rendered.container["image"] == f"{NVPLUGIN_IMAGE}:{tag or '0.1.0'}"


def test_a_digest_makes_the_tag_unused_so_it_is_not_refused() -> None:
    digest = "sha256:" + "a" * 64
    rendered = render({"image": {"repository": NVPLUGIN_IMAGE, "tag": "v0.17.4", "digest": digest}})
    assert rendered.container["image"] == f"{NVPLUGIN_IMAGE}@{digest}"


# --- config.map without a default: NVIDIA's rule -------------------------------------------------


def test_several_configs_without_a_default_fail_with_nvidias_message() -> None:
    error = render_error({"config": {"map": {"a100": "", "t4": ""}}})
    assert (
        "values.config.map: A default config must be provided when more than one "
        "configuration is set in 'config.map'." in error
    )
    assert "config.fallbackStrategies: [named, single]; config.map's entries: a100, t4" in error


CASES = [
    (names, default, fallbacks)
    for names in ((), ("a",), ("default",), ("a", "b"), ("a", "default"))
    for default in ("", "a")
    for fallbacks in (
        (),
        ("named",),
        ("single",),
        ("empty",),
        ("named", "single"),
        ("single", "named"),
    )
]


def test_the_templates_apply_the_rule_nvplugin_migrate_applies() -> None:
    """Every combination of entries, default and fallbacks: the render fails exactly when
    no_default_problem (what migrate reads) says so, with its message."""
    checked = 0
    for names, default, fallbacks in CASES:
        if default and default not in names:
            continue  # another refusal (config.default naming no entry)
        config = {
            "map": dict.fromkeys(names, ""),
            "default": default,
            "fallbackStrategies": list(fallbacks),
        }
        expected = no_default_problem(list(names), default, fallbacks)
        try:
            render({"config": config})
        except helm.HelmError as exc:
            assert expected is not None, (config, str(exc))
            assert f"values.config.map: {expected}" in str(exc)
        else:
            assert expected is None, config
        checked += 1
    assert checked > 40
    assert no_default_problem(["a", "b"], "", ["named", "single"]).startswith(NO_DEFAULT)  # type: ignore[union-attr]


# --- strings rendered as strings ------------------------------------------------------------------


def _without_schema(tmp_path: Path) -> Path:
    """A copy of the chart without values.schema.json: what the templates alone do with a value
    the schema would refuse."""
    copy = tmp_path / "nvplugin"
    shutil.copytree(CHART_DIR, copy)
    (copy / "values.schema.json").unlink()
    return copy


@pytest.mark.parametrize(
    "values_",
    [
        {"priorityClassName": INJECTED},
        {"runtimeClassName": INJECTED},
        {"image": {"repository": NVPLUGIN_IMAGE, "pullPolicy": f"Always{INJECTED[1:]}"}},
        {"updateStrategy": {"type": f"OnDelete{INJECTED[1:]}"}},
        {"namespaceOverride": f"kube-system{INJECTED[1:]}"},
        {"config": {"map": {"a": ""}, "default": "a"}, "fullnameOverride": f"nv{INJECTED[1:]}"},
    ],
    ids=[
        "priorityClassName",
        "runtimeClassName",
        "pullPolicy",
        "updateStrategy",
        "namespace",
        "fullname",
    ],
)
def test_a_newline_in_a_value_cannot_inject_host_pid(values_: dict, tmp_path: Path) -> None:
    # The schema refuses it, as the API server would refuse the name ...
    with pytest.raises(helm.HelmError, match=SCHEMA_ERROR):
        render(values_)
    # ... and without the schema the templates still render it as one string.
    try:
        rendered = render(values_, chart_dir=_without_schema(tmp_path))
    except helm.HelmError as exc:
        assert "hostPID" not in str(exc).split("error")[0]
        return
    for obj in rendered.objects:
        if obj["kind"] == "DaemonSet":
            assert "hostPID" not in obj["spec"]["template"]["spec"]


def test_a_config_name_cannot_inject_a_key(tmp_path: Path) -> None:
    data = {"config": {"map": {"a": "", "b\nhostPID: true": ""}, "default": "a"}}
    with pytest.raises(helm.HelmError):
        render(data)
    rendered = render(data, chart_dir=_without_schema(tmp_path))
    assert sorted(rendered.one("ConfigMap")["data"]) == ["a", "b\nhostPID: true"]


@pytest.mark.parametrize("name", ["true", "null", "123", "0x1f"])
def test_names_yaml_would_retype_stay_strings(name: str) -> None:
    """Valid names that YAML reads as a boolean, null or number when unquoted."""
    pod = render({"priorityClassName": name, "runtimeClassName": name}).pod
    assert pod["priorityClassName"] == name
    assert pod["runtimeClassName"] == name


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("priorityClassName", "System-Node-Critical"),
        ("runtimeClassName", "nvidia_runtime"),
        ("namespaceOverride", "a.b"),
        ("image", {"repository": "registry.example.com/nvplugin", "tag": "0.1.0 x"}),
        ("config", {"map": {"a/b": ""}, "default": "a/b"}),
        ("config", {"name": "My-Configs"}),
    ],
)
def test_the_schema_refuses_what_the_api_server_refuses(key: str, value: object) -> None:
    with pytest.raises(helm.HelmError, match=SCHEMA_ERROR):
        render({key: value})


# --- GPU Feature Discovery without the plugin -------------------------------------------------


def test_a_gfd_only_release_is_refused_not_rendered_to_nothing() -> None:
    data = with_nvplugin_image(values("v0.20.0"))
    data["devicePlugin"]["enabled"] = False
    data["gfd"]["enabled"] = True
    error = render_error(data)
    assert "values.devicePlugin.enabled: false: with gfd.enabled, NVIDIA's chart deploys GPU" in (
        error
    )
    assert "nvplugin has no labels-only pod" in error
    # Without gfd, devicePlugin.enabled=false still means NVIDIA's: no plugin, nothing rendered.
    data["gfd"]["enabled"] = False
    assert render(data).objects == []
