"""The reload plan: what a SIGHUP's new config changes, and how, from the old and new config alone
(the daemon's reload carries it out: tests/reliability/test_signals.py, tests/e2e/test_serve.py)."""

from __future__ import annotations

import pytest

from nvplugin.config import Config, load_config
from nvplugin.plugin.endpoints import METRICS, PROBES
from nvplugin.plugin.reload import ReloadSteps, reload_steps
from tests.support.service import write_config


def config_of(text: str = "") -> Config:
    return load_config(write_config("version: v1\n" + text))


def test_the_same_config_changes_nothing() -> None:
    assert reload_steps(config_of(), config_of()) == ReloadSteps(
        (), in_place=True, keep_health=True
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nvplugin:\n  log: {level: debug}\n", ReloadSteps((), True, True)),
        ("nvplugin:\n  health: {recovery: {quietPeriod: 30s}}\n", ReloadSteps((), True, False)),
        ("nvplugin:\n  health: {xids: {ignore: [13]}}\n", ReloadSteps((), True, False)),
        (
            "nvplugin:\n  healthService: {notServingWithoutHealthyGpus: false}\n",
            ReloadSteps((), True, True),
        ),
        (
            "nvplugin:\n  metrics: {address: '127.0.0.1:9400'}\n",
            ReloadSteps((METRICS,), True, True),
        ),
        (
            "nvplugin:\n  healthProbes: {address: '127.0.0.1:8080'}\n",
            ReloadSteps((PROBES,), True, True),
        ),
        ("nvplugin:\n  resourceName: example.com/gpu\n", ReloadSteps((), False, True)),
        ("flags:\n  migStrategy: mixed\n", ReloadSteps((), False, True)),
        ("nvplugin:\n  allocationPolicy: simple\n", ReloadSteps((), False, True)),
        (
            "nvplugin:\n  allocationPolicy: simple\n  health: {enabled: false}\n",
            ReloadSteps((), False, False),
        ),
    ],
)
def test_what_each_change_does(text: str, expected: ReloadSteps) -> None:
    assert reload_steps(config_of(), config_of(text)) == expected
