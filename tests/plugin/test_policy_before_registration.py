"""The daemon registers only once the allocation policy is built: the kubelet's first
GetPreferredAllocation never waits for start-up work. The build runs off the event loop, so the
socket already answers health checks meanwhile."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from typing import Any

import pytest

from nvplugin.allocator import make_policy
from nvplugin.config import load_config
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.plugin.daemon import Daemon
from nvplugin.rm import policies as policy_module
from tests.support.service import health_check
from tests.support.waiting import WAIT_S, until

GPU = "nvidia.com/gpu"


def test_registration_waits_for_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    started, go = threading.Event(), threading.Event()
    budgets: list[float] = []

    def slow_policy(name: str, topology: Any, *, budget_s: float) -> Any:
        budgets.append(budget_s)
        started.set()
        assert go.wait(WAIT_S), "the test never let the policy build finish"
        return make_policy(name, topology, budget_s=budget_s)

    monkeypatch.setattr(policy_module, "make_policy", slow_policy)

    async def body() -> None:
        directory = tempfile.mkdtemp()
        flags = {"nvplugin.devicePluginDir": directory, "nvplugin.allocationBudget": "250ms"}
        daemon = Daemon(load_config(None, flags=flags), simulate="dgx-h100")
        socket = os.path.join(directory, "nvplugin-gpu.sock")
        try:
            async with FakeKubelet(directory) as kubelet:
                task = asyncio.create_task(daemon.run(handle_signals=False))
                assert await asyncio.to_thread(started.wait, WAIT_S)
                await until(lambda: os.path.exists(socket), "the socket, served while building")
                _, reason = await health_check(socket)
                assert "not registered" in reason
                assert not kubelet.devices.endpoints(GPU)
                go.set()
                await kubelet.wait_registered(GPU, timeout=WAIT_S)
                assert budgets == [0.25]
                daemon.stop()
                assert await task == 0
        finally:
            go.set()

    asyncio.run(asyncio.wait_for(body(), 3 * WAIT_S))
