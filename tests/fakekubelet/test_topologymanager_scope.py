"""Scopes, admission results, options and start-up errors (the upstream scope, manager and
policy-options tests restated)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from nvplugin.errors import InputError
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.fakekubelet.topologymanager import (
    AllocationError,
    Manager,
    NumaInfo,
    PolicyOptions,
    ProviderHints,
    StartupError,
    TopologyAffinityError,
    TopologyHint,
    new_manager,
    new_policy_options,
    parse_policy_options_flag,
    validate_config,
)
from tests.support.hints import hs, show

TWO = NumaInfo.from_distances([[10, 11], [11, 10]])


@dataclass
class FakeProvider:
    """Answers fixed hints (per container name, or one answer for all) and records calls."""

    answer: ProviderHints = None
    per_container: dict[str, ProviderHints] = field(default_factory=dict)
    pod_answer: ProviderHints = None
    fail_on: str | None = None
    error: Exception | None = None
    manager: Manager | None = None
    calls: list[str] = field(default_factory=list)
    seen_affinity: dict[str, str] = field(default_factory=dict)

    def get_topology_hints(self, pod: Pod, container: Container) -> ProviderHints:
        self.calls.append(f"hints:{container.name}")
        return self.per_container.get(container.name, self.answer)

    def get_pod_topology_hints(self, pod: Pod) -> ProviderHints:
        self.calls.append("pod-hints")
        return self.pod_answer

    def allocate(self, pod: Pod, container: Container) -> None:
        self.calls.append(f"allocate:{container.name}")
        if self.manager is not None:
            hint = self.manager.get_affinity(pod.uid, container.name)
            self.seen_affinity[container.name] = show(hint)
        if container.name == self.fail_on:
            raise self.error or AllocationError("boom")


def pod_with_init() -> Pod:
    return Pod.of(
        "p",
        [Container.of("app1"), Container.of("app2")],
        [Container.of("init1"), Container.of("side", restart_policy="Always")],
    )


# --- container scope ---


def test_container_scope_order_store_and_allocate() -> None:
    manager = new_manager(TWO, "best-effort", "container")
    provider = FakeProvider(
        per_container={
            "init1": {"r": hs("0P", "0,1N")},
            "side": {"r": hs("1P")},
            "app1": None,
            "app2": {"r": []},
        },
        manager=manager,
    )
    manager.add_hint_provider(provider)
    pod = pod_with_init()
    assert manager.admit(pod).admit
    assert provider.calls == [
        "hints:init1",
        "allocate:init1",
        "hints:side",
        "allocate:side",
        "hints:app1",
        "allocate:app1",
        "hints:app2",
        "allocate:app2",
    ]
    # The hint is stored before the provider allocates, so it can read it back.
    assert provider.seen_affinity == {"init1": "0P", "side": "1P", "app1": "0,1P", "app2": "0,1N"}
    assert manager.stored_affinity(pod.uid, "app2") == TopologyHint(TWO.default_affinity, False)
    manager.remove_pod(pod.uid)
    assert manager.stored_affinity(pod.uid, "app2") is None
    assert manager.get_affinity(pod.uid, "app2") == TopologyHint(None, False)


def test_container_scope_rejects_the_whole_pod_on_the_first_refusal() -> None:
    manager = new_manager(TWO, "restricted", "container")
    provider = FakeProvider(per_container={"app1": {"r": hs("0P")}, "app2": {"r": []}})
    manager.add_hint_provider(provider)
    result = manager.admit(Pod.of("p", [Container.of("app1"), Container.of("app2")]))
    assert (result.admit, result.reason, result.message) == (
        False,
        "TopologyAffinityError",
        "Resources cannot be allocated with Topology locality",
    )
    # app1 was admitted and allocated before app2 failed, as in the kubelet.
    assert provider.calls == ["hints:app1", "allocate:app1", "hints:app2"]


def test_allocation_error_is_unexpected_admission_error() -> None:
    manager = new_manager(TWO, "single-numa-node")
    first = FakeProvider(answer={"r": hs("0P")}, fail_on="app2", error=AllocationError("no GPU"))
    second = FakeProvider()
    manager.add_hint_provider(first)
    manager.add_hint_provider(second)
    result = manager.admit(Pod.of("p", [Container.of("app1"), Container.of("app2")]))
    assert (result.admit, result.reason, result.message) == (
        False,
        "UnexpectedAdmissionError",
        "Allocate failed due to no GPU, which is unexpected",
    )
    # The second provider is not asked to allocate after the first one failed.
    assert second.calls == ["hints:app1", "allocate:app1", "hints:app2"]


def test_an_admission_error_keeps_its_own_reason() -> None:
    manager = new_manager(TWO, "best-effort")
    manager.add_hint_provider(FakeProvider(fail_on="a", error=TopologyAffinityError()))
    result = manager.admit(Pod.of("p", [Container.of("a")]))
    assert result.reason == "TopologyAffinityError"


# --- pod scope ---


def test_pod_scope_one_merge_same_hint_for_every_container() -> None:
    manager = new_manager(TWO, "single-numa-node", "pod")
    provider = FakeProvider(pod_answer={"r": hs("1P", "0,1N")}, manager=manager)
    manager.add_hint_provider(provider)
    pod = pod_with_init()
    assert manager.admit(pod).admit
    assert provider.calls == [
        "pod-hints",
        "allocate:init1",
        "allocate:side",
        "allocate:app1",
        "allocate:app2",
    ]
    assert set(provider.seen_affinity.values()) == {"1P"}


def test_pod_scope_refusal_allocates_nothing() -> None:
    manager = new_manager(TWO, "restricted", "pod")
    provider = FakeProvider(pod_answer={"r": []})
    manager.add_hint_provider(provider)
    result = manager.admit(pod_with_init())
    assert result.reason == "TopologyAffinityError"
    assert provider.calls == ["pod-hints"]


# --- policy none ---


def test_policy_none_allocates_without_hints() -> None:
    manager = new_manager(TWO, "none", "whatever", {"unknown-option": "x"})
    provider = FakeProvider(answer={"r": []}, manager=manager)
    manager.add_hint_provider(provider)
    pod = pod_with_init()
    assert manager.admit(pod).admit
    assert provider.calls == ["allocate:init1", "allocate:side", "allocate:app1", "allocate:app2"]
    assert set(provider.seen_affinity.values()) == {"nilN"}
    assert manager.stored_affinity(pod.uid, "app1") is None
    assert manager.policy_name == "none" and manager.scope_name == "none"


def test_policy_none_still_fails_on_allocation_errors() -> None:
    manager = new_manager(TWO, "none")
    manager.add_hint_provider(FakeProvider(fail_on="app1"))
    result = manager.admit(Pod.of("p", [Container.of("app1")]))
    assert result.message == "Allocate failed due to boom, which is unexpected"


# --- upstream TestAdmit, restated: (policy, hints, admitted) for container and pod scopes ---

ADMIT = [
    ("best-effort", ["0P", "0,1N"], True),
    ("best-effort", ["0P", "1P", "0,1N"], True),
    ("best-effort", ["0,1N"], True),
    ("restricted", ["0P", "0,1N"], True),
    ("restricted", ["0P", "1P", "0,1N"], True),
    ("restricted", ["0,1N"], False),
    ("single-numa-node", ["0P", "0,1N"], True),
    ("single-numa-node", ["0,1N"], False),
]


@pytest.mark.parametrize(("policy", "hints", "admitted"), ADMIT)
@pytest.mark.parametrize("scope", ["container", "pod"])
def test_admit(policy: str, hints: list[str], admitted: bool, scope: str) -> None:
    manager = new_manager(TWO, policy, scope)
    manager.add_hint_provider(FakeProvider(answer={"r": hs(*hints)}, pod_answer={"r": hs(*hints)}))
    result = manager.admit(Pod.of("p", [Container.of("c")]))
    assert result.admit is admitted
    assert result.reason == (None if admitted else "TopologyAffinityError")


@pytest.mark.parametrize("policy", ["single-numa-node", "restricted"])
def test_providers_without_hints_admit(policy: str) -> None:
    manager = new_manager(TWO, policy)
    manager.add_hint_provider(FakeProvider())
    assert manager.admit(Pod.of("p", [Container.of("c")])).admit


# --- options and start-up ---


def test_policy_options() -> None:
    assert new_policy_options(None) == PolicyOptions(False, 8)
    assert new_policy_options(
        {"prefer-closest-numa-nodes": "true", "max-allowable-numa-nodes": "8"}
    ) == PolicyOptions(True, 8)
    assert new_policy_options({"max-allowable-numa-nodes": "12"}) == PolicyOptions(False, 12)
    assert new_policy_options({"prefer-closest-numa-nodes": "F"}).prefer_closest_numa is False
    assert new_policy_options({"max-allowable-numa-nodes": "+9"}).max_allowable_numa_nodes == 9


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unknown-option": "true"}, 'unknown Topology Manager Policy option: "unknown-option"'),
        (
            {"prefer-closest-numa-nodes": "not a boolean"},
            'bad value for option "prefer-closest-numa-nodes": strconv.ParseBool: parsing '
            '"not a boolean": invalid syntax',
        ),
        (
            {"max-allowable-numa-nodes": "can't parse to int"},
            'unable to convert policy option to integer "max-allowable-numa-nodes": '
            'strconv.Atoi: parsing "can\'t parse to int": invalid syntax',
        ),
        (
            {"max-allowable-numa-nodes": "1_0"},
            'unable to convert policy option to integer "max-allowable-numa-nodes": '
            'strconv.Atoi: parsing "1_0": invalid syntax',
        ),
        (
            {"max-allowable-numa-nodes": "99999999999999999999"},
            'unable to convert policy option to integer "max-allowable-numa-nodes": '
            'strconv.Atoi: parsing "99999999999999999999": value out of range',
        ),
        (
            {"max-allowable-numa-nodes": "7"},
            'the minimum value of "max-allowable-numa-nodes" should not be less than 8',
        ),
    ],
)
def test_bad_policy_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(StartupError) as err:
        new_policy_options(options)
    assert str(err.value) == message
    assert isinstance(err.value, InputError) and err.value.exit_code == 2


def test_parse_policy_options_flag() -> None:
    assert parse_policy_options_flag(" a=1 , b = 2,,c,a=3") == {"a": "3", "b": "2", "c": ""}
    assert parse_policy_options_flag("") == {}


NINE = NumaInfo(tuple(range(9)))


@pytest.mark.parametrize(
    ("numa", "policy", "scope", "options", "message"),
    [
        (TWO, "unknown", "container", None, 'unknown policy: "unknown"'),
        (TWO, "best-effort", "unknown", None, 'unknown scope: "unknown"'),
        (
            TWO,
            "restricted",
            "container",
            {"unknown-option": "true"},
            'unknown Topology Manager Policy option: "unknown-option"',
        ),
        (
            NumaInfo((0,)),
            "best-effort",
            "container",
            {"prefer-closest-numa-nodes": "true"},
            "cannot discover NUMA topology: error getting NUMA distances from cadvisor",
        ),
        (
            NINE,
            "best-effort",
            "container",
            None,
            "unsupported on machines with more than 8 NUMA Nodes",
        ),
        (
            NumaInfo(tuple(range(13))),
            "single-numa-node",
            "pod",
            {"max-allowable-numa-nodes": "12"},
            "unsupported on machines with more than 12 NUMA Nodes",
        ),
        # The node limit is checked before the policy name, as in the kubelet.
        (NINE, "bogus", "container", None, "unsupported on machines with more than 8 NUMA Nodes"),
    ],
)
def test_start_up_errors(
    numa: NumaInfo, policy: str, scope: str, options: dict[str, str] | None, message: str
) -> None:
    with pytest.raises(StartupError) as err:
        new_manager(numa, policy, scope, options)
    assert str(err.value) == message


def test_start_up_successes() -> None:
    assert new_manager(NINE, "none").policy_name == "none"
    m = new_manager(NINE, "restricted", "pod", {"max-allowable-numa-nodes": "9"})
    assert (m.policy_name, m.scope_name, m.options.max_allowable_numa_nodes) == (
        "restricted",
        "pod",
        9,
    )
    for policy in ("best-effort", "restricted", "single-numa-node"):
        assert new_manager(TWO, policy).scope_name == "container"


def test_config_validation_texts() -> None:
    validate_config("none", "pod")
    with pytest.raises(StartupError) as err:
        validate_config("invalid-policy", "container")
    assert str(err.value) == (
        'invalid configuration: topologyManagerPolicy (--topology-manager-policy) "invalid-policy"'
        ' must be one of: ["none" "best-effort" "restricted" "single-numa-node"]'
    )
    with pytest.raises(StartupError) as err:
        validate_config("none", "invalid-scope")
    assert str(err.value) == (
        'invalid configuration: topologyManagerScope (--topology-manager-scope) "invalid-scope"'
        ' must be one of: "container", or "pod"'
    )
    with pytest.raises(StartupError, match=r"^\[invalid configuration: .*, invalid config"):
        validate_config("x", "y")
