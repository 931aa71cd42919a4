"""The reliability scenarios at test scale (``make soak`` runs them at full scale): faults,
failing NVML, reloads under traffic and load, each against a real ``nvplugin serve``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tests.support.harness import Outcome
from tests.support.reliability import floods, scenarios

Scenario = Callable[[scenarios.Scale], Awaitable[Outcome]]


@pytest.mark.parametrize(
    "scenario",
    [
        scenarios.kubelet_restarts,
        scenarios.plugin_kills,
        scenarios.kubelet_down,
        scenarios.gpu_lost_during_watch,
        scenarios.event_wait_failures,
        scenarios.sighup_during_traffic,
        scenarios.load,
        scenarios.health_storm,
        scenarios.idle_connections,
        floods.preferred_flood,
        floods.allocate_flood,
        floods.mig_kubelet_restarts,
    ],
    ids=lambda s: s.__name__,
)
def test_scenario_loses_nothing(scenario: Scenario) -> None:
    outcome = asyncio.run(asyncio.wait_for(scenario(scenarios.TEST), 120))
    outcome.assert_ok()
    assert outcome.iterations > 0
