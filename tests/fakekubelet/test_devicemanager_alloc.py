"""The device manager as the kubelet's hint provider and allocator (docs/kubelet-behaviour.md):
topology hints, ``devicesToAllocate`` step by step, Allocate, PreStartContainer and init-container
reuse -- restating docs/kubelet-behaviour.md#worked-examples 8-12 and the upstream device manager
test scenarios as data. A scripted in-test plugin answers over a real unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from nvplugin.fakekubelet.devicemanager import DeviceManager
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.fakekubelet.topologymanager import (
    AllocationError,
    NumaInfo,
    new_manager,
)
from tests.support.hints import show
from tests.support.tinyplugin import RESOURCE, Hints, ScriptedPlugin, devs, register, run
from tests.support.waiting import WAIT_S as WAIT


@dataclass
class Env:
    kubelet: FakeKubelet
    plugin: ScriptedPlugin
    dm: DeviceManager
    hints: Hints


@contextlib.asynccontextmanager
async def env(
    plugin: ScriptedPlugin,
    numa_nodes: Sequence[int] = (0, 1),
    dm: DeviceManager | None = None,
) -> AsyncIterator[Env]:
    directory = tempfile.mkdtemp(prefix="nvk-")
    hints = Hints()
    if dm is None:
        dm = DeviceManager(numa_nodes=numa_nodes, store=hints)
    try:
        async with FakeKubelet(directory, devices=dm) as kubelet:
            await plugin.serve(os.path.join(directory, "p.sock"))
            try:
                await register(kubelet, "p.sock")
                obs = kubelet.observer
                await obs.wait_for(lambda _: bool(obs.snapshots(RESOURCE)), WAIT, "a snapshot")
                yield Env(kubelet, plugin, dm, hints)
            finally:
                await plugin.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def gpus(n: int, **extra: str) -> Container:
    return Container.of("c", limits={RESOURCE: n, **extra})


def pod_of(*containers: Container, init: Sequence[Container] = (), name: str = "p") -> Pod:
    return Pod.of(name, containers, init)


async def take(e: Env, pod: Pod, container: str, nodes: Sequence[int] | None) -> list[str]:
    """Store a hint for the container and allocate it through the device manager."""
    e.hints.set(pod, container, nodes)
    await e.dm.allocate_container(pod, pod.container(container))
    return sorted(e.dm.container_devices(pod.uid, container, RESOURCE) or ())


# --- hints: worked examples 8-10 and the upstream GetTopologyHints cases -------------------------

HINT_CASES = [
    # (name, devices, request, held by another pod first (with its hint), expected hints)
    ("example 8: one device per node, request 1", "A:0 B:1", 1, None, "0P 1P 0,1N"),
    ("example 8: one device per node, request 2", "A:0 B:1", 2, None, "0,1P"),
    ("example 9: one device without NUMA", "A:- B:1", 1, None, "1P 0,1N"),
    ("example 10: more requested than exist", "A:0 B:0 C:1 D:1", 6, None, ""),
    ("two per node, request 2", "A:0 B:0 C:1 D:1", 2, None, "0P 1P 0,1N"),
    (
        "preferred is against capacity: node 0 half used",
        "A:0 B:0 C:1 D:1",
        2,
        (["A"], 0),
        "1P 0,1N",
    ),
    ("unhealthy devices are not available", "A:0! B:0 C:1 D:1", 2, None, "1P 0,1N"),
    ("a device on two nodes counts for both", "A:0,1 B:1", 2, None, "1P 0,1N"),
    ("no NUMA anywhere: don't care", "A:- B:-", 1, None, None),
]


@pytest.mark.parametrize(
    ("spec", "request_", "held", "expected"),
    [c[1:] for c in HINT_CASES],
    ids=[c[0] for c in HINT_CASES],
)
def test_container_hints(
    spec: str, request_: int, held: tuple[list[str], int] | None, expected: str | None
) -> None:
    async def main() -> None:
        preferred = held[0] if held else None
        async with env(ScriptedPlugin(devs(spec), preferred=preferred)) as e:
            if held is not None:
                other = pod_of(gpus(len(held[0])), name="other")
                assert await take(e, other, "c", [held[1]]) == held[0]
            pod = pod_of(gpus(request_))
            hints = e.dm.container_hints(pod, pod.containers[0])
            assert hints is not None
            got = hints[RESOURCE]
            if expected is None:
                assert got is None
            else:
                assert [show(h) for h in got] == expected.split()

    run(main())


def test_hints_for_a_container_that_already_holds_its_devices() -> None:
    async def main() -> None:
        async with env(ScriptedPlugin(devs("A:0 B:1 C:1"))) as e:
            pod = pod_of(gpus(2))
            e.plugin.preferred = ["A", "B"]
            assert await take(e, pod, "c", None) == ["A", "B"]
            # Regenerated from what it holds (kubelet restart): only masks covering A and B.
            assert [show(h) for h in e.dm.container_hints(pod, pod.containers[0])[RESOURCE]] == [
                "0,1N"
            ]
            # A different count than it holds is impossible.
            changed = pod_of(gpus(3))
            assert e.dm.container_hints(changed, changed.containers[0]) == {RESOURCE: []}

    run(main())


def test_resources_not_from_a_plugin_get_no_hints() -> None:
    async def main() -> None:
        async with env(ScriptedPlugin(devs("A:0"))) as e:
            pod = pod_of(Container.of("c", limits={"example.com/fpga": 1, "cpu": 1}))
            assert e.dm.container_hints(pod, pod.containers[0]) == {}

    run(main())


def test_hints_with_reusable_devices_from_an_init_container() -> None:
    async def main() -> None:
        async with env(ScriptedPlugin(devs("A:0 B:0 C:1 D:1"))) as e:
            init = Container.of("init", limits={RESOURCE: 1})
            pod = pod_of(Container.of("app", limits={RESOURCE: 2}), init=[init])
            e.plugin.preferred = ["A"]
            assert await take(e, pod, "init", [0]) == ["A"]
            assert e.dm.reusable_devices(pod.uid, RESOURCE) == {"A"}
            # A (node 0) is reusable: every mask must contain node 0.
            hints = e.dm.container_hints(pod, pod.container("app"))[RESOURCE]
            assert [show(h) for h in hints] == ["0P", "0,1N"]
            # Reusable first, then aligned: no GetPreferredAllocation needed for the rest.
            calls = len(e.plugin.gpa_calls())
            assert await take(e, pod, "app", [0]) == ["A", "B"]
            assert len(e.plugin.gpa_calls()) == calls
            assert e.dm.reusable_devices(pod.uid, RESOURCE) == set()
            assert e.dm.allocated_devices(RESOURCE) == {"A", "B"}

    run(main())


def test_restartable_init_container_keeps_its_devices() -> None:
    async def main() -> None:
        async with env(ScriptedPlugin(devs("A:0 B:0 C:1 D:1"), gpa=False)) as e:
            sidecar = Container.of("sidecar", limits={RESOURCE: 1}, restart_policy="Always")
            init = Container.of("init", limits={RESOURCE: 1})
            app = Container.of("app", limits={RESOURCE: 1})
            pod = pod_of(app, init=[sidecar, init])
            assert await take(e, pod, "sidecar", None) == ["A"]
            assert e.dm.reusable_devices(pod.uid, RESOURCE) == set()
            assert await take(e, pod, "init", None) == ["B"]
            assert e.dm.reusable_devices(pod.uid, RESOURCE) == {"B"}
            assert await take(e, pod, "app", None) == ["B"]  # reused, not a third device
            assert e.dm.allocated_devices(RESOURCE) == {"A", "B"}
            assert e.dm.pod_devices(pod.uid, RESOURCE) == {"A", "B"}

    run(main())


def test_pod_scope_hints() -> None:
    async def main() -> None:
        async with env(ScriptedPlugin(devs("A:0 B:0 C:1 D:1"))) as e:
            pod = pod_of(
                Container.of("a", limits={RESOURCE: 1}),
                Container.of("b", limits={RESOURCE: 1}),
                init=[Container.of("i", limits={RESOURCE: 2})],
            )
            # max(1 + 1, 2) = 2
            assert [show(h) for h in e.dm.pod_hints(pod)[RESOURCE]] == ["0P", "1P", "0,1N"]
            big = pod_of(Container.of("a", limits={RESOURCE: 3}), name="big")
            assert [show(h) for h in e.dm.pod_hints(big)[RESOURCE]] == ["0,1P"]
            huge = pod_of(Container.of("a", limits={RESOURCE: 5}), name="huge")
            assert e.dm.pod_hints(huge) == {RESOURCE: []}
            # Once the pod holds devices, hints are regenerated from them.
            e.plugin.preferred = ["C"]
            for name in ("i", "a", "b"):
                await take(e, pod, name, [1])
            assert e.dm.pod_devices(pod.uid, RESOURCE) == {"C", "D"}
            assert [show(h) for h in e.dm.pod_hints(pod)[RESOURCE]] == ["1P", "0,1N"]

    run(main())


# --- devicesToAllocate -------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocCase:
    name: str
    devices: str
    request: int
    hint: tuple[int, ...] | None
    expected: list[str] | str  # device IDs, or the error text
    preferred: list[str] | None = None
    gpa: bool = True
    held: tuple[str, ...] = ()  # taken by another pod first (no hint)
    gpa_calls: list[tuple[list[str], list[str], int]] | None = None


ALLOC_CASES = [
    AllocCase(
        "example 11: three per node, hint {0}, request 4",
        "A:0 B:0 C:0 D:1 E:1 F:1",
        4,
        (0,),
        ["A", "B", "C", "D"],
        gpa=False,
    ),
    AllocCase(
        "aligned first, then the plugin chooses among all available",
        "A:0 B:0 C:0 D:1 E:1 F:1",
        4,
        (0,),
        ["A", "B", "C", "F"],
        preferred=["A", "B", "C", "F"],
        gpa_calls=[(["A", "B", "C", "D", "E", "F"], ["A", "B", "C"], 4)],
    ),
    AllocCase(
        "all from the aligned set: the plugin chooses among the aligned only",
        "A:0 B:0 C:0 D:1",
        2,
        (0,),
        ["B", "C"],
        preferred=["B", "C"],
        gpa_calls=[(["A", "B", "C"], [], 2)],
    ),
    AllocCase(
        "preferred IDs outside the aligned set are dropped, the rest falls back",
        "A:0 B:0 C:0 D:1",
        2,
        (0,),
        ["A", "C"],
        preferred=["D", "C", "zz"],
    ),
    AllocCase(
        "an empty preferred answer means the fallback",
        "A:0 B:0 C:0 D:1",
        2,
        (0,),
        ["A", "B"],
        preferred=[],
    ),
    AllocCase(
        "busy devices in the answer are dropped",
        "A:0 B:0 C:1 D:1",
        1,
        None,
        ["C"],
        preferred=["A", "C"],
        held=("A",),
        gpa_calls=[(["B", "C", "D"], [], 1)],
    ),
    AllocCase(
        "nil hint: everything is no-affinity, the plugin sees all available",
        "A:0 B:1 C:-",
        2,
        None,
        ["B", "C"],
        preferred=["B", "C"],
        gpa_calls=[(["A", "B", "C"], [], 2)],
    ),
    AllocCase(
        "without a preference: aligned, then unaligned, then no NUMA",
        "N:- A:0 C:1",
        2,
        (0,),
        ["A", "C"],
        gpa=False,
    ),
    AllocCase(
        "unhealthy devices are never allocated",
        "A:0! B:0 C:1",
        2,
        (0,),
        ["B", "C"],
        gpa=False,
    ),
    AllocCase(
        "too few available",
        "A:0 B:0 C:1",
        2,
        None,
        "requested number of devices unavailable for nvidia.com/gpu. Requested: 2, Available: 1",
        held=("A", "B"),
    ),
    AllocCase(
        "no healthy device",
        "A:0! B:1!",
        1,
        None,
        "no healthy devices present; cannot allocate unhealthy devices nvidia.com/gpu",
    ),
]


@pytest.mark.parametrize("case", ALLOC_CASES, ids=[c.name for c in ALLOC_CASES])
def test_devices_to_allocate(case: AllocCase) -> None:
    async def main() -> None:
        plugin = ScriptedPlugin(devs(case.devices), gpa=case.gpa)
        async with env(plugin) as e:
            if case.held:
                plugin.preferred = list(case.held)
                other = pod_of(gpus(len(case.held)), name="other")
                assert await take(e, other, "c", None) == sorted(case.held)
            plugin.calls.clear()
            plugin.preferred = case.preferred
            pod = pod_of(gpus(case.request))
            e.hints.set(pod, "c", case.hint)
            if isinstance(case.expected, str):
                with pytest.raises(AllocationError) as info:
                    await e.dm.devices_to_allocate(pod.uid, "c", RESOURCE, case.request)
                assert str(info.value) == case.expected
                return
            got = await e.dm.devices_to_allocate(pod.uid, "c", RESOURCE, case.request)
            assert got is not None
            assert sorted(got) == sorted(case.expected)
            if case.gpa_calls is not None:
                assert plugin.gpa_calls() == case.gpa_calls
            if not case.gpa:
                assert plugin.gpa_calls() == []

    run(main())


def test_example_12_plugin_choice_among_100_per_node() -> None:
    spec = " ".join([f"a{i:03d}:0" for i in range(100)] + [f"b{i:03d}:1" for i in range(100)])
    chosen = ["a007", "a013", "a042", "a077", "a099"]

    async def main() -> None:
        async with env(ScriptedPlugin(devs(spec), preferred=chosen)) as e:
            pod = pod_of(gpus(5))
            assert await take(e, pod, "c", [0]) == chosen
            [(available, must, size)] = e.plugin.gpa_calls()
            assert sorted(available) == [f"a{i:03d}" for i in range(100)]
            assert (must, size) == ([], 5)

    run(main())


def test_reusable_devices_are_must_include_for_the_plugin() -> None:
    async def main() -> None:
        async with env(ScriptedPlugin(devs("A:0 B:0 C:0 D:1"), preferred=["A"])) as e:
            init = Container.of("init", limits={RESOURCE: 1})
            pod = pod_of(Container.of("app", limits={RESOURCE: 3}), init=[init])
            assert await take(e, pod, "init", [0]) == ["A"]
            e.plugin.calls.clear()
            e.plugin.preferred = ["A", "C", "D"]
            # Reusable A first; two more needed, both can come from aligned {B, C}? No: 2 < 2
            # is false, so aligned are taken whole and the plugin picks nothing more.
            assert await take(e, pod, "app", [0]) == ["A", "B", "C"]
            assert e.plugin.gpa_calls() == []

        async with env(ScriptedPlugin(devs("A:0 B:0 C:0 D:1"), preferred=["D"])) as e:
            pod = pod_of(Container.of("app", limits={RESOURCE: 2}), init=[init])
            assert await take(e, pod, "init", [1]) == ["D"]
            e.plugin.calls.clear()
            e.plugin.preferred = ["B", "D"]
            # D is reused; one more can come from the three aligned: the plugin chooses, with
            # D offered and required.
            assert await take(e, pod, "app", [0]) == ["B", "D"]
            assert e.plugin.gpa_calls() == [(["A", "B", "C", "D"], ["D"], 2)]

    run(main())


def test_changed_request_and_gpa_errors() -> None:
    async def main() -> None:
        plugin = ScriptedPlugin(devs("A:0 B:0 C:0"), preferred=["A"])
        async with env(plugin) as e:
            pod = pod_of(gpus(1))
            assert await take(e, pod, "c", [0]) == ["A"]
            with pytest.raises(AllocationError) as info:
                await e.dm.devices_to_allocate(pod.uid, "c", RESOURCE, 2)
            assert str(info.value) == (
                f'pod "{pod.uid}" container "c" changed request for resource '
                '"nvidia.com/gpu" from 1 to 2'
            )
            # Same count again: nothing to do (no Allocate call).
            assert await e.dm.devices_to_allocate(pod.uid, "c", RESOURCE, 1) is None

            with pytest.raises(AllocationError) as info:
                await e.dm.devices_to_allocate(pod.uid, "c", "example.com/fpga", 1)
            assert str(info.value) == "cannot allocate unregistered device example.com/fpga"

            plugin.gpa_error = "boom"
            other = pod_of(gpus(1), name="other")
            e.hints.set(other, "c", [0])
            with pytest.raises(AllocationError) as info:
                await asyncio.to_thread(e.dm.hint_provider.allocate, other, other.containers[0])
            assert str(info.value) == (
                "device plugin GetPreferredAllocation rpc failed with err: "
                "rpc error: code = Internal desc = boom"
            )

    run(main())


def test_allocate_response_stored_by_numa_node() -> None:
    async def main() -> None:
        plugin = ScriptedPlugin(devs("A:0 B:1 N:-"), preferred=["A", "B", "N"])
        async with env(plugin) as e:
            pod = pod_of(gpus(3))
            assert await take(e, pod, "c", None) == ["A", "B", "N"]
            entry = e.dm.container_allocation(pod.uid, "c", RESOURCE)
            assert entry is not None and entry.response is not None
            assert dict(entry.by_numa) == {-1: ("N",), 0: ("A",), 1: ("B",)}
            assert dict(entry.response.envs) == {"NVIDIA_VISIBLE_DEVICES": "A,B,N"}
            [(_, request)] = [c for c in plugin.calls if c[0] == "Allocate"]
            [creq] = request.container_requests
            assert sorted(creq.devices_ids) == ["A", "B", "N"]

    run(main())


def test_allocate_rpc_error_rejects_and_releases() -> None:
    async def main() -> None:
        plugin = ScriptedPlugin(devs("A:0 B:1"), allocate_error="no such GPU", gpa=False)
        async with env(plugin) as e:
            pod = pod_of(gpus(1))
            with pytest.raises(AllocationError) as info:
                await asyncio.to_thread(e.dm.hint_provider.allocate, pod, pod.containers[0])
            assert str(info.value) == "rpc error: code = InvalidArgument desc = no such GPU"
            assert e.dm.allocated_devices(RESOURCE) == set()
            assert e.dm.container_devices(pod.uid, "c", RESOURCE) is None

    run(main())


def test_pre_start_container_only_when_the_plugin_asks() -> None:
    async def main() -> None:
        for pre_start in (True, False):
            plugin = ScriptedPlugin(devs("A:0 B:1"), gpa=False, pre_start=pre_start)
            async with env(plugin) as e:
                pod = pod_of(gpus(2))
                await take(e, pod, "c", None)
                envs = await e.dm.prepare_container(pod, pod.containers[0])
                assert envs == {"NVIDIA_VISIBLE_DEVICES": "A,B"}
                calls = [r for name, r in plugin.calls if name == "PreStartContainer"]
                if pre_start:
                    [request] = calls
                    assert list(request.devices_ids) == ["A", "B"]
                else:
                    assert calls == []

    run(main())


def test_disconnected_plugin_means_no_healthy_devices() -> None:
    async def main() -> None:
        async with env(ScriptedPlugin(devs("A:0 B:1"), gpa=False)) as e:
            pod = pod_of(gpus(1))
            assert await take(e, pod, "c", None) == ["A"]
            await e.plugin.stop()
            await e.kubelet.observer.wait_for(
                lambda m: not m.is_registered(RESOURCE), WAIT, "disconnect"
            )
            later = pod_of(gpus(1), name="later")
            hints = e.dm.container_hints(later, later.containers[0])
            assert hints == {RESOURCE: []}
            with pytest.raises(AllocationError, match="no healthy devices present"):
                await e.dm.devices_to_allocate(later.uid, "c", RESOURCE, 1)
            # What the first pod holds is kept.
            assert e.dm.allocated_devices(RESOURCE) == {"A"}

    run(main())


# --- through the topology manager --------------------------------------------------------------


def admit_all(
    policy: str, spec: str, pods: Sequence[Pod], scope: str = "container", **plugin_args: Any
) -> list[tuple[str | None, str | None, list[str]]]:
    """Admit pods in order via the topology manager; (reason, message, devices) per pod."""
    out: list[tuple[str | None, str | None, list[str]]] = []

    async def main() -> None:
        numa = NumaInfo.from_distances([[10, 21], [21, 10]])
        manager = new_manager(numa, policy, scope)
        active: set[str] = set()
        dm = DeviceManager(numa_nodes=(0, 1), store=manager, active_pods=lambda: active)
        manager.add_hint_provider(dm.hint_provider)
        async with env(ScriptedPlugin(devs(spec), **plugin_args), dm=dm):
            for pod in pods:
                active.add(pod.uid)
                result = await asyncio.to_thread(manager.admit, pod)
                if not result.admit:
                    active.discard(pod.uid)
                    manager.remove_pod(pod.uid)
                held = sorted(dm.pod_devices(pod.uid, RESOURCE))
                out.append((result.reason, result.message, held))

    run(main())
    return out


def test_single_numa_node_rejects_what_cannot_be_aligned() -> None:
    pods = [pod_of(gpus(2), name="wide"), pod_of(gpus(1), name="one")]
    wide, one = admit_all("single-numa-node", "A:0 B:1", pods, gpa=False)
    assert wide == (
        "TopologyAffinityError",
        "Resources cannot be allocated with Topology locality",
        [],
    )
    assert one == (None, None, ["A"])


def test_best_effort_admits_then_allocation_fails_when_too_few() -> None:
    pods = [pod_of(gpus(1), name="first"), pod_of(gpus(2), name="second")]
    first, second = admit_all("best-effort", "A:0 B:1", pods, gpa=False)
    assert first == (None, None, ["A"])
    assert second == (
        "UnexpectedAdmissionError",
        "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
        "Requested: 2, Available: 1, which is unexpected",
        [],
    )


def test_rejected_pod_gives_back_what_its_first_containers_took() -> None:
    pod = pod_of(gpus(1), Container.of("d", limits={RESOURCE: 2}), name="greedy")
    after = pod_of(gpus(2), name="after")
    greedy, later = admit_all("best-effort", "A:0 B:1", [pod, after], gpa=False)
    assert greedy[0] == "UnexpectedAdmissionError"
    assert later == (None, None, ["A", "B"])


def test_pod_scope_stores_one_hint_for_every_container() -> None:
    pod = pod_of(gpus(1), Container.of("d", limits={RESOURCE: 1}), name="pair")
    [result] = admit_all("single-numa-node", "A:0 B:1 C:1", [pod], scope="pod", gpa=False)
    assert result == (None, None, ["B", "C"])


def test_hint_provider_refuses_to_block_its_own_loop() -> None:
    async def main() -> None:
        async with env(ScriptedPlugin(devs("A:0"))) as e:
            pod = pod_of(gpus(1))
            with pytest.raises(RuntimeError, match="worker thread"):
                e.dm.hint_provider.allocate(pod, pod.containers[0])

    run(main())
