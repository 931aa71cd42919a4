"""The polled health signals as a cluster runs them: ``nvplugin serve`` (a real subprocess)
with its config's signal settings, a node file scripting the fabric, and the fake kubelet."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from nvplugin.fakekubelet.devicemanager import DeviceManager
from nvplugin.nodefile.reader import load_node
from tests.support.serve import kubelet_with, new_dir
from tests.support.waiting import WAIT_S

GPU = "nvidia.com/gpu"
NODE = """
version: v1
name: fabric
gpus:
  - {name: H100 SXM, nvswitch_links: 4}
  - {name: H100 SXM, nvswitch_links: 4}
links: |2
        GPU0  GPU1
  GPU0  X     NV4
  GPU1  NV4   X
events: {events}
"""


def test_fabric_registration_seen_by_the_kubelet(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    events = [
        {"after_s": 0, "gpu": 1, "fabric": "in-progress"},
        {"after_s": 2, "gpu": 1, "fabric": "completed"},
        {"after_s": 0, "gpu": 0, "pcie_replays": 1},
    ]
    node.write_text(NODE.replace("{events}", json.dumps(events)))
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nnvplugin:\n  health:\n    poll: {interval: 200ms}\n"
        "    recovery: {quietPeriod: 500ms}\n    fabric: {enabled: true}\n"
    )
    uuids = [g.uuid for g in load_node(str(node)).topology().gpus]

    def unhealthy(*gpus: int) -> Callable[[DeviceManager], bool]:
        want = {uuids[i] for i in gpus}
        return lambda m: m.is_registered(GPU) and m.unhealthy_devices(GPU) == want

    async def body() -> None:
        args = ("--simulate", str(node), "--config-file", str(config))
        async with kubelet_with(new_dir(), *args) as (kubelet, serve):
            await kubelet.observer.wait_for(unhealthy(1), WAIT_S, "GPU 1 in progress")
            line = await serve.wait_log("gpu unhealthy", where=lambda x: x.get("gpu") == 1)
            assert line["signal"] == "fabric" and line["reason"] == "fabric in-progress"
            await kubelet.observer.wait_for(unhealthy(), WAIT_S, "GPU 1 completed")
            await serve.wait_log("gpu health signal cleared", where=lambda x: x.get("gpu") == 1)

    asyncio.run(asyncio.wait_for(body(), 120))
