"""The reload plan: old config + new config -> which changed key paths a reload applies in place,
by serving the resources again, or only at the next start."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nvplugin.config import SETTINGS, load_config
from nvplugin.config.reload import ReloadPlan, reload_plan
from nvplugin.config.schema import Reload

Write = Callable[..., str]


def test_the_same_values_from_another_file_change_nothing(write: Write) -> None:
    text = "nvplugin:\n  log:\n    level: debug\n"
    old, new = load_config(write(text, "a.yaml")), load_config(write(text, "b.yaml"))
    assert old.source != new.source
    assert reload_plan(old, new) == ReloadPlan()
    assert reload_plan(old, old).changed == ()


@pytest.mark.parametrize(
    ("env", "plan"),
    [
        ({"NVPLUGIN_LOG_LEVEL": "debug"}, ReloadPlan(in_place=("nvplugin.log.level",))),
        ({"NVPLUGIN_LOG_FORMAT": "console"}, ReloadPlan(in_place=("nvplugin.log.format",))),
        (
            {"DP_DISABLE_HEALTHCHECKS": "48", "DP_ENABLE_HEALTHCHECKS": "13"},
            ReloadPlan(in_place=("nvplugin.health.xids.ignore", "nvplugin.health.xids.critical")),
        ),
        (
            {"NVPLUGIN_METRICS_ADDRESS": "127.0.0.1:0"},
            ReloadPlan(in_place=("nvplugin.metrics.address",)),
        ),
        (
            {"NVPLUGIN_HEALTH_PROBE_ADDRESS": "127.0.0.1:0"},
            ReloadPlan(in_place=("nvplugin.healthProbes.address",)),
        ),
        # Accepted for NVIDIA's files, not acted on: nothing to apply.
        (
            {"DEVICE_DISCOVERY_STRATEGY": "nvml"},
            ReloadPlan(in_place=("flags.deviceDiscoveryStrategy",)),
        ),
        ({"IMEX_REQUIRED": "true"}, ReloadPlan(in_place=("imex.required",))),
        (
            {"NVPLUGIN_RESOURCE_NAME": "example.com/gpu"},
            ReloadPlan(reserve=("nvplugin.resourceName",)),
        ),
        ({"MIG_STRATEGY": "mixed"}, ReloadPlan(reserve=("flags.migStrategy",))),
        (
            {"DEVICE_LIST_STRATEGY": "cdi-cri", "NVIDIA_DEV_ROOT": "/run/nvidia/driver"},
            ReloadPlan(reserve=("flags.nvidiaDevRoot", "flags.plugin.deviceListStrategy")),
        ),
        (
            {"NVPLUGIN_DEVICE_PLUGIN_DIR": "/tmp/dp"},
            ReloadPlan(reserve=("nvplugin.devicePluginDir",)),
        ),
        ({"NVPLUGIN_ALLOCATION_BUDGET": "1s"}, ReloadPlan(reserve=("nvplugin.allocationBudget",))),
        ({"FAIL_ON_INIT_ERROR": "false"}, ReloadPlan(restart=("flags.failOnInitError",))),
        (
            {"CONTAINER_DRIVER_ROOT": "/host"},
            ReloadPlan(restart=("flags.plugin.containerDriverRoot",)),
        ),
        (
            {"NVPLUGIN_LOG_LEVEL": "debug", "FAIL_ON_INIT_ERROR": "false", "MIG_STRATEGY": "mixed"},
            ReloadPlan(
                in_place=("nvplugin.log.level",),
                reserve=("flags.migStrategy",),
                restart=("flags.failOnInitError",),
            ),
        ),
    ],
)
def test_each_change_by_its_mode(env: dict[str, str], plan: ReloadPlan) -> None:
    assert reload_plan(load_config(None), load_config(None, env=env)) == plan
    # Going back is the same plan.
    assert reload_plan(load_config(None, env=env), load_config(None)) == plan


def test_time_slicing_and_resources_are_served_again(write: Write) -> None:
    old = load_config(None)
    new = load_config(
        write(
            "resources:\n  gpus:\n  - {pattern: '*T4*', name: t4}\n"
            "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
            "    - {name: gpu, replicas: 2}\n"
            "flags:\n  gfd: {sleepInterval: 30s}\n"
        )
    )
    assert reload_plan(old, new) == ReloadPlan(
        in_place=("flags.gfd.sleepInterval",),
        reserve=(
            "resources.gpus",
            "sharing.timeSlicing.renameByDefault",
            "sharing.timeSlicing.resources",
        ),
    )


def test_what_is_applied_in_place() -> None:
    """The daemon applies in place exactly these (where and how the labels are written, log, the
    health monitor's rules, the health service, the two HTTP endpoints) besides the settings it
    does not act on: a setting declared in place needs that code too."""
    in_place = [
        path
        for path, setting in SETTINGS.items()
        if setting.reload is Reload.IN_PLACE and not setting.inert
    ]
    assert in_place == [
        "flags.useNodeFeatureAPI",
        "flags.gfd.oneshot",
        "flags.gfd.noTimestamp",
        "flags.gfd.sleepInterval",
        "flags.gfd.outputFile",
        "flags.gfd.machineTypeFile",
        "nvplugin.log.format",
        "nvplugin.log.level",
        "nvplugin.health.enabled",
        "nvplugin.health.xids.ignore",
        "nvplugin.health.xids.critical",
        "nvplugin.health.xids.only",
        "nvplugin.health.recovery.quietPeriod",
        "nvplugin.health.poll.interval",
        "nvplugin.health.poll.window",
        "nvplugin.health.fabric.enabled",
        "nvplugin.health.ecc.enabled",
        "nvplugin.health.ecc.threshold",
        "nvplugin.health.rowRemap.enabled",
        "nvplugin.health.nvlink.enabled",
        "nvplugin.health.nvlink.threshold",
        "nvplugin.health.pcie.enabled",
        "nvplugin.health.pcie.threshold",
        "nvplugin.healthService.notServingWithoutHealthyGpus",
        "nvplugin.metrics.address",
        "nvplugin.healthProbes.address",
    ]
    assert all(s.reload is Reload.IN_PLACE for s in SETTINGS.values() if s.inert)
