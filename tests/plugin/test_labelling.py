"""The daemon's labeller in process: when the feature file is written, what its timestamp says,
where it goes when the settings change, and that a file it cannot write never stops serving."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from nvplugin.config import Config, load_config
from nvplugin.config.pod import PodIdentity
from nvplugin.nodesession import open_node
from nvplugin.plugin.labelling import Labeller
from nvplugin.plugin.metrics import Metrics
from nvplugin.plugin.nodefeature import NodeFeaturePublisher
from nvplugin.plugin.tasks import Tasks
from nvplugin.rm.plan import plan_for
from tests.support.labelcases import read_fixture

STAMP = "nvidia.com/gfd.timestamp"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def _config(output: Path | None, **env: str) -> Config:
    values = {"GFD_OUTPUT_FILE": str(output)} if output is not None else {}
    return load_config(None, env={**values, **env})


def _read(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_the_timestamp_changes_with_the_labels_only() -> None:
    async def body() -> None:
        output = Path(tempfile.mkdtemp()) / "gfd"
        clock = Clock()
        tasks = Tasks("test")
        labeller = Labeller(clock, tasks=tasks)
        with open_node("dgx-a100") as node:
            config = _config(output)
            try:
                await labeller.update(config, node, plan_for(config, node.topology.gpus))
                first = _read(output)
                assert first.pop(STAMP) == "1700000000" and first == read_fixture("dgx-a100")
                clock.now += 100
                await labeller.update(config, node, plan_for(config, node.topology.gpus))
                assert _read(output)[STAMP] == "1700000000"  # nothing changed
                shared = _config(output, MIG_STRATEGY="single")
                await labeller.update(shared, node, plan_for(shared, node.topology.gpus))
                assert _read(output)[STAMP] == "1700000100"  # mig.strategy appeared
                quiet = _config(output, GFD_NO_TIMESTAMP="true")
                await labeller.update(quiet, node, plan_for(quiet, node.topology.gpus))
                assert STAMP not in _read(output)
            finally:
                await tasks.close()
                await labeller.close()
            assert not output.exists()

    asyncio.run(body())


def test_waiting_for_gpus_labels_a_node_without_gpus() -> None:
    async def body() -> None:
        output = Path(tempfile.mkdtemp()) / "gfd"
        output.write_text("nvidia.com/gpu.count=8\n")  # left by a plugin that was killed
        machine = output.with_name("machine")
        machine.write_text("Some Server\n")
        tasks = Tasks("test")
        labeller = Labeller(Clock(), tasks=tasks)
        config = _config(output, GFD_MACHINE_TYPE_FILE=str(machine))
        await labeller.update(config, None, None)
        assert _read(output) == {STAMP: "1700000000", "nvidia.com/gpu.machine": "Some-Server"}
        await tasks.close()
        await labeller.close()
        assert not output.exists()

    asyncio.run(body())


def test_unset_output_file_removes_it_and_a_bad_one_is_only_logged() -> None:
    async def body() -> None:
        directory = Path(tempfile.mkdtemp())
        output = directory / "gfd"
        tasks = Tasks("test")
        labeller = Labeller(Clock(), tasks=tasks)
        with open_node("no-numa") as node:
            config = _config(output)
            plan = plan_for(config, node.topology.gpus)
            await labeller.update(config, node, plan)
            assert output.exists() and labeller.path == str(output)
            await labeller.update(_config(None), node, plan)
            assert not output.exists() and labeller.path is None
            bad = _config(directory / "missing" / "gfd")
            await labeller.update(bad, node, plan)  # logged, not raised
            assert labeller.path is None and os.listdir(directory) == []
            await tasks.close()
            await labeller.close()

    asyncio.run(body())


def test_nodefeature_mode_removes_the_file_and_without_node_name_is_only_logged() -> None:
    """Switching to the NodeFeature mode by a reload removes the feature file (GFD writes one or
    the other); without NODE_NAME nothing can be published: said once, serving goes on."""

    async def body() -> None:
        output = Path(tempfile.mkdtemp()) / "gfd"
        tasks = Tasks("test")
        publisher = NodeFeaturePublisher(
            PodIdentity(namespace="gpu-system"), Metrics(), tasks=tasks
        )
        labeller = Labeller(Clock(), publisher=publisher, tasks=tasks)
        with open_node("dgx-a100") as node:
            try:
                config = _config(output)
                await labeller.update(config, node, plan_for(config, node.topology.gpus))
                assert output.exists()
                api = _config(output, GFD_USE_NODE_FEATURE_API="true")
                assert api.use_node_feature_api
                await labeller.update(api, node, plan_for(api, node.topology.gpus))
                await labeller.update(api, node, plan_for(api, node.topology.gpus))
                assert not output.exists() and publisher.published is None
            finally:
                await tasks.close()
                await labeller.close()
        os.rmdir(output.parent)

    asyncio.run(body())
