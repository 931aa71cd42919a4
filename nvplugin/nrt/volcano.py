"""The same facts in Volcano's ``Numatopology`` (``nodeinfo.volcano.sh/v1alpha1``,
cluster-scoped, named after the node), the object Volcano's resource exporter writes and its
numa-aware scheduler plugin reads; its fields as Volcano's published types (volcano-sh/apis,
``pkg/apis/nodeinfo/v1alpha1/numatopo_types.go``) define them:

- ``spec.policies``: ``CPUManagerPolicy`` and ``TopologyManagerPolicy`` (the kubelet's values;
  ``none`` when not known, as the exporter starts);
- ``spec.resReserved``: ``cpu``, the CPU quantity the kubelet reserves (``kubeReserved`` plus
  ``systemReserved``);
- ``spec.numares``: per resource, ``allocatable`` (a list: the CPUs not held exclusively, as a
  cpuset; for each resource of whole, unshared GPUs, the free GPUs' indices, comma-separated, as
  the exporter writes ``nvidia.com/gpu``) and ``capacity`` (how many there are);
- ``spec.cpuDetail``: each CPU's NUMA node, socket and core (Go's ``omitempty``: zeros left out).
"""

from __future__ import annotations

from typing import Any

from nvplugin.api.podresources.v1 import api_pb2
from nvplugin.node.model import Topology, format_cpu_list
from nvplugin.nrt.objects import KubeletPolicies, free_devices, whole_gpu_free
from nvplugin.rm.plan import ResourcePlan

GROUP = "nodeinfo.volcano.sh"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Numatopology"
PLURAL = "numatopologies"
UNKNOWN = KubeletPolicies()


def _omit_zero(**fields: int) -> dict[str, int]:
    return {k: v for k, v in fields.items() if v}


def build_numatopology(
    node_name: str,
    topology: Topology,
    plan: ResourcePlan,
    listed: api_pb2.ListPodResourcesResponse,
    allocatable: api_pb2.AllocatableResourcesResponse,
    policies: KubeletPolicies = UNKNOWN,
    reserved_cpu: str = "0",
) -> dict[str, Any]:
    """Volcano's Numatopology object for ``node_name`` (no owner: the publisher adds it)."""
    cpus = [c.id for c in topology.cpus.cpus]
    held = {int(cpu) for pod in listed.pod_resources for c in pod.containers for cpu in c.cpu_ids}
    numares: dict[str, dict[str, Any]] = {
        "cpu": {
            "allocatable": format_cpu_list(sorted(set(cpus) - held)),
            "capacity": len(cpus),
        }
    }
    free = free_devices(plan, listed, allocatable)
    for resource, gpus in whole_gpu_free(plan, free).items():
        served = plan.resource(resource)
        numares[resource] = {
            "allocatable": ",".join(str(g) for g in gpus),
            "capacity": len(served.bases) if served is not None else len(gpus),
        }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": node_name},
        "spec": {
            "policies": {
                "CPUManagerPolicy": policies.cpu_manager_policy or "none",
                "TopologyManagerPolicy": policies.topology_manager_policy or "none",
            },
            "resReserved": {"cpu": reserved_cpu},
            "numares": {k: {kk: vv for kk, vv in v.items() if vv} for k, v in numares.items()},
            "cpuDetail": {
                str(c.id): _omit_zero(numa=c.numa_node, socket=c.socket, core=c.core)
                for c in topology.cpus.cpus
            },
        },
    }
