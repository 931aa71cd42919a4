"""What the chart hands the plugin -- the chosen ConfigMap file, the container's environment and
flags -- read back by the plugin's own config loader, exactly as ``nvplugin serve`` reads them in
the pod. NVIDIA-style values arrive with NVIDIA's meaning, or fail at render time."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvplugin.config import Config, ReplicatedResource, load_config
from nvplugin.config.select import config_for, read_selection
from nvplugin.errors import InputError
from tests.support.helm import Rendered, render, render_error

# NVIDIA's chart values as its README shows them, with config files in config.map.
NVIDIA_STYLE: dict[str, Any] = {
    "config": {
        "default": "config0",
        "map": {
            "config0": (
                "version: v1\nflags:\n  migStrategy: none\n  failOnInitError: true\n"
                '  nvidiaDriverRoot: "/"\n  plugin:\n    passDeviceSpecs: false\n'
                "    deviceListStrategy: envvar\n    deviceIDStrategy: uuid\n"
            ),
            "time-sliced": (
                "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n"
                "    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n"
                "      replicas: 4\n"
            ),
        },
    },
    "compatWithCPUManager": True,
    "deviceListStrategy": ["envvar", "volume-mounts"],
    "deviceIDStrategy": "index",
    "failOnInitError": False,
    "migStrategy": "none",
    "nvidiaDriverRoot": "/run/nvidia/driver",
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
            flags["nvplugin.devicePluginDir"] = value
    return flags


def _load(rendered: Rendered, workdir: Path, name: str, label: str | None = None) -> Config:
    """The plugin's config in the pod of a node labelled ``label``: the ConfigMap mounted as a
    directory (if any) and the config the plugin's own selection takes from it, flags,
    environment."""
    volumes = {v["name"]: v for v in rendered.pod["volumes"]}
    env = rendered.env
    if "config" not in volumes:
        assert "CONFIG_FILE_SRCDIR" not in env
        return load_config(None, flags=_flags(rendered), env=env)
    assert "items" not in volumes["config"]["configMap"]  # the whole ConfigMap
    srcdir = workdir / name
    srcdir.mkdir(exist_ok=True)
    for key, text in rendered.one("ConfigMap")["data"].items():
        (srcdir / key).write_text(text)
    env = env | {"CONFIG_FILE_SRCDIR": str(srcdir)}
    selection = read_selection({}, env)
    assert selection is not None
    path = config_for(label, selection).path(selection.srcdir)
    return load_config(path, flags=_flags(rendered), env=env)


def _probes_off(config: dict[str, Any]) -> dict[str, Any]:
    """An effective config as ``as_dict`` gives it, without the health probes' address (which
    the chart sets while probes.enabled)."""
    nvplugin = {k: v for k, v in config["nvplugin"].items() if k != "healthProbes"}
    return config | {"nvplugin": nvplugin}


def test_defaults_are_the_plugins_defaults(workdir: Path) -> None:
    config = _load(render({}), workdir, "defaults")
    # The one setting the chart adds: the health endpoint its probes ask (probes.enabled).
    assert config.health_probe_address == "0.0.0.0:9401"
    assert _probes_off(config.as_dict()) == _probes_off(load_config(None).as_dict())


def test_nvidia_style_values_arrive_with_nvidias_meaning(workdir: Path) -> None:
    config = _load(render(NVIDIA_STYLE), workdir, "nvidia")
    assert config.pass_device_specs is True  # compatWithCPUManager
    assert config.device_list_strategy == ("envvar", "volume-mounts")
    assert config.device_id_strategy == "index"
    assert config.fail_on_init_error is False  # the value wins over the file
    assert config.driver_root == config.dev_root == "/run/nvidia/driver"
    assert config.mig_strategy == "none"
    assert config.sharing.time_slicing.resources == ()  # config0 is the default, not time-sliced
    # The same DaemonSet on a node labelled nvidia.com/device-plugin.config=time-sliced:
    labelled = _load(render(NVIDIA_STYLE), workdir, "nvidia", label="time-sliced")
    sliced = labelled.sharing.time_slicing
    assert sliced.resources == (ReplicatedResource("nvidia.com/gpu", 4),)
    assert sliced.served_name(sliced.resources[0]) == "nvidia.com/gpu.shared"
    chosen = dict(NVIDIA_STYLE, config={**NVIDIA_STYLE["config"], "default": "time-sliced"})
    assert _load(render(chosen), workdir, "sliced").sharing.time_slicing == sliced


def test_nvplugin_values_arrive(workdir: Path) -> None:
    values = {
        "resourceName": "example.com/a100",
        "allocationPolicy": "simple",
        "log": {"format": "console", "level": "warning"},
        "metrics": {"enabled": True},
        "config": {"map": {"c": {"nvplugin": {"health": {"xids": {"ignore": [79, 48]}}}}}},
    }
    config = _load(render(values), workdir, "nvplugin")
    assert config.resource_name == "example.com/a100"
    assert config.allocation_policy == "simple"
    assert (config.log.format, config.log.level) == ("console", "warning")
    assert config.metrics_address == "0.0.0.0:9400"
    assert config.health.ignore_xids == (79, 48)
    assert config.device_plugin_dir == "/var/lib/kubelet/device-plugins"


@pytest.mark.parametrize(
    "text",
    [
        "version: v1\nflags:\n  plugin:\n    deviceListStrategy: [envvar, magic]\n",
        "flags:\n  gdsEnabled: true\n",
        "sharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 49}]\n",
        "nvplugin:\n  helth: {}\n",
        "nvplugin:\n  health:\n    recovery:\n      quietPeriod: 30\n",
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 1}\n",
        "flags:\n  plugin:\n    passDeviceSpecs: 'yes please'\n",
    ],
)
def test_a_config_the_plugin_refuses_fails_at_render_time(workdir: Path, text: str) -> None:
    """Whatever the plugin would refuse at start, the chart refuses when it renders (the rules
    one schema can state; cross-key rules are the plugin's)."""
    path = workdir / "refused.yaml"
    path.write_text(text)
    with pytest.raises(InputError):
        load_config(str(path))
    error = render_error({"config": {"map": {"default": text}}})
    assert "values.config.map.default: " in error


def test_readme_example_config_is_valid_through_the_chart(workdir: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("### Example: an A100 + T4 node") :]
    match = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert match is not None
    example = match.group(1)
    direct = workdir / "example.yaml"
    direct.write_text(example)
    expected = load_config(str(direct))
    through_chart = _load(render({"config": {"map": {"example": example}}}), workdir, "ex")
    assert _probes_off(through_chart.as_dict()) | {"source": None} == _probes_off(
        expected.as_dict()
    ) | {"source": None}
