"""The resource manager: the pure plan of what the plugin serves, behind a small interface.

Below the daemon and its gRPC server (:mod:`nvplugin.plugin`), above what the node has
(:mod:`nvplugin.node`), the config (:mod:`nvplugin.config`) and the allocation policies
(:mod:`nvplugin.allocator`); it imports nothing from :mod:`nvplugin.plugin`. No I/O, no NVML,
no event loop.

- :mod:`~nvplugin.rm.devices`: device units -- a whole GPU, a MIG device, a replica of either --
  with their IDs, NUMA node and the GPU whose health they follow.
- :mod:`~nvplugin.rm.plan`: what a node serves under a config (:func:`plan_for`): resources by
  model, exclusions, the MIG strategy (:mod:`~nvplugin.rm.migstrategy`) and sharing, time-slicing
  or MPS (:mod:`~nvplugin.rm.sharing`), whole GPUs and MIG devices in the same loops.
- :mod:`~nvplugin.rm.mps`: what an MPS share is, where an MPS resource's files are, and what its
  containers' Allocate responses add.
- :mod:`~nvplugin.rm.policies`: each resource's preferred-allocation policy, through the one
  factory, for every kind of unit.
- :mod:`~nvplugin.rm.requests`: :class:`ResourceManager`, one served resource as the server sees
  it: devices, the ListAndWatch listing (:mod:`~nvplugin.rm.listing`, with the kubelet's
  message-size bound), request checks, preferred allocation, Allocate responses
  (:mod:`~nvplugin.rm.responses`).
- :mod:`~nvplugin.rm.query`: what ``nvplugin preferred`` asks of a node without serving it.
"""

from __future__ import annotations

from nvplugin.rm.devices import REPLICA_SEPARATOR, Device, Kind, replica_id
from nvplugin.rm.mps import MpsAllocation
from nvplugin.rm.plan import ResourcePlan, ServedResource, plan_for, plan_resources
from nvplugin.rm.policies import resource_policies, resource_policy
from nvplugin.rm.requests import (
    MAX_CONTAINER_REQUESTS,
    CheckedRequest,
    ContainerRequest,
    RequestError,
    ResourceManager,
    check_container_count,
)
from nvplugin.rm.responses import Responder, check_caps, make_responder
from nvplugin.rm.sharing import Replicas

__all__ = [
    "MAX_CONTAINER_REQUESTS",
    "REPLICA_SEPARATOR",
    "CheckedRequest",
    "ContainerRequest",
    "Device",
    "Kind",
    "MpsAllocation",
    "Replicas",
    "RequestError",
    "ResourceManager",
    "ResourcePlan",
    "Responder",
    "ServedResource",
    "check_caps",
    "check_container_count",
    "make_responder",
    "plan_for",
    "plan_resources",
    "replica_id",
    "resource_policies",
    "resource_policy",
]
