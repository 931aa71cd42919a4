"""The CPU manager: CPU lists, start-up checks, hints, static allocation, reuse, release."""

from __future__ import annotations

import pytest

from nvplugin.errors import InputError
from nvplugin.fakekubelet.cpumanager import (
    CpuManager,
    parse_cpu_list,
    reserved_cpu_count,
    reserved_cpus,
)
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.fakekubelet.quantity import parse_quantity
from nvplugin.fakekubelet.topologymanager import (
    AllocationError,
    BitMask,
    NumaInfo,
    StartupError,
    TopologyHint,
    new_manager,
)
from nvplugin.node.model import CpuLayout, format_cpu_list
from nvplugin.nodesession import load_topology
from tests.support.hints import show

# 2 sockets = 2 NUMA nodes, 4 cores each, 2 threads: node 0 = CPUs 0-3 + 8-11 (siblings i, i+8).
LAYOUT = CpuLayout.build(2, 4, 2, 2)
TWO = NumaInfo.from_distances([[10, 21], [21, 10]])


class FixedStore:
    def __init__(self, mask: BitMask | None = None) -> None:
        self.mask = mask

    def get_affinity(self, pod_uid: str, container_name: str) -> TopologyHint:
        return TopologyHint(self.mask, True)


def guaranteed(name: str, cpus: str, init: list[Container] | None = None) -> Pod:
    res = {"cpu": cpus, "memory": "1Gi"}
    return Pod.of(name, [Container.of("main", limits=res)], init or [])


def static(reserved: str = "0", mask: BitMask | None = None) -> CpuManager:
    return CpuManager("static", LAYOUT, FixedStore(mask), parse_cpu_list(reserved))


def test_cpu_lists() -> None:
    assert parse_cpu_list("0-3,8") == (0, 1, 2, 3, 8)
    assert parse_cpu_list(" 5 , 1-2 ") == (1, 2, 5)
    assert parse_cpu_list("") == ()
    assert format_cpu_list([8, 0, 1, 2, 3, 10]) == "0-3,8,10"
    assert format_cpu_list([]) == ""
    for bad, why in [
        ("3-1", "runs backwards"),
        ("a", '"a" is not a CPU number'),
        ("1,,2", "empty"),
    ]:
        with pytest.raises(InputError, match=why) as err:
            parse_cpu_list(bad, "--reserved-cpus")
        assert str(err.value).startswith(f'--reserved-cpus: invalid CPU list "{bad}"')


def test_start_up_checks() -> None:
    with pytest.raises(StartupError, match="unable to determine reserved CPU resources"):
        CpuManager("static", LAYOUT, FixedStore())
    with pytest.raises(StartupError) as err:
        CpuManager("static", LAYOUT, FixedStore(), [0, 99])
    assert str(err.value) == "reserved-cpus: 0,99 is not a subset of online-cpus: 0-15"
    with pytest.raises(StartupError, match='unknown policy: "dynamic"'):
        CpuManager("dynamic", LAYOUT, FixedStore())
    CpuManager("none", LAYOUT, FixedStore())  # none needs no reserved CPUs


def test_reserved_cpus_as_the_kubelet_reads_them_at_start() -> None:
    assert reserved_cpus("0-1,8", LAYOUT) == (0, 1, 8)
    # The kubelet's text (cmd/kubelet getReservedCPUs): the flag as given, the CPUs online.
    with pytest.raises(StartupError) as err:
        reserved_cpus("0-1,200", LAYOUT)
    assert str(err.value) == "reserved-cpus: 0-1,200 is not a subset of online-cpus: 0-15"
    with pytest.raises(InputError, match='--reserved-cpus: invalid CPU list "x"'):
        reserved_cpus("x", LAYOUT)


