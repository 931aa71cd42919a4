"""The kubelet's resource fit (its lifecycle predicate): reasons, messages, the order resources
are checked in, and the node's allocatable (docs/kubelet-behaviour.md#resource-fit)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from nvplugin.errors import InputError
from nvplugin.fakekubelet.lifecycle import (
    DEFAULT_MAX_PODS,
    EVICTION_HARD_MEMORY,
    NodeResources,
    node_allocatable,
    resource_fit,
    validate_node_allocatable,
)
from nvplugin.fakekubelet.pods import Pod, load_pods
from nvplugin.fakekubelet.topologymanager import StartupError

GI = 1024**3
NODE = NodeResources(milli_cpu=80_000, memory=512 * GI, pods=4, extended={"nvidia.com/gpu": 8})


def pod(name: str, resources: str, init: str | None = None) -> Pod:
    inits = f"  initContainers:\n  - name: init\n    resources: {init}\n" if init else ""
    (made,) = load_pods(
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n{inits}"
        f"  containers:\n  - name: main\n    resources: {resources}\n"
    )
    return made


def test_a_pod_asking_for_more_cpu_than_the_node_has_is_out_of_cpu() -> None:
    result = resource_fit(pod("greedy", "{requests: {cpu: '1000'}}"), [], NODE)
    assert (result.admit, result.reason, result.message) == (
        False,
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 1000000, used: 0, capacity: 80000",
    )


def test_what_other_pods_request_is_used() -> None:
    others = [pod("a", "{requests: {cpu: '30', memory: 200Gi}}")] * 2
    result = resource_fit(pod("b", "{requests: {cpu: 20500m}}"), others, NODE)
    assert result.reason == "OutOfcpu"
    assert result.message == (
        "Node didn't have enough resource: cpu, requested: 20500, used: 60000, capacity: 80000"
    )
    assert resource_fit(pod("c", "{requests: {cpu: '20'}}"), others, NODE).admit
    memory = resource_fit(pod("d", "{requests: {memory: 113Gi}}"), others, NODE)
    assert (memory.reason, memory.message) == (
        "OutOfmemory",
        f"Node didn't have enough resource: memory, requested: {113 * GI}, used: {400 * GI}, "
        f"capacity: {512 * GI}",
    )


def test_pods_come_first_then_cpu_memory_and_extended_resources() -> None:
    """The scheduler's order; only the first shortfall is reported."""
    full = [pod(f"p{n}", "{}") for n in range(4)]
    everything = pod("x", "{requests: {cpu: '100', memory: 1Ti}, limits: {nvidia.com/gpu: 9}}")
    assert resource_fit(everything, full, NODE).message == (
        "Node didn't have enough resource: pods, requested: 1, used: 4, capacity: 4"
    )
    assert resource_fit(everything, full, NODE).reason == "OutOfpods"
    assert resource_fit(everything, [], NODE).reason == "OutOfcpu"
    no_cpu = pod("y", "{requests: {memory: 1Ti}, limits: {nvidia.com/gpu: 9}}")
    assert resource_fit(no_cpu, [], NODE).reason == "OutOfmemory"
    gpus = resource_fit(pod("z", "{limits: {nvidia.com/gpu: 9}}"), [], NODE)
    assert (gpus.reason, gpus.message) == (
        "OutOfnvidia.com/gpu",
        "Node didn't have enough resource: nvidia.com/gpu, requested: 9, used: 0, capacity: 8",
    )


def test_a_pod_requesting_nothing_needs_only_a_pod_slot() -> None:
    crowded = NodeResources(milli_cpu=0, memory=0, pods=1)
    assert resource_fit(pod("empty", "{}"), [], crowded).admit
    assert resource_fit(pod("empty", "{}"), [pod("other", "{}")], crowded).reason == "OutOfpods"


def test_extended_resources_the_node_does_not_know_are_left_out() -> None:
    """A cluster-level resource (no plugin on the node ever advertised it) does not stop the
    pod; one the node has, with too few, does."""
    result = resource_fit(pod("f", "{limits: {example.com/license: 3}}"), [], NODE)
    assert result.admit
    empty = NodeResources(80_000, None, 4, {"example.com/license": 0})
    assert resource_fit(pod("f", "{limits: {example.com/license: 3}}"), [], empty).reason == (
        "OutOfexample.com/license"
    )


def test_init_containers_count_as_the_kubelet_counts_them() -> None:
    """Effective requests: the larger of the app containers' sum and each init container."""
    heavy_init = pod("i", "{requests: {cpu: '1'}}", init="{requests: {cpu: '81'}}")
    assert resource_fit(heavy_init, [], NODE).message == (
        "Node didn't have enough resource: cpu, requested: 81000, used: 0, capacity: 80000"
    )


