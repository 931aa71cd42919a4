"""Each served resource's preferred-allocation policy, from the one factory
(:func:`nvplugin.allocator.make_policy`) and the config's ``allocationPolicy``, whatever its units.

- Whole GPUs: the policy over the node's topology (GPU indices). It is the same for every resource
  of whole GPUs (each asks it about its own GPUs), so it is made once per node: best-effort's
  tables take a while on a 16-GPU node.
- MIG devices: the policy over the resource's MIG devices (their positions): ``best-effort`` is the
  MIG policy, ``simple`` the lowest positions first.
- Replicas (time-slicing): ``distributed`` or ``packed`` on top of their unit's policy
  (:meth:`nvplugin.rm.sharing.Replicas.prefer`, applied by the resource manager).
"""

from __future__ import annotations

from collections.abc import Sequence

from nvplugin.allocator import Policy, make_policy
from nvplugin.node.model import Topology
from nvplugin.rm.devices import Kind
from nvplugin.rm.plan import ServedResource


def resource_policies(
    name: str, topology: Topology, resources: Sequence[ServedResource], *, budget_s: float
) -> dict[str, Policy]:
    """Policy ``name`` for each of ``resources`` (by resource name). Runs the policies'
    start-up work: the daemon calls it off the event loop."""
    policies: dict[str, Policy] = {}
    node_policy: Policy | None = None
    for resource in resources:
        if resource.kind is Kind.MIG:
            migs = [device.mig for device in resource.bases if device.mig is not None]
            policies[resource.name] = make_policy(
                name, topology, budget_s=budget_s, mig_devices=migs
            )
            continue
        if node_policy is None:
            node_policy = make_policy(name, topology, budget_s=budget_s)
        policies[resource.name] = node_policy
    return policies


def resource_policy(
    name: str, topology: Topology, resource: ServedResource, *, budget_s: float
) -> Policy:
    """Policy ``name`` for one resource (see the module docstring)."""
    return resource_policies(name, topology, [resource], budget_s=budget_s)[resource.name]