def test_none_policy_gives_no_hints_and_no_cpus() -> None:
    cm = CpuManager("none", LAYOUT, FixedStore())
    pod = guaranteed("p", "2")
    assert cm.get_topology_hints(pod, pod.containers[0]) is None
    assert cm.get_pod_topology_hints(pod) is None
    cm.allocate(pod, pod.containers[0])
    assert cm.cpus(pod.uid, "main") == ()


def test_only_guaranteed_whole_cpus_get_hints() -> None:
    cm = static()
    half = guaranteed("half", "1500m")
    burst = Pod.of("b", [Container.of("main", requests={"cpu": "2"})])
    for pod in (half, burst):
        assert cm.get_topology_hints(pod, pod.containers[0]) is None
        cm.allocate(pod, pod.containers[0])
        assert cm.cpus(pod.uid, "main") == ()
    pod = guaranteed("g", "2")
    hints = cm.get_topology_hints(pod, pod.containers[0])
    assert hints is not None and [show(x) for x in hints["cpu"] or []] == ["0P", "1P", "0,1N"]


def test_hints_count_free_cpus_minus_reserved() -> None:
    cm = static("0")
    pod = guaranteed("g", "8")
    hints = cm.get_topology_hints(pod, pod.containers[0])
    # Node 0 holds 8 CPUs but one is reserved: only node 1 can give 8 alone; still preferred
    # is measured against capacity, so {1} is preferred.
    assert hints is not None and [show(x) for x in hints["cpu"] or []] == ["1P", "0,1N"]


def test_static_allocation_takes_whole_sockets_then_cores_then_threads() -> None:
    cm = static("0", BitMask.of(1))
    whole = guaranteed("whole", "8")
    cm.allocate(whole, whole.containers[0])
    assert format_cpu_list(cm.cpus(whole.uid, "main")) == "4-7,12-15"

    cm = static("0", BitMask.of(0))
    pair = guaranteed("pair", "2")
    cm.allocate(pair, pair.containers[0])
    assert cm.cpus(pair.uid, "main") == (
        1,
        9,
    )  # one whole core, not CPU 8 (its sibling is reserved)
    three = guaranteed("three", "3")
    cm.allocate(three, three.containers[0])
    # A whole core (2, 10), then the lone thread 8 fills the reserved CPU's core.
    assert cm.cpus(three.uid, "main") == (2, 8, 10)


def test_allocation_outside_the_affinity_when_it_is_short() -> None:
    cm = static("0", BitMask.of(0))
    big = guaranteed("big", "9")
    cm.allocate(big, big.containers[0])
    cpus = cm.cpus(big.uid, "main")
    assert set(range(1, 4)) | set(range(8, 12)) <= set(cpus)  # all 7 free CPUs of node 0 ...
    assert len(cpus) == 9 and 0 not in cpus  # ... plus a whole core of node 1, never reserved 0


def test_not_enough_cpus_is_an_allocation_error() -> None:
    cm = static("0-3")
    pod = guaranteed("huge", "13")
    with pytest.raises(AllocationError) as err:
        cm.allocate(pod, pod.containers[0])
    assert (
        str(err.value) == "not enough cpus available to satisfy request: requested=13, available=12"
    )


def test_release_on_pod_removal() -> None:
    cm = static("0")
    pod = guaranteed("g", "4")
    cm.allocate(pod, pod.containers[0])
    assert len(cm.available()) == 11 and len(cm.shared_pool()) == 12
    cm.remove_pod(pod.uid)
    assert len(cm.available()) == 15 and cm.cpus(pod.uid, "main") == ()
    assert cm.shared_pool() == tuple(range(16))


def test_allocate_is_idempotent_and_hints_repeat_for_an_allocated_container() -> None:
    cm = static("0", BitMask.of(1))
    pod = guaranteed("g", "2")
    cm.allocate(pod, pod.containers[0])
    first = cm.cpus(pod.uid, "main")
    cm.allocate(pod, pod.containers[0])
    assert cm.cpus(pod.uid, "main") == first
    hints = cm.get_topology_hints(pod, pod.containers[0])
    # Regenerated from the container's own CPUs (all on node 1), as after a kubelet restart.
    assert hints is not None and [show(x) for x in hints["cpu"] or []] == ["1P", "0,1N"]


