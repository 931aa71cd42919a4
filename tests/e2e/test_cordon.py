"""Per-GPU cordon by Node annotation as a cluster runs it: ``nvplugin serve`` as a real
subprocess beside the fake kubelet, following its Node on a real HTTP API server
(tests/support/kubeapi.py, through the client library). Annotating the Node withdraws exactly
the named GPUs' units (whole GPUs, MIG devices) from the kubelet, live; removing it restores
them; an entry naming no GPU is said once and ignored."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from nvplugin.fakekubelet.devicemanager import DeviceManager
from nvplugin.nodefile.reader import load_node
from nvplugin.plugin.cordon import ANNOTATION, HAMI_ANNOTATION
from tests.support.configmap import ConfigMapVolume
from tests.support.kubeapi import KubeApiServer
from tests.support.serve import kubelet_with, new_dir, scrape
from tests.support.waiting import WAIT_S

NODE = "dgx-a100-cordon"
ARGS = ("--simulate", "dgx-a100-mig", "--mig-strategy", "mixed", "--api-backoff-s", "0.05", "0.5")
"""serve on a MIG node, MIG mixed, retrying the API quickly."""
GPU = "nvidia.com/gpu"
MIG_SMALL = "nvidia.com/mig-1g.5gb"
TOPOLOGY = load_node("dgx-a100-mig").topology()


def run(body: Callable[[], Awaitable[None]], timeout: float = 150) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


def units(*gpus: int) -> frozenset[str]:
    """Every device ID the kubelet sees of ``gpus`` under MIG mixed: the GPU itself, or its MIG
    devices."""
    out: set[str] = set()
    for index in gpus:
        gpu = TOPOLOGY.gpus[index]
        out |= {d.uuid for d in gpu.mig_devices} if gpu.mig_enabled else {gpu.uuid}
    return frozenset(out)


def unhealthy(m: DeviceManager) -> frozenset[str]:
    return frozenset().union(*(m.unhealthy_devices(r) for r in m.resources()))


def exactly(expected: frozenset[str]) -> Callable[[DeviceManager], bool]:
    return lambda m: (
        m.is_registered(GPU) and m.is_registered(MIG_SMALL) and unhealthy(m) == expected
    )


def test_annotation_withdraws_and_restores_exactly_the_named_gpus() -> None:
    async def body() -> None:
        async with KubeApiServer() as api:
            api.add_node(NODE)
            env = {
                "NODE_NAME": NODE,
                "KUBECONFIG": api.kubeconfig(),
                "NVPLUGIN_METRICS_ADDRESS": "127.0.0.1:0",
            }
            async with kubelet_with(new_dir(), *ARGS, env=env) as (kubelet, serve):
                wait = kubelet.observer.wait_for
                await wait(exactly(frozenset()), WAIT_S, "everything healthy")

                # nvplugin's annotation by index (a MIG GPU), HAMi's by UUID (a whole GPU).
                api.annotate(NODE, ANNOTATION, "1")
                api.annotate(NODE, HAMI_ANNOTATION, TOPOLOGY.gpus[7].uuid)
                await wait(exactly(units(1, 7)), WAIT_S, "GPU 1's MIG devices and GPU 7 out")
                metrics = await scrape(serve)
                assert 'nvplugin_gpu_unhealthy{gpu="7",signal="cordon"} 1.0' in metrics

                # One entry names no GPU: said once, the rest applies.
                api.annotate(NODE, ANNOTATION, "1, GPU-not-here, 3")
                await wait(exactly(units(1, 3, 7)), WAIT_S, "GPU 3 out too")
                await serve.wait_log(
                    "cordon annotation names no GPU of this node; ignored",
                    where=lambda line: line.get("entry") == "GPU-not-here",
                )
                api.touch(NODE)  # the same annotation seen again: not said again

                # Removed: restored.
                api.annotate(NODE, ANNOTATION, None)
                await wait(exactly(units(7)), WAIT_S, "only GPU 7 left out")
                api.annotate(NODE, HAMI_ANNOTATION, None)
                await wait(exactly(frozenset()), WAIT_S, "everything healthy again")
                said = [
                    line
                    for line in serve.lines()
                    if line.get("event") == "cordon annotation names no GPU of this node; ignored"
                ]
                assert len(said) == 1
                metrics = await scrape(serve)
                assert 'nvplugin_gpu_unhealthy{gpu="7",signal="cordon"} 0.0' in metrics

    run(body)


def test_with_per_node_configs_one_watch_serves_label_and_cordon() -> None:
    async def body() -> None:
        volume = ConfigMapVolume({"default": "version: v1\nflags:\n  migStrategy: mixed\n"})
        async with KubeApiServer() as api:
            api.add_node(NODE)
            env = {
                "CONFIG_FILE_SRCDIR": volume.path,
                "NODE_NAME": NODE,
                "KUBECONFIG": api.kubeconfig(),
            }
            args = ("--simulate", "dgx-a100-mig", "--api-backoff-s", "0.05", "0.5")
            async with kubelet_with(new_dir(), *args, env=env) as (kubelet, _serve):
                wait = kubelet.observer.wait_for
                await wait(exactly(frozenset()), WAIT_S, "everything healthy")
                api.annotate(NODE, ANNOTATION, TOPOLOGY.gpus[2].uuid.lower())
                await wait(exactly(units(2)), WAIT_S, "GPU 2's MIG devices out")
                assert api.open_watches == 1
                api.annotate(NODE, ANNOTATION, "")
                await wait(exactly(frozenset()), WAIT_S, "everything healthy again")

    run(body)


def test_without_permission_to_read_the_node_the_cordon_is_off_said_once() -> None:
    """GFD's NodeFeature mode without per-node configs: NODE_NAME and a token, but no grant on
    Nodes. The cordon says it is off, once, and does not retry against the API."""

    async def body() -> None:
        async with KubeApiServer() as api:
            api.add_node(NODE)
            api.forbidden = True
            env = {"NODE_NAME": NODE, "KUBECONFIG": api.kubeconfig()}
            async with kubelet_with(new_dir(), *ARGS, env=env) as (kubelet, serve):
                await kubelet.observer.wait_for(exactly(frozenset()), WAIT_S, "serving")
                line = await serve.wait_log("gpu cordon by node annotation off")
                assert "no permission to read the Node" in line["reason"]
                # One GET, refused; no list, no watch, no retries at the backoff's 0.05 s.
                assert [r.method for r in api.requests] == ["GET"]
                assert not api.watches()
                assert len(serve.events("gpu cordon by node annotation off")) == 1

    run(body)


def test_a_cordoned_gpu_takes_its_time_slicing_replicas_with_it(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - {name: nvidia.com/gpu, replicas: 3}\n"
    )
    node = load_node("workstation-4gpu").topology()

    async def body() -> None:
        async with KubeApiServer() as api:
            api.add_node(NODE)
            env = {"NODE_NAME": NODE, "KUBECONFIG": api.kubeconfig()}
            args = ("--simulate", "workstation-4gpu", "--config-file", str(config))
            async with kubelet_with(new_dir(), *args, env=env) as (kubelet, _serve):
                wait = kubelet.observer.wait_for

                def replicas_of(*gpus: int) -> Callable[[DeviceManager], bool]:
                    uuids = {node.gpus[i].uuid for i in gpus}
                    return lambda m: (
                        len(m.devices(GPU)) == 12
                        and {d.split("::")[0] for d in m.unhealthy_devices(GPU)} == uuids
                        and len(m.unhealthy_devices(GPU)) == 3 * len(uuids)
                    )

                await wait(replicas_of(), WAIT_S, "12 healthy replicas")
                api.annotate(NODE, HAMI_ANNOTATION, node.gpus[1].uuid)
                await wait(replicas_of(1), WAIT_S, "GPU 1's 3 replicas out")
                api.annotate(NODE, HAMI_ANNOTATION, None)
                await wait(replicas_of(), WAIT_S, "all back")

    run(body)
