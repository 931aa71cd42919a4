"""NVIDIA's documented config files load unchanged, with NVIDIA's meaning; what nvplugin does not
implement is refused naming the key.

Each file here restates an example from NVIDIA's k8s-device-plugin README (v0.17-v0.20) or the GPU
Operator's time-slicing guide, written for these tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from nvplugin.config import Config, ReplicatedResource, load_config
from nvplugin.errors import InputError

Write = Callable[..., str]

README_FLAGS = """\
version: v1
flags:
  migStrategy: "none"
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
"""

TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""

TIME_SLICING_RENAMED = """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""

# The GPU Operator's guide: a ConfigMap whose key "any" holds this file, referenced from the
# ClusterPolicy (devicePlugin.config.name / default).
GPU_OPERATOR = """\
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: false
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""

WITH_GFD = """\
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  useNodeFeatureAPI: true
  plugin:
    deviceListStrategy: [envvar, volume-mounts]
  gfd:
    oneshot: false
    noTimestamp: false
    sleepInterval: 60s
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    machineTypeFile: /sys/class/dmi/id/product_name
"""


def test_the_readme_config_file(write: Write) -> None:
    config = load_config(write(README_FLAGS))
    assert config == Config(source=config.source)  # every value is NVIDIA's default


def test_time_slicing(write: Write) -> None:
    config = load_config(write(TIME_SLICING))
    ts = config.sharing.time_slicing
    assert ts.resources == (ReplicatedResource("nvidia.com/gpu", 10),)
    assert ts.rename_by_default is False and ts.fail_requests_greater_than_one is False
    assert ts.served_name(ts.resources[0]) == "nvidia.com/gpu"


def test_time_slicing_renamed_and_failing_requests_over_one(write: Write) -> None:
    ts = load_config(write(TIME_SLICING_RENAMED)).sharing.time_slicing
    assert ts.served_name(ts.resources[0]) == "nvidia.com/gpu.shared"
    assert ts.fail_requests_greater_than_one is True


def test_the_gpu_operator_time_slicing_configmap(write: Write) -> None:
    config = load_config(write(GPU_OPERATOR))
    assert config.mig_strategy == "none"
    assert config.sharing.time_slicing.resources == (ReplicatedResource("nvidia.com/gpu", 4),)


def test_a_json_config(write: Write) -> None:
    document = {
        "version": "v1",
        "flags": {"migStrategy": "none", "plugin": {"deviceIDStrategy": "index"}},
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
    }
    config = load_config(write(json.dumps(document), "config.json"))
    assert config.device_id_strategy == "index"
    assert config.sharing.time_slicing.resources == (ReplicatedResource("nvidia.com/gpu", 2),)


def test_version_is_optional(write: Write) -> None:
    config = load_config(write(README_FLAGS.replace("version: v1\n", "")))
    assert config == Config(source=config.source)


def test_gfd_settings_are_read(write: Write) -> None:
    """GFD's part of a shared file sets where and how nvplugin serve publishes the node's
    labels: the feature file, or with useNodeFeatureAPI the NodeFeature object."""
    config = load_config(write(WITH_GFD.replace("  useNodeFeatureAPI: true\n", "")))
    assert config.device_list_strategy == ("envvar", "volume-mounts")
    assert config.gfd.output_file == "/etc/kubernetes/node-feature-discovery/features.d/gfd"
    assert config.gfd.sleep_interval_s == 60.0 and config.gfd.no_timestamp is False
    assert config.gfd.machine_type_file == "/sys/class/dmi/id/product_name"
    assert config.use_node_feature_api is False and config.notes == ()
    assert load_config(write(WITH_GFD)).use_node_feature_api is True
    with pytest.raises(InputError, match=r'key "flags\.gfd\.oneshot": nvplugin does not'):
        load_config(
            write(
                WITH_GFD.replace("oneshot: false", "oneshot: true").replace(
                    "  useNodeFeatureAPI: true\n", ""
                )
            )
        )


def test_nvidia_driver_and_dev_roots(write: Write) -> None:
    config = load_config(write("flags:\n  nvidiaDriverRoot: /run/nvidia/driver\n"))
    assert config.driver_root == config.dev_root == "/run/nvidia/driver"
    config = load_config(
        write("flags:\n  nvidiaDriverRoot: /run/nvidia/driver\n  nvidiaDevRoot: /\n")
    )
    assert (config.driver_root, config.dev_root) == ("/run/nvidia/driver", "/")


def test_shared_devices_allocation_policy(write: Write) -> None:
    text = TIME_SLICING + "flags:\n  plugin:\n    sharedDevicesAllocationPolicy: packed\n"
    assert load_config(write(text)).sharing.time_slicing.allocation == "packed"
    env = {"SHARED_DEVICES_ALLOCATION_POLICY": "packed"}
    assert load_config(None, env=env).sharing.time_slicing.allocation == "packed"


def test_resources_gpus_are_honoured(write: Write) -> None:
    """NVIDIA's plugin ignores resources.gpus with a warning; nvplugin serves them."""
    config = load_config(write("resources:\n  gpus:\n  - {pattern: '*A100*', name: a100}\n"))
    assert [(p.pattern, p.name) for p in config.resources.gpus] == [("*A100*", "nvidia.com/a100")]