def test_memory_unknown_is_not_checked() -> None:
    unknown = NodeResources(80_000, None, 4)
    assert resource_fit(pod("m", "{requests: {memory: 100Ti}}"), [], unknown).admit


@pytest.mark.parametrize(
    ("reserved", "reserved_cpus", "milli_cpu", "memory"),
    [
        ({}, 0, 80_000, 512 * GI - EVICTION_HARD_MEMORY),
        ({"cpu": Decimal("1.5"), "memory": Decimal(2 * GI)}, 0, 78_500, 510 * GI - (100 << 20)),
        ({"cpu": Decimal(4)}, 2, 78_000, 512 * GI - (100 << 20)),  # --reserved-cpus wins
    ],
)
def test_node_allocatable_is_capacity_less_reservations_and_the_eviction_threshold(
    reserved: dict[str, Decimal], reserved_cpus: int, milli_cpu: int, memory: int
) -> None:
    node = node_allocatable(
        80, 512 * GI, reserved=reserved, reserved_cpus=reserved_cpus, extended={"a/b": 2}
    )
    assert node == NodeResources(milli_cpu, memory, DEFAULT_MAX_PODS, {"a/b": 2})
    assert node_allocatable(80, None).memory is None


def test_pod_overhead_counts_in_the_fit_for_the_pod_and_the_others() -> None:
    """``spec.overhead`` (set from the pod's RuntimeClass) is part of what the kubelet's fit
    requests: cpu 79 plus 1500m overhead is 80500 (the real kubelet 1.32)."""
    (heavy,) = load_pods(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: heavy}\nspec:\n"
        "  overhead: {cpu: 1500m, memory: 1Gi}\n"
        "  containers: [{name: main, resources: {requests: {cpu: '79'}}}]\n"
    )
    result = resource_fit(heavy, [], NODE)
    assert (result.admit, result.reason, result.message) == (
        False,
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 80500, used: 0, capacity: 80000",
    )
    (light,) = load_pods(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: light}\nspec:\n"
        "  overhead: {cpu: 250m}\n  containers: [{name: main}]\n"
    )
    # Overhead alone is a request: the pod is checked, and counted as used for the next one.
    assert resource_fit(light, [], NodeResources(milli_cpu=0, memory=0)).reason == "OutOfcpu"
    after = resource_fit(pod("next", "{requests: {cpu: '80'}}"), [light], NODE)
    assert after.message == (
        "Node didn't have enough resource: cpu, requested: 80000, used: 250, capacity: 80000"
    )
    with pytest.raises(InputError, match=r"spec.overhead\[cpu\]"):
        load_pods(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec:\n"
            "  overhead: {cpu: -1}\n  containers: [{name: main}]\n"
        )


def test_reservations_above_capacity_stop_the_kubelet_with_its_text() -> None:
    """The kubelet's container manager refuses to start when a reservation exceeds the capacity;
    it prints each quantity as Go's %v of a resource.Quantity value shows it."""
    gib = 1024**3
    with pytest.raises(StartupError) as err:
        validate_node_allocatable({"memory": ["600Gi"], "cpu": ["100"]}, 80, 512 * gib)
    assert str(err.value) == (
        'invalid Node Allocatable configuration. Resource "cpu" has a reservation of '
        "{{100 0} {<nil>}  DecimalSI} but capacity of {{80000 -3} {<nil>}  DecimalSI}. "
        'Expected capacity >= reservation. Resource "memory" has a reservation of '
        "{{644349952000 0} {<nil>}  BinarySI} but capacity of {{549755813888 0} {<nil>}  "
        "BinarySI}. Expected capacity >= reservation."
    )
    # Mixed scales add at the finer one; the first non-zero quantity gives the format.
    with pytest.raises(StartupError, match=r"of \{\{81500 -3\} \{<nil>\}  DecimalSI\} but"):
        validate_node_allocatable({"cpu": ["1500m", "80"]}, 80, None)
    # The hard eviction threshold (100Mi) counts: all the memory less 100Mi is the most.
    validate_node_allocatable({"memory": ["524188Mi"], "cpu": ["80"]}, 80, 512 * gib)
    with pytest.raises(StartupError, match='"memory"'):
        validate_node_allocatable({"memory": ["524189Mi"]}, 80, 512 * gib)
    validate_node_allocatable({"memory": ["1Ei"]}, 80, None)  # memory unknown: not checked
