"""The extender's verdict on a node equals ``nvplugin admit``'s on that node: a stream of
generated pods admitted one by one by the fake kubelet beside the real plugin (the admission run
behind ``nvplugin admit``), and before each, the extender asked about the same pod on the NRT
object written from that kubelet's state (tests/support/nrtgen.py, not the topology exporter).
Every policy and scope, static CPUs, init containers and sidecars, several resources, MIG."""

from __future__ import annotations

import asyncio
import random

import pytest

from nvplugin.admit.admission import Admission, AdmitSettings
from nvplugin.extender.nrt import parse_nrt
from nvplugin.extender.view import View
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.nodesession import load_topology
from tests.support.nrtgen import nrt_from_admission

pytestmark = pytest.mark.process

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
MIG = ("nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb")


def random_container(rng: random.Random, name: str, resources: tuple[str, ...], guaranteed: bool,
                     **kw: object) -> Container:  # fmt: skip
    limits: dict[str, str | int] = {}
    for resource in rng.sample(resources, rng.randint(1, min(2, len(resources)))):
        if rng.random() < 0.8:
            limits[resource] = rng.choice((1, 1, 2, 2, 3, 4))
    if guaranteed:
        cpu = rng.choice(("1", "2", "4", "8", "16", "500m"))
        limits.update({"cpu": cpu, "memory": "1Gi"})
        return Container.of(name, limits=limits, **kw)  # type: ignore[arg-type]
    return Container.of(name, {"cpu": "250m"}, limits, **kw)  # type: ignore[arg-type]


def random_pod(rng: random.Random, name: str, resources: tuple[str, ...]) -> Pod:
    guaranteed = rng.random() < 0.7
    containers = [
        random_container(rng, f"c{i}", resources, guaranteed) for i in range(rng.randint(1, 2))
    ]
    inits = []
    if rng.random() < 0.3:
        inits.append(random_container(rng, "init", resources, guaranteed, init=True))
    if rng.random() < 0.15:
        inits.append(
            random_container(
                rng, "sidecar", resources, guaranteed, init=True, restart_policy="Always"
            )
        )
    return Pod.of(name, containers, inits)


def compare_stream(settings: AdmitSettings, resources: tuple[str, ...], seed: int, n: int) -> int:
    """Admit ``n`` generated pods; assert the extender agreed before each. Rejections seen."""
    topology = load_topology(settings.simulate)
    rng = random.Random(seed)
    rejected = 0

    async def main() -> None:
        nonlocal rejected
        async with Admission(settings, topology) as admission:
            for i in range(n):
                pod = random_pod(rng, f"pod-{i}", resources)
                view = View()
                view.set_nrt(parse_nrt(nrt_from_admission("node", admission)))
                # Off the loop, as the extender judges (the managers' allocation runs its own).
                ours = await asyncio.to_thread(view.verdict, "node", pod)
                naive = await asyncio.to_thread(view.verdict, "node", pod, naive=True)
                real = await admission.admit(pod)
                assert ours is not None and naive is not None
                where = f"pod {i}: {pod}\nkubelet: {real.reason}: {real.message}"
                if real.reason is not None and real.reason.startswith("OutOf"):
                    assert ours.admit, where  # the scheduler's node fit, not the extender's
                    continue
                assert (ours.admit, ours.reason, ours.message) == (
                    real.admitted,
                    real.reason,
                    real.message,
                ), where
                assert (naive.admit, naive.message) == (ours.admit, ours.message), where
                rejected += not real.admitted

    asyncio.run(asyncio.wait_for(main(), 120))
    return rejected


@pytest.mark.parametrize("scope", ["container", "pod"])
@pytest.mark.parametrize("policy", POLICIES)
def test_extender_agrees_with_admit_on_gpu_nodes(policy: str, scope: str) -> None:
    node = "dgx-1" if scope == "container" else "dgx-a100"
    settings = AdmitSettings(
        simulate=node,
        topology_manager_policy=policy,
        topology_manager_scope=scope,
        cpu_manager_policy="static",
        reserved_cpus="0",
    )
    seed = POLICIES.index(policy) * 2 + (scope == "pod")
    rejected = compare_stream(settings, ("nvidia.com/gpu",), seed, 14)
    if policy != "none":
        assert rejected > 0  # the stream reaches the nodes' limits


@pytest.mark.parametrize("policy", ["single-numa-node", "restricted"])
def test_extender_agrees_with_admit_on_mig_resources(policy: str) -> None:
    settings = AdmitSettings(
        simulate="dgx-a100-mig",
        mig_strategy="mixed",
        topology_manager_policy=policy,
        topology_manager_scope="container",
        cpu_manager_policy="none",
    )
    compare_stream(settings, (*MIG, "nvidia.com/gpu"), 11, 14)