def test_init_container_cpus_are_reused_by_app_containers() -> None:
    cm = static("0", BitMask.of(1))
    res = {"cpu": "2", "memory": "1Gi"}
    init = Container.of("init", limits=res, init=True)
    pod = Pod.of("p", [Container.of("main", limits=res)], [init])
    for c in pod.all_containers:
        cm.allocate(pod, c)
    assert cm.cpus(pod.uid, "init") == cm.cpus(pod.uid, "main")
    assert len(cm.available()) == 13


def test_sidecar_cpus_are_not_reused() -> None:
    cm = static("0", BitMask.of(1))
    res = {"cpu": "2", "memory": "1Gi"}
    side = Container.of("side", limits=res, init=True, restart_policy="Always")
    pod = Pod.of("p", [Container.of("main", limits=res)], [side])
    for c in pod.all_containers:
        cm.allocate(pod, c)
    assert not set(cm.cpus(pod.uid, "side")) & set(cm.cpus(pod.uid, "main"))
    assert cm.pod_guaranteed_cpus(pod) == 4


def test_pod_scope_count_and_hints() -> None:
    cm = static("0")
    res2 = {"cpu": "2", "memory": "1Gi"}
    res6 = {"cpu": "6", "memory": "1Gi"}
    pod = Pod.of(
        "p",
        [Container.of("a", limits=res2), Container.of("b", limits=res2)],
        [Container.of("init", limits=res6, init=True)],
    )
    assert cm.pod_guaranteed_cpus(pod) == 6
    hints = cm.get_pod_topology_hints(pod)
    assert hints is not None and [show(x) for x in hints["cpu"] or []] == ["0P", "1P", "0,1N"]


def test_through_the_topology_manager() -> None:
    manager = new_manager(TWO, "single-numa-node")
    cm = CpuManager("static", LAYOUT, manager, [0])
    manager.add_hint_provider(cm)
    first = guaranteed("first", "6")
    assert manager.admit(first).admit
    assert {LAYOUT.cpus[c].numa_node for c in cm.cpus(first.uid, "main")} == {0}
    second = guaranteed("second", "6")
    assert manager.admit(second).admit
    assert {LAYOUT.cpus[c].numa_node for c in cm.cpus(second.uid, "main")} == {1}
    third = guaranteed("third", "3")
    result = manager.admit(third)
    assert (result.admit, result.reason) == (False, "TopologyAffinityError")
    assert manager.stored_affinity(second.uid, "main") == TopologyHint(BitMask.of(1), True)


@pytest.mark.parametrize(
    ("reservation", "count", "cpus"),
    [("2", 2, {0, 40}), ("1500m", 2, {0, 40}), ("1", 1, {0}), ("1001m", 2, {0, 40})],
)
def test_static_without_reserved_cpus_reserves_the_rounded_up_reservation(
    reservation: str, count: int, cpus: set[int]
) -> None:
    """The kubelet's static policy without --reserved-cpus reserves ceil(system-reserved +
    kube-reserved cpu) CPUs, taken from all CPUs as exclusive CPUs are: on dgx-1 (threads i and
    i+40 share a core) cpu=2 and cpu=1500m reserve CPUs 0 and 40."""
    topology = load_topology("dgx-1")
    assert reserved_cpu_count(parse_quantity(reservation).value) == count
    manager = CpuManager.from_topology("static", topology, FixedStore(), (), count)
    assert manager.reserved == cpus
    assert not manager.available() & cpus
    with pytest.raises(StartupError, match=r"size of  did not equal 81\)"):
        CpuManager.from_topology("static", topology, FixedStore(), (), 81)
