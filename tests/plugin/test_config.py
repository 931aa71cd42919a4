"""Config: precedence flag > env > file > default, and strictness (key path + closest key)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from nvplugin.allocator import POLICY_NAMES
from nvplugin.config import KEYS, Config, load_config
from nvplugin.errors import InputError
from nvplugin.node.health import DEFAULT_IGNORED_XIDS, HealthSettings

FULL = """\
version: v1
resource_name: example.com/gpu
allocation_policy: simple
device_plugin_dir: /tmp/dp
kubelet_socket: /tmp/k.sock
fail_on_init_error: false
pre_start_required: true
log:
  format: console
  level: debug
health:
  enabled: false
  xids:
    ignore: [48]
    critical: [13]
  recovery:
    quiet_s: 2.5
"""


def write(text: str) -> str:
    directory = tempfile.mkdtemp()
    path = os.path.join(directory, "config.yaml")
    Path(path).write_text(text)
    return path


def error_of(text: str | None = None, **kwargs: object) -> str:
    path = write(text) if text is not None else None
    with pytest.raises(InputError) as caught:
        load_config(path, **kwargs)  # type: ignore[arg-type]
    assert caught.value.exit_code == 2
    return str(caught.value)


def test_defaults() -> None:
    config = load_config(None)
    assert config.resource_name == "nvidia.com/gpu"
    assert config.allocation_policy == "best-effort"
    assert config.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert config.kubelet_socket_path == "/var/lib/kubelet/device-plugins/kubelet.sock"
    assert config.fail_on_init_error is True
    assert config.pre_start_required is False
    assert config.log.format is None and config.log.level == "info"
    assert config.health.settings() == HealthSettings()


def test_every_key_from_a_file() -> None:
    path = write(FULL)
    config = load_config(path)
    assert config == Config(
        resource_name="example.com/gpu",
        allocation_policy="simple",
        device_plugin_dir="/tmp/dp",
        kubelet_socket="/tmp/k.sock",
        fail_on_init_error=False,
        pre_start_required=True,
        log=config.log,
        health=config.health,
        source=path,
    )
    assert (config.log.format, config.log.level) == ("console", "debug")
    settings = config.health.settings()
    assert settings.enabled is False
    assert settings.ignored_xids == (DEFAULT_IGNORED_XIDS | {48}) - {13}
    assert settings.recovery_quiet_s == 2.5
    assert config.kubelet_socket_path == "/tmp/k.sock"


def test_kubelet_socket_defaults_to_the_directory() -> None:
    config = load_config(None, flags={"device_plugin_dir": "/tmp/x"})
    assert config.kubelet_socket_path == "/tmp/x/kubelet.sock"


def test_precedence_flag_over_env_over_file_over_default() -> None:
    path = write("version: v1\nresource_name: file.com/gpu\nallocation_policy: simple\n")
    env = {"NVPLUGIN_RESOURCE_NAME": "env.com/gpu", "HOME": "/root"}
    assert load_config(path).resource_name == "file.com/gpu"
    assert load_config(path, env=env).resource_name == "env.com/gpu"
    config = load_config(path, env=env, flags={"resource_name": "flag.com/gpu", "log_level": None})
    assert config.resource_name == "flag.com/gpu"
    assert config.allocation_policy == "simple"  # only the file set it
    assert config.log.level == "info"  # a flag given as None is "not given"


def test_env_values_are_parsed_and_checked() -> None:
    env = {
        "NVPLUGIN_FAIL_ON_INIT_ERROR": "false",
        "NVPLUGIN_PRE_START_REQUIRED": "1",
        "NVPLUGIN_LOG_FORMAT": "json",
    }
    config = load_config(None, env=env)
    assert config.fail_on_init_error is False
    assert config.pre_start_required is True
    assert config.log.format == "json"
    assert load_config(None, env={"NVPLUGIN_LOG_FORMAT": ""}).log.format is None  # empty = unset
    message = error_of(env={"NVPLUGIN_FAIL_ON_INIT_ERROR": "maybe"})
    assert "NVPLUGIN_FAIL_ON_INIT_ERROR" in message and "'maybe'" in message
    message = error_of(env={"NVPLUGIN_RESOURCE_NAM": "x/y"})
    assert "NVPLUGIN_RESOURCE_NAM" in message and "did you mean NVPLUGIN_RESOURCE_NAME?" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "version: v1\nresource_nam: a/b\n",
            'unknown key "resource_nam"; did you mean "resource_name"?',
        ),
        (
            "version: v1\nhealth:\n  xid: {}\n",
            'unknown key "health.xid"; did you mean "health.xids"?',
        ),
        (
            "version: v1\nhealth:\n  recovery:\n    quiet: 1\n",
            'unknown key "health.recovery.quiet"; did you mean "health.recovery.quiet_s"?',
        ),
        (
            "version: v1\nsharing:\n  mps: {}\n",
            'unknown key "sharing.mps"; valid keys here: timeSlicing',
        ),
        (
            "version: v1\nflags: {}\n",
            'unknown key "flags"; valid keys here: version, resource_name',
        ),
        (
            "version: v1\nlog:\n  colour: red\n",
            'unknown key "log.colour"; valid keys here: format, level',
        ),
        (
            "version: v1\nfail_on_init_error: 'no'\n",
            'key "fail_on_init_error": expected true or false',
        ),
        (
            "version: v1\nhealth:\n  enabled: 1\n",
            'key "health.enabled": expected true or false, got 1',
        ),
        (
            "version: v1\nhealth:\n  recovery:\n    quiet_s: soon\n",
            'key "health.recovery.quiet_s": expected a number',
        ),
        (
            "version: v1\nhealth:\n  recovery:\n    quiet_s: -1\n",
            'key "health.recovery.quiet_s": -1.0 is negative',
        ),
        (
            "version: v1\nhealth:\n  xids:\n    ignore: 48\n",
            'key "health.xids.ignore": expected a list of integers',
        ),
        (
            "version: v1\nhealth:\n  xids:\n    ignore: [a]\n",
            'key "health.xids.ignore": expected a list of integers',
        ),
        ("version: v1\nhealth: true\n", 'key "health": expected a mapping'),
        (
            "version: v1\nresource_name: gpu\n",
            'key "resource_name": the ResourceName "gpu" is invalid',
        ),
        ("version: v1\nresource_name: 7\n", 'key "resource_name": expected a string, got 7'),
        ("version: v1\nresource_name: null\n", 'key "resource_name": expected a string, got null'),
        (
            "version: v1\nallocation_policy: fastest\n",
            "'fastest' is not one of best-effort, simple",
        ),
        ("version: v1\nlog:\n  level: trace\n", "key \"log.level\": 'trace' is not one of debug"),
        ("resource_name: a/b\n", 'key "version" is missing; set it to v1'),
        ("version: v2\n", "key \"version\": 'v2' (str) is not supported"),
        ("- a\n- b\n", "expected a mapping of keys, got a list"),
        ("version: v1\nlog: [\n", "line 3, column 1: not valid YAML"),
    ],
)
def test_bad_files_name_the_key(text: str, expected: str) -> None:
    message = error_of(text)
    assert message.startswith("config file /tmp/")
    assert expected in message


def test_missing_file() -> None:
    with pytest.raises(InputError) as caught:
        load_config("/tmp/does-not-exist/nvplugin.yaml")
    message = str(caught.value)
    assert message == "config file /tmp/does-not-exist/nvplugin.yaml: no such file"


def test_empty_file_needs_a_version() -> None:
    assert 'key "version" is missing' in error_of("")
    path = write("version: v1\n")
    assert load_config(path).as_dict() == {**load_config(None).as_dict(), "source": path}


def test_bad_flags_name_the_flag_and_key() -> None:
    message = error_of(flags={"resource_name": "kubernetes.io/gpu"})
    assert message.startswith('flag --resource-name (config key "resource_name"): ')
    assert "kubernetes.io/" in message
    assert "--allocation-policy" in error_of(flags={"allocation_policy": "x"})


def test_policy_choices_are_the_allocators() -> None:
    key = next(k for k in KEYS if k.path == "allocation_policy")
    assert key.choices == POLICY_NAMES


def test_effective_config_dict() -> None:
    config = load_config(write(FULL))
    shown = config.as_dict()
    assert shown["resource_name"] == "example.com/gpu"
    assert shown["kubelet_socket"] == "/tmp/k.sock"
    assert shown["health"]["xids"]["ignored_effective"] == sorted(
        (DEFAULT_IGNORED_XIDS | {48}) - {13}
    )
    assert shown["health"]["recovery"]["quiet_s"] == 2.5
