"""What ``nvplugin preferred`` asks of a node without serving it: which resource, which of its units
the IDs name, and its policy's answer -- the plugin's own plan and policy factory, for whole GPUs
and MIG devices alike.

The resource is one the plan serves under the MIG strategy: the node's whole GPUs (migStrategy
``none`` and no ``--resource``), else a MIG resource, named or the only one. The answer is printed
by the report of its kind: whole GPUs with their NVLink groups and scores
(:mod:`nvplugin.allocator.report`), MIG devices with their parents and NUMA nodes
(:mod:`nvplugin.allocator.migreport`; they have no NVLink, so nothing to ``--explain``).
"""

from __future__ import annotations

import json

from nvplugin.allocator import DEFAULT_BUDGET_S, explain_allocation, migreport
from nvplugin.allocator import report as gpu_report
from nvplugin.config.layout import ResourceRules, Sharing
from nvplugin.errors import InputError
from nvplugin.node.model import Topology
from nvplugin.resourcenames import DEFAULT_RESOURCE_NAME
from nvplugin.rm.devices import Kind
from nvplugin.rm.plan import ServedResource, plan_resources
from nvplugin.rm.policies import resource_policy


def preferred_resource(topology: Topology, mig_strategy: str, name: str | None) -> ServedResource:
    """The resource ``nvplugin preferred`` asks about (see the module docstring); InputError
    naming the MIG resources this node has when ``name`` is none of them, or is needed."""
    plan = plan_resources(
        topology.gpus, DEFAULT_RESOURCE_NAME, ResourceRules(), Sharing(), mig_strategy
    )
    kind = Kind.MIG if mig_strategy != "none" or name is not None else Kind.GPU
    candidates = [served for served in plan.resources if served.kind is kind]
    if name is None and len(candidates) == 1:
        return candidates[0]
    for served in candidates:
        if served.name == name:
            return served
    have = ", ".join(served.name for served in candidates)
    what = "MIG" if kind is Kind.MIG else "GPU"
    asked = "--resource is required" if name is None else f"{name} is no {what} resource"
    have = have or f"none under migStrategy {mig_strategy}"
    raise InputError(f"{asked} on this node ({what} resources: {have})")


def answer_preferred(
    topology: Topology,
    *,
    mig_strategy: str,
    resource: str | None,
    policy: str,
    available: str | None,
    must_include: str,
    size: int,
    explain: bool,
    output: str,
) -> str:
    """The answer as ``nvplugin preferred`` prints it (``output``: text or json). ``available``
    and ``must_include``: comma-separated IDs (None: every unit is available)."""
    mig = mig_strategy != "none" or resource is not None
    if mig and explain:
        raise InputError(
            "--explain is about NVLink groups of GPUs; MIG devices have no NVLink (their "
            "answer shows each device's parent GPU and NUMA node)"
        )
    served = preferred_resource(topology, mig_strategy, resource)
    units = tuple(device.unit for device in served.bases)
    if served.kind is Kind.MIG:
        devices = [device.mig for device in served.migs if device.mig is not None]
        name = served.name
        free = (
            units
            if available is None
            else migreport.resolve_mig_ids(devices, available, "--available", name)
        )
        must = migreport.resolve_mig_ids(devices, must_include, "--must-include", name)
        migreport.check_mig_must_include(devices, free, must)
        chosen = resource_policy(policy, topology, served, budget_s=DEFAULT_BUDGET_S)
        picked = chosen.allocate(free, must, size)
        if output == "json":
            doc = migreport.mig_to_json(topology, devices, picked, name, chosen.name)
            return json.dumps(doc, indent=2)
        return migreport.mig_to_text(topology, devices, picked, name, size, chosen.name)
    free = (
        units if available is None else gpu_report.resolve_ids(topology, available, "--available")
    )
    required = gpu_report.resolve_ids(topology, must_include, "--must-include")
    gpu_report.check_must_include(free, required)
    answer = explain_allocation(policy, topology, free, required, size)
    if output == "json":
        return json.dumps(gpu_report.to_json(topology, answer, explain), indent=2)
    return gpu_report.to_text(topology, answer, size, required, explain)
