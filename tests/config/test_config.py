"""Config: precedence flag > env > file > default, strictness (key path, close suggestions only),
durations, notes, and the effective config."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nvplugin.allocator import POLICY_NAMES
from nvplugin.config import SETTINGS, Config, load_config
from nvplugin.config.schema import Str, parse_duration
from nvplugin.errors import InputError
from nvplugin.node.health import DEFAULT_IGNORED_XIDS, HealthSettings
from nvplugin.node.signals import SignalSettings

Write = Callable[..., str]

FULL = """\
version: v1
flags:
  failOnInitError: false
  plugin:
    kubeletSocket: /tmp/k.sock
nvplugin:
  resourceName: example.com/gpu
  allocationPolicy: simple
  devicePluginDir: /tmp/dp
  preStartRequired: true
  log:
    format: console
    level: debug
  health:
    enabled: false
    xids:
      ignore: [48]
      critical: [13]
    recovery:
      quietPeriod: 2.5s
  healthService:
    notServingWithoutHealthyGpus: false
  metrics:
    address: 127.0.0.1:0
"""


def error_of(write: Write, text: str | None = None, **kwargs: object) -> str:
    path = write(text) if text is not None else None
    with pytest.raises(InputError) as caught:
        load_config(path, **kwargs)  # type: ignore[arg-type]
    assert caught.value.exit_code == 2
    return str(caught.value)


def test_defaults() -> None:
    config = load_config(None)
    assert config == Config()
    assert config.resource_name == "nvidia.com/gpu"
    assert config.allocation_policy == "best-effort"
    assert config.kubelet_socket_path == "/var/lib/kubelet/device-plugins/kubelet.sock"
    assert config.fail_on_init_error is True
    assert config.device_list_strategy == ("envvar",)
    assert config.device_id_strategy == "uuid"
    assert config.dev_root == "/" and config.container_driver_root == "/driver-root"
    assert config.health.settings() == HealthSettings(signals=SignalSettings())
    assert config.notes == ()


def test_every_nvplugin_key_from_a_file(write: Write) -> None:
    path = write(FULL)
    config = load_config(path)
    assert config.resource_name == "example.com/gpu"
    assert config.allocation_policy == "simple"
    assert config.device_plugin_dir == "/tmp/dp"
    assert config.kubelet_socket_path == "/tmp/k.sock"
    assert config.fail_on_init_error is False
    assert config.pre_start_required is True
    assert (config.log.format, config.log.level) == ("console", "debug")
    settings = config.health.settings()
    assert settings.enabled is False
    assert settings.ignored_xids == (DEFAULT_IGNORED_XIDS | {48}) - {13}
    assert settings.recovery_quiet_s == 2.5
    assert config.health_service.not_serving_without_healthy_gpus is False
    assert config.metrics_address == "127.0.0.1:0"
    assert config.source == path


def test_kubelet_socket_defaults_to_the_directory() -> None:
    config = load_config(None, flags={"nvplugin.devicePluginDir": "/tmp/x"})
    assert config.kubelet_socket_path == "/tmp/x/kubelet.sock"


def test_precedence_flag_over_env_over_file_over_default(write: Write) -> None:
    path = write("nvplugin:\n  resourceName: file.com/gpu\n  allocationPolicy: simple\n")
    env = {"NVPLUGIN_RESOURCE_NAME": "env.com/gpu", "HOME": "/root"}
    assert load_config(path).resource_name == "file.com/gpu"
    assert load_config(path, env=env).resource_name == "env.com/gpu"
    config = load_config(
        path,
        env=env,
        flags={"nvplugin.resourceName": "flag.com/gpu", "nvplugin.log.level": None},
    )
    assert config.resource_name == "flag.com/gpu"
    assert config.allocation_policy == "simple"  # only the file set it
    assert config.log.level == "info"  # a flag given as None is "not given"


def test_nvidia_settings_follow_the_same_precedence(write: Write) -> None:
    path = write("flags:\n  plugin:\n    deviceIDStrategy: index\n    passDeviceSpecs: true\n")
    assert load_config(path).device_id_strategy == "index"
    env = {"DEVICE_ID_STRATEGY": "uuid", "PASS_DEVICE_SPECS": "false"}
    assert load_config(path, env=env).device_id_strategy == "uuid"
    assert load_config(path, env=env).pass_device_specs is False
    flags = {"flags.plugin.deviceIDStrategy": "index"}
    assert load_config(path, env=env, flags=flags).device_id_strategy == "index"


def test_env_values_are_parsed_and_checked(write: Write) -> None:
    env = {
        "FAIL_ON_INIT_ERROR": "false",
        "NVPLUGIN_PRE_START_REQUIRED": "1",
        "NVPLUGIN_LOG_FORMAT": "json",
        "DEVICE_LIST_STRATEGY": "envvar,cdi-cri",
    }
    config = load_config(None, env=env)
    assert config.fail_on_init_error is False
    assert config.pre_start_required is True
    assert config.log.format == "json"
    assert config.device_list_strategy == ("envvar", "cdi-cri")
    assert load_config(None, env={"NVPLUGIN_LOG_FORMAT": ""}).log.format is None  # empty = unset
    message = error_of(write, env={"FAIL_ON_INIT_ERROR": "maybe"})
    assert message.startswith('environment variable FAIL_ON_INIT_ERROR (config key "flags.')
    assert "'maybe'" in message
    message = error_of(write, env={"NVPLUGIN_RESOURCE_NAM": "x/y"})
    assert (
        "NVPLUGIN_RESOURCE_NAM" in message and 'did you mean "NVPLUGIN_RESOURCE_NAME"?' in message
    )


def test_service_link_variables_never_stop_the_plugin(write: Write) -> None:
    """What Kubernetes sets in every pod of the namespace once a Service called nvplugin (or
    nvplugin-metrics) exists."""
    links = {
        "NVPLUGIN_SERVICE_HOST": "10.96.0.7",
        "NVPLUGIN_SERVICE_PORT": "9400",
        "NVPLUGIN_SERVICE_PORT_METRICS": "9400",
        "NVPLUGIN_PORT": "tcp://10.96.0.7:9400",
        "NVPLUGIN_PORT_9400_TCP": "tcp://10.96.0.7:9400",
        "NVPLUGIN_PORT_9400_TCP_PROTO": "tcp",
        "NVPLUGIN_PORT_9400_TCP_PORT": "9400",
        "NVPLUGIN_PORT_9400_TCP_ADDR": "10.96.0.7",
        "NVPLUGIN_METRICS_SERVICE_HOST": "10.96.0.8",
        "NVPLUGIN_METRICS_PORT_9400_UDP_ADDR": "10.96.0.8",
    }
    assert load_config(None, env=links) == Config()
    assert "NVPLUGIN_SERVICE_HOSTS" in error_of(write, env={"NVPLUGIN_SERVICE_HOSTS": "x"})


def test_nvidia_health_variables(write: Write) -> None:
    config = load_config(None, env={"DP_DISABLE_HEALTHCHECKS": "48, 79"})
    assert config.health.ignored_xids == DEFAULT_IGNORED_XIDS | {48, 79}
    assert load_config(None, env={"DP_DISABLE_HEALTHCHECKS": "all"}).health.enabled is False
    assert load_config(None, env={"DP_DISABLE_HEALTHCHECKS": "xids"}).health.enabled is False
    config = load_config(None, env={"DP_ENABLE_HEALTHCHECKS": "13,45"})
    assert config.health.ignored_xids == DEFAULT_IGNORED_XIDS - {13, 45}
    config = load_config(
        None, env={"DP_DISABLE_HEALTHCHECKS": "48", "DP_ENABLE_HEALTHCHECKS": "all"}
    )
    assert config.health.ignored_xids == frozenset()
    message = error_of(write, env={"DP_DISABLE_HEALTHCHECKS": "48,x"})
    assert "DP_DISABLE_HEALTHCHECKS" in message and "'x'" in message
    # NVIDIA's documented way to watch only chosen Xids (its own code then watches none).
    config = load_config(
        None, env={"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "48, 13"}
    )
    assert config.health.enabled is True
    assert config.health.only_xids == (48, 13)
    settings = config.health.settings()
    assert [xid for xid in (13, 31, 48, 63, 79) if settings.counts(xid)] == [13, 48]
    config = load_config(
        None, env={"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "all"}
    )
    assert config.health.enabled and config.health.ignored_xids == frozenset()
    message = error_of(
        write, env={"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "48,x"}
    )
    assert 'DP_ENABLE_HEALTHCHECKS (config key "nvplugin.health.xids.only")' in message


def test_nvidia_health_variables_set_the_whole_xid_policy(write: Write) -> None:
    """The variables win over the file's Xid lists (flags > environment > file), all of them:
    a file's ``ignore`` does not linger under an environment's ``only``."""
    path = write("nvplugin:\n  health:\n    xids:\n      ignore: [48]\n")
    env = {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"}
    health = load_config(path, env=env).health
    assert (health.only_xids, health.ignore_xids) == ((79,), ())
    path = write("nvplugin:\n  health:\n    xids:\n      only: [48]\n")
    health = load_config(path, env={"DP_DISABLE_HEALTHCHECKS": "63"}).health
    assert (health.only_xids, health.ignore_xids) == ((), (63,))


def test_only_xids_and_ignore_rules_are_one_or_the_other(write: Write) -> None:
    message = error_of(
        write, "nvplugin:\n  health:\n    xids:\n      only: [48]\n      critical: [13]\n"
    )
    assert 'key "nvplugin.health.xids.only": lists the only Xids that count' in message
    assert "nvplugin.health.xids.critical has nothing to do" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "nvplugin:\n  resourceNam: a/b\n",
            'unknown key "nvplugin.resourceNam"; did you mean "nvplugin.resourceName"?',
        ),
        (
            "nvplugin:\n  health:\n    xid: {}\n",
            'unknown key "nvplugin.health.xid"; did you mean "nvplugin.health.xids"?',
        ),
        (
            "flags:\n  plugin:\n    deviceListStrategys: envvar\n",
            'did you mean "flags.plugin.deviceListStrategy"?',
        ),
        # Not close: no suggestion, the valid keys instead (NVIDIA chart's key at the top level).
        ("default: x\n", 'unknown key "default"; valid keys here: version, flags, resources'),
        (
            "nvplugin:\n  log:\n    colour: red\n",
            'unknown key "nvplugin.log.colour"; valid keys here: format, level',
        ),
        (
            "resource_name: a/b\n",
            'unknown key "resource_name"; valid keys here: version, flags',
        ),
        (
            "flags:\n  failOnInitError: 'no'\n",
            'key "flags.failOnInitError": expected true or false',
        ),
        (
            "nvplugin:\n  health:\n    enabled: 1\n",
            'key "nvplugin.health.enabled": expected true or false, got 1',
        ),
        (
            "nvplugin:\n  health:\n    recovery:\n      quietPeriod: 30\n",
            'key "nvplugin.health.recovery.quietPeriod": expected a duration string such as 30s',
        ),
        (
            "nvplugin:\n  health:\n    recovery:\n      quietPeriod: soon\n",
            "'soon' is not a duration",
        ),
        (
            "nvplugin:\n  health:\n    recovery:\n      quietPeriod: -1s\n",
            "'-1s' is not a duration",
        ),
        (
            "nvplugin:\n  health:\n    xids:\n      ignore: [a]\n",
            'key "nvplugin.health.xids.ignore[0]": expected an integer',
        ),
        ("nvplugin:\n  health: true\n", 'key "nvplugin.health": expected a mapping'),
        (
            "nvplugin:\n  resourceName: gpu\n",
            'key "nvplugin.resourceName": the ResourceName "gpu" is invalid',
        ),
        ("nvplugin:\n  resourceName: 7\n", "expected a string, got 7"),
        (
            "nvplugin:\n  allocationPolicy: fastest\n",
            "'fastest' is not one of best-effort, simple",
        ),
        (
            "flags:\n  plugin:\n    deviceListStrategy: [envvar, envvar]\n",
            "key \"flags.plugin.deviceListStrategy[1]\": 'envvar' is listed twice",
        ),
        (
            "flags:\n  plugin:\n    deviceListStrategy: []\n",
            "expected at least 1 item(s)",
        ),
        (
            "flags:\n  plugin:\n    deviceIDStrategy: serial\n",
            "'serial' is not one of uuid, index",
        ),
        (
            "flags:\n  plugin:\n    cdiAnnotationPrefix: cdi.k8s.io\n",
            "must end with '/'",
        ),
        ("version: v2\n", "version 'v2' is not supported; the supported version is v1"),
        ("- a\n- b\n", "expected a mapping of keys, got a list"),
        ("nvplugin:\n  log: [\n", "line 3, column 1: not valid YAML"),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
            "      replicas: 1\n",
            'key "sharing.timeSlicing.resources[0].replicas": 1 is not between 2 and',
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu}\n",
            'key "sharing.timeSlicing.resources[0].replicas": is missing',
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replica: 2}\n",
            'unknown key "replica"; did you mean "replicas"?',
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2, "
            "devices: [0, 1]}\n",
            "nvplugin does not support replicating a subset of a resource's GPUs yet",
        ),
    ],
)
def test_bad_files_name_the_key(write: Write, text: str, expected: str) -> None:
    message = error_of(write, text)
    assert message.startswith("config file /tmp/")
    assert expected in message


def test_missing_file() -> None:
    with pytest.raises(InputError) as caught:
        load_config("/tmp/does-not-exist/nvplugin.yaml")
    assert str(caught.value) == "config file /tmp/does-not-exist/nvplugin.yaml: no such file"


def test_empty_file_and_empty_sections_are_the_defaults(write: Write) -> None:
    for text in ("", "version: v1\n", "flags:\nsharing:\n  timeSlicing:\n"):
        path = write(text)
        assert load_config(path).as_dict() == {**load_config(None).as_dict(), "source": path}


def test_bad_flags_name_the_flag_and_key(write: Write) -> None:
    message = error_of(write, flags={"nvplugin.resourceName": "kubernetes.io/gpu"})
    assert message.startswith('flag --resource-name (config key "nvplugin.resourceName"): ')
    assert "kubernetes.io/" in message
    assert "--allocation-policy" in error_of(write, flags={"nvplugin.allocationPolicy": "x"})


def test_repeated_and_comma_separated_list_flags() -> None:
    flags = {"flags.plugin.deviceListStrategy": ("envvar,volume-mounts", "cdi-cri")}
    config = load_config(None, flags=flags)
    assert config.device_list_strategy == ("envvar", "volume-mounts", "cdi-cri")


def test_policy_choices_are_the_allocators() -> None:
    kind = SETTINGS["nvplugin.allocationPolicy"].kind
    assert isinstance(kind, Str) and kind.choices == POLICY_NAMES


def test_durations_read_like_kubernetes() -> None:
    assert parse_duration("30s") == 30.0
    assert parse_duration("1m30s") == 90.0
    assert parse_duration("1h") == 3600.0
    assert parse_duration("250ms") == 0.25
    assert parse_duration("0") == 0.0
    for bad in ("30", "s", "1d", "-5s", "1e9h", "9" * 80 + "s"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_effective_config_dict(write: Write) -> None:
    config = load_config(write(FULL))
    shown = config.as_dict()
    assert shown["nvplugin"]["resourceName"] == "example.com/gpu"
    assert shown["flags"]["plugin"]["kubeletSocket"] == "/tmp/k.sock"
    assert shown["nvplugin"]["health"]["xids"]["ignoredEffective"] == sorted(
        (DEFAULT_IGNORED_XIDS | {48}) - {13}
    )
    assert shown["nvplugin"]["health"]["recovery"]["quietPeriod"] == "2.5s"
    assert shown["flags"]["plugin"]["deviceListStrategy"] == ["envvar"]
