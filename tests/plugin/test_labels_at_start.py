"""The feature file at start under per-node configs: written once, whole, after discovery.

The node's label usually answers before discovery ends; applying its config then must not
write GFD's labels of a node without GPUs (two labels, the machine type unknown) for an NFD
worker to read in the meantime -- it would strip the node's GPU labels until its next pass.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading

from nvplugin.config import load_config
from nvplugin.config.select import first_choice, read_selection
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.nodesession import NodeSession, open_node
from nvplugin.plugin.daemon import Daemon
from nvplugin.plugin.selection import ApiTiming, Following
from tests.support.configmap import ConfigMapVolume
from tests.support.kubeapi import KubeApiServer
from tests.support.waiting import WAIT_S, until

GPU = "nvidia.com/gpu"
NODE = "node-a"
LABEL = "nvidia.com/device-plugin.config"
TWO_WAY = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 2\n"
)


class GatedNvml:
    """An opener that waits for :attr:`release` (discovery still running meanwhile)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.called = threading.Event()

    def __call__(self, simulate: str | None) -> NodeSession:
        self.called.set()
        if not self.release.wait(WAIT_S):
            raise AssertionError("discovery was never released")
        return open_node(simulate)


def test_the_label_chosen_before_discovery_ends_writes_no_gpu_less_labels() -> None:
    async def body() -> None:
        plugins = tempfile.mkdtemp()
        labels_dir = tempfile.mkdtemp()
        feature_file = os.path.join(labels_dir, "gfd")
        volume = ConfigMapVolume({"default": "version: v1\n", "two-way": TWO_WAY})
        async with KubeApiServer() as api:
            api.add_node(NODE, {LABEL: "two-way"})
            env = {"KUBECONFIG": api.kubeconfig()}
            flags = {"nvplugin.devicePluginDir": plugins, "flags.gfd.outputFile": feature_file}

            def load(path: str | None) -> object:
                return load_config(path, flags=flags, env=env)

            selection = read_selection({"config_file_srcdir": volume.path, "node_name": NODE}, env)
            assert selection is not None
            start = first_choice(selection, load)  # type: ignore[arg-type]
            opener = GatedNvml()
            daemon = Daemon(
                start.config,
                simulate="workstation-4gpu",
                opener=opener,
                following=Following(selection, start, load),  # type: ignore[arg-type]
                api_timing=ApiTiming(0.05, 0.5),
            )
            async with FakeKubelet(plugins) as kubelet:
                task = asyncio.create_task(daemon.run(handle_signals=False))
                try:
                    selector = daemon.selector
                    assert selector is not None
                    # The label's config is applied while discovery still waits.
                    await until(lambda: selector.active.name == "two-way", "the label's config")
                    assert opener.called.is_set()
                    await asyncio.sleep(0)  # the apply's label update, if any, is done
                    assert not os.path.exists(feature_file), "labels written before discovery"

                    opener.release.set()
                    await kubelet.observer.wait_for(
                        lambda m: len(m.devices(GPU)) == 8, WAIT_S, "8 replicas"
                    )
                    await until(lambda: os.path.exists(feature_file), "the feature file")
                    with open(feature_file) as f:
                        text = f.read()
                    assert "nvidia.com/gpu.count=4\n" in text
                    assert "nvidia.com/gpu.replicas=2\n" in text
                finally:
                    daemon.stop()
                    assert await task == 0

    asyncio.run(asyncio.wait_for(body(), 60))
