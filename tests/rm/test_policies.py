"""Each served resource's policy through the one factory: resources of whole GPUs share the node's
policy (made once), a MIG resource gets the configured policy over its MIG devices, replicas
choose on top of their unit's policy; and the resource manager answering through them."""

from __future__ import annotations

import pytest

from nvplugin.allocator.besteffort import BestEffort
from nvplugin.allocator.mig import MigPolicy
from nvplugin.allocator.simple import Simple
from nvplugin.config import load_config
from nvplugin.nodesession import load_topology
from nvplugin.rm import (
    ContainerRequest,
    RequestError,
    ResourceManager,
    plan_for,
    resource_policies,
)
from tests.support.service import write_config

NODE = load_topology("dgx-a100-mig")


def policies_of(policy: str, text: str = "") -> tuple[dict[str, object], dict[str, list[str]]]:
    """The policies of the mixed plan of dgx-a100-mig under ``policy`` (plus ``resources.gpus``
    splitting GPUs 6 and 7), and each resource's unit labels."""
    flags = {"flags.migStrategy": "mixed", "nvplugin.allocationPolicy": policy}
    config = load_config(None, flags=flags)
    if text:
        config = load_config(write_config("version: v1\n" + text), flags=flags)
    plan = plan_for(config, NODE.gpus)
    policies = resource_policies(policy, NODE, plan.resources, budget_s=0.1)
    labels = {r.name: [d.label for d in r.bases] for r in plan.resources}
    return dict(policies), labels


def test_whole_gpu_resources_share_the_node_policy_and_mig_resources_get_their_own() -> None:
    rules = "resources:\n  gpus:\n    - {pattern: '*', name: a100}\n"
    policies, labels = policies_of("best-effort", rules)
    assert labels["nvidia.com/a100"] == ["6", "7"]
    assert isinstance(policies["nvidia.com/a100"], BestEffort)
    assert isinstance(policies["nvidia.com/mig-1g.5gb"], MigPolicy)
    assert isinstance(policies["nvidia.com/mig-3g.20gb"], MigPolicy)
    assert policies["nvidia.com/mig-1g.5gb"] is not policies["nvidia.com/mig-3g.20gb"]
    policies, _ = policies_of("simple")
    assert {type(p) for p in policies.values()} == {Simple}
    assert policies["nvidia.com/gpu"].allocate([7, 6], [], 1) == [6]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("policy", "chosen"), [("best-effort", ["2:2", "2:3"]), ("simple", ["0:0", "0:1"])]
)
def test_the_manager_answers_through_the_resources_policy(policy: str, chosen: list[str]) -> None:
    flags = {"flags.migStrategy": "mixed", "nvplugin.allocationPolicy": policy}
    plan = plan_for(load_config(None, flags=flags), NODE.gpus)
    resource = plan.resource("nvidia.com/mig-1g.5gb")
    assert resource is not None
    policies = resource_policies(policy, NODE, [resource], budget_s=0.1)
    manager = ResourceManager(resource)
    ids = [d.id for d in manager.devices]
    label = {d.id: d.label for d in manager.devices}
    (answer,) = manager.preferred(policies[resource.name], [ContainerRequest(ids, [], 2)])
    assert [label[i] for i in answer] == chosen
    with pytest.raises(RequestError, match="allocation_size: -1 is negative"):
        manager.preferred(policies[resource.name], [ContainerRequest(ids, [], -1)])
    with pytest.raises(RequestError, match=r"container request 1: devices_ids: unknown device x"):
        manager.allocate([ids[:1], ["x"]])


def test_replicas_choose_on_top_of_the_mig_policy() -> None:
    """Time-sliced MIG devices: distributed spreads over the MIG devices the unit policy links
    best -- for MIG devices, those on one parent."""
    text = "sharing:\n  timeSlicing:\n    resources:\n      - {name: mig-1g.5gb, replicas: 2}\n"
    policies, _ = policies_of("best-effort", text)
    flags = {"flags.migStrategy": "mixed"}
    plan = plan_for(load_config(write_config("version: v1\n" + text), flags=flags), NODE.gpus)
    resource = plan.resource("nvidia.com/mig-1g.5gb")
    assert resource is not None and resource.replicas.count == 2
    manager = ResourceManager(resource)
    ids = [d.id for d in manager.devices]
    parent = {d.id: d.gpu.index for d in manager.devices}
    (answer,) = manager.preferred(policies[resource.name], [ContainerRequest(ids, [], 2)])
    # two replicas on two different MIG devices (distributed), both on GPU 2 (the MIG policy)
    assert len({i.partition("::")[0] for i in answer}) == 2
    assert {parent[i] for i in answer} == {2}
