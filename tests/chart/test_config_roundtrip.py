"""What the chart hands the plugin — the ConfigMap's file, the container's environment and flags —
read back by the plugin's own config loader, exactly as ``nvplugin serve`` reads them in the pod."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvplugin.config import Config, load_config
from nvplugin.errors import InputError
from tests.chart.rendering import CHART_DIR, Rendered, render

CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "health-and-env": {
        "resourceName": "example.com/a100",
        "allocationPolicy": "simple",
        "failOnInitError": False,
        "log": {"format": "console", "level": "warning"},
        "health": {
            "enabled": False,
            "ignoredXids": [79, 48],
            "criticalXids": [13],
            "recoveryQuietSeconds": 90,
        },
        "config": {"pre_start_required": True, "log": {"level": "warning"}},
    },
    "config-string": {
        "config": (
            "# my nvplugin config\nversion: v1\nallocation_policy: simple\n"
            "health:\n  recovery:\n    quiet_s: 2.5\n"
        ),
    },
}


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="nvp-chart-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _flags(rendered: Rendered) -> dict[str, object]:
    """The serve flags in the container's args that are config settings."""
    args = rendered.container["args"]
    assert args[0] == "serve"
    flags: dict[str, object] = {}
    for name, value in zip(args[1::2], args[2::2], strict=True):
        if name == "--device-plugin-dir":
            flags["device_plugin_dir"] = value
    return flags


def _load(rendered: Rendered, workdir: Path, name: str) -> Config:
    path = workdir / f"{name}.yaml"
    path.write_text(rendered.config_text)
    return load_config(str(path), flags=_flags(rendered), env=rendered.env)


def test_defaults_are_the_plugins_defaults(workdir: Path) -> None:
    config = _load(render(CASES["defaults"]), workdir, "defaults")
    plain = load_config(None)
    assert config.as_dict() | {"source": None} == plain.as_dict()


def test_every_chart_setting_arrives(workdir: Path) -> None:
    config = _load(render(CASES["health-and-env"]), workdir, "health-and-env")
    assert config.resource_name == "example.com/a100"
    assert config.allocation_policy == "simple"
    assert config.fail_on_init_error is False
    assert config.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert config.pre_start_required is True
    assert (config.log.format, config.log.level) == ("console", "warning")
    assert config.health.enabled is False
    assert config.health.ignore_xids == (79, 48)
    assert config.health.critical_xids == (13,)
    assert config.health.recovery_quiet_s == 90.0


def test_config_string_arrives(workdir: Path) -> None:
    config = _load(render(CASES["config-string"]), workdir, "config-string")
    assert config.allocation_policy == "simple"
    assert config.health.recovery_quiet_s == 2.5


@pytest.mark.parametrize(
    ("values", "key", "attribute", "expected"),
    [
        ({"passDeviceSpecs": True}, "pass_device_specs", "pass_device_specs", True),
        ({"deviceIDStrategy": "index"}, "device_id_strategy", "device_id_strategy", "index"),
        (
            {"deviceListStrategy": "volume-mounts"},
            "device_list_strategy",
            "device_list_strategy",
            "volume-mounts",
        ),
    ],
)
def test_strategy_values_are_honoured_or_refused_never_dropped(
    workdir: Path, values: dict[str, Any], key: str, attribute: str, expected: object
) -> None:
    # The plugin knows these keys (issue 6): the value the chart writes must arrive as set.
    # (A plugin that did not know them would refuse them; never both silent and lost.)
    config = _load(render(values), workdir, key)
    assert key in config.as_dict()
    held = getattr(config, attribute)
    assert held in (expected, [expected], (expected,))


def test_readme_example_config_is_valid_through_the_chart(workdir: Path) -> None:
    text = (CHART_DIR / "README.md").read_text()
    match = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert match is not None
    example = match.group(1)
    direct = workdir / "example.yaml"
    direct.write_text(example)
    expected = load_config(str(direct))
    through_chart = _load(render({"config": example}), workdir, "example-chart")
    assert through_chart.as_dict() | {"source": None} == expected.as_dict() | {"source": None}


def test_service_link_variables_would_stop_the_plugin() -> None:
    # Why the chart sets enableServiceLinks: false: Kubernetes would inject these for a Service
    # named "nvplugin", and the plugin refuses NVPLUGIN_* variables that are not settings.
    with pytest.raises(InputError, match="NVPLUGIN_SERVICE_HOST: not a setting"):
        load_config(None, env={"NVPLUGIN_SERVICE_HOST": "10.0.0.7"})
    assert render().pod["enableServiceLinks"] is False