@pytest.mark.parametrize(
    ("text", "key", "what"),
    [
        ("version: v1\nimex:\n  channelIDs: [0]\n  required: true\n", "imex.channelIDs", "IMEX"),
        ("flags:\n  gdsEnabled: true\n", "flags.gdsEnabled", "GPUDirect Storage"),
        ("flags:\n  mofedEnabled: true\n", "flags.mofedEnabled", "MOFED"),
        ("flags:\n  gdrcopyEnabled: true\n", "flags.gdrcopyEnabled", "GDRCopy"),
        ("flags:\n  deviceDiscoveryStrategy: tegra\n", "flags.deviceDiscoveryStrategy", "device"),
        (
            "flags:\n  plugin:\n    nvidiaCTKPath: /usr/local/bin/nvidia-ctk\n",
            "flags.plugin.nvidiaCTKPath",
            "generating CDI specs",
        ),
    ],
)
def test_unsupported_settings_are_refused_naming_the_key(
    write: Write, text: str, key: str, what: str
) -> None:
    with pytest.raises(InputError) as caught:
        load_config(write(text))
    message = str(caught.value)
    assert f'key "{key}": nvplugin does not support {what}' in message
    assert "yet" in message


def test_unsupported_settings_at_their_defaults_are_fine(write: Write) -> None:
    text = (
        "flags:\n  gdsEnabled: false\n  mofedEnabled: false\n  gdrcopyEnabled: false\n"
        "  deviceDiscoveryStrategy: nvml\n  mpsRoot: /run/nvidia/mps\n"
        "imex:\n  channelIDs: []\n  required: false\nresources:\n  mig: []\n"
    )
    config = load_config(write(text))
    assert config == Config(source=config.source)


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"GDS_ENABLED": "true"}, "GDS_ENABLED"),
        ({"MOFED_ENABLED": "1"}, "MOFED_ENABLED"),
        ({"IMEX_CHANNEL_IDS": "0"}, "IMEX_CHANNEL_IDS"),
        ({"DEVICE_DISCOVERY_STRATEGY": "vfio"}, "DEVICE_DISCOVERY_STRATEGY"),
    ],
)
def test_unsupported_nvidia_variables_are_refused(env: dict[str, str], name: str) -> None:
    with pytest.raises(InputError) as caught:
        load_config(None, env=env)
    assert str(caught.value).startswith(f"environment variable {name} (config key")
    assert "does not support" in str(caught.value)


def test_unsupported_nvidia_variables_at_their_defaults_are_fine() -> None:
    env = {
        "GDS_ENABLED": "false",
        "MIG_STRATEGY": "none",
        "DEVICE_DISCOVERY_STRATEGY": "auto",
        "MPS_ROOT": "/run/nvidia/mps",  # NVIDIA's chart sets it on every plugin container
    }
    assert load_config(None, env=env) == Config()


def test_mps_root_is_accepted_as_nvidias_chart_sets_it(write: Write) -> None:
    """NVIDIA's chart sets MPS_ROOT in every plugin container, MPS or not: any absolute path is
    accepted (and not acted on: sharing.mps, MPS itself, is refused)."""
    assert load_config(None, env={"MPS_ROOT": "/run/nvidia/mps"}) == Config()
    assert load_config(write("flags:\n  mpsRoot: /var/run/mps\n")).mps_root == "/var/run/mps"
    with pytest.raises(InputError) as caught:
        load_config(None, env={"MPS_ROOT": "run/mps"})
    assert 'environment variable MPS_ROOT (config key "flags.mpsRoot")' in str(caught.value)
    assert "not an absolute path" in str(caught.value)


@pytest.mark.parametrize("value", ["true", "1", "T", "yes"])
def test_cdi_disable_hooks_is_refused_by_name(value: str) -> None:
    """NVIDIA v0.20's CDI_DISABLE_HOOKS: nvplugin generates no CDI spec, so it cannot honour
    it; refused naming it, never silently ignored."""
    with pytest.raises(InputError) as caught:
        load_config(None, env={"CDI_DISABLE_HOOKS": value})
    message = str(caught.value)
    assert message.startswith(f"environment variable CDI_DISABLE_HOOKS='{value}': ")
    assert "does not support generating CDI specs yet" in message


@pytest.mark.parametrize("value", ["", "false", "0", "F"])
def test_cdi_disable_hooks_at_nvidias_default_is_fine(value: str) -> None:
    assert load_config(None, env={"CDI_DISABLE_HOOKS": value}) == Config()
