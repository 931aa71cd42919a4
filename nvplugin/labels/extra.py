"""nvplugin's own node labels: the few that tell a scheduler what GFD's do not, under
:data:`PREFIX`.

GFD says how many GPUs a node has, not how well they are joined, and a pod asking for several
GPUs cares about both: NCCL over NVLink against PCIe is several times the bandwidth, and the
kubelet's topology manager with the ``single-numa-node`` policy refuses a pod whose GPUs do not
fit on one NUMA node. So, over the GPUs served whole (what ``nvidia.com/gpu``-style requests get):

- ``nvlink-clique.size``: the most GPUs of which every two are joined by NVLink (directly or
  through an NVSwitch fabric): the largest all-NVLink pod the node can hold (1 when no GPUs
  share an NVLink). ``nodeAffinity`` with ``Gt`` selects nodes that can: a pod of 4 GPUs
  that must be all-NVLink asks for ``nvlink-clique.size`` > 3.
- ``numa-node.gpus``: the most GPUs on one NUMA node (GPUs without a NUMA node count towards
  every node, as the kubelet lets them go with any): the largest pod the ``single-numa-node``
  policy admits on the node.

Both labels are left out when no GPU is served whole (every GPU in MIG mode under ``single`` or
``mixed``, or excluded). The prefix is a sub-namespace of NFD's own ``feature.node.kubernetes.io``,
which NFD always accepts, as a file's labels and a NodeFeature's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from nvplugin.node.model import Gpu, Topology
from nvplugin.rm.devices import Kind
from nvplugin.rm.plan import ResourcePlan

PREFIX = "nvplugin.feature.node.kubernetes.io/"
CLIQUE = f"{PREFIX}nvlink-clique.size"
NUMA_GPUS = f"{PREFIX}numa-node.gpus"
CLIQUE_SEARCH_STEPS = 200_000
"""How many search steps the clique may take: far more than any real node needs (an NVSwitch
fabric is one clique, other GPUs have at most 18 NVLinks); on a contrived node file beyond it,
the largest clique found so far is labelled."""


def extra_labels(topology: Topology, plan: ResourcePlan | None) -> dict[str, str]:
    """nvplugin's labels (see the module docstring) for ``plan`` on ``topology``."""
    if plan is None:
        return {}
    whole = sorted(
        {
            device.gpu.index
            for served in plan.resources
            if served.kind is Kind.GPU
            for device in served.bases
        }
    )
    if not whole:
        return {}
    return {
        CLIQUE: str(nvlink_clique(topology, whole)),
        NUMA_GPUS: str(gpus_per_numa_node([topology.gpus[i] for i in whole])),
    }


def gpus_per_numa_node(gpus: Sequence[Gpu]) -> int:
    """The most of ``gpus`` on one NUMA node, GPUs without a NUMA node counting on every one."""
    per_node = Counter(gpu.numa_node for gpu in gpus if gpu.numa_node is not None)
    anywhere = sum(1 for gpu in gpus if gpu.numa_node is None)
    return max(per_node.values(), default=0) + anywhere


def nvlink_clique(topology: Topology, indices: Sequence[int]) -> int:
    """The size of the largest set of ``indices`` every two of which share an NVLink (at least 1
    for a non-empty set): Bron-Kerbosch with pivoting over the NVLink graph, bounded by
    :data:`CLIQUE_SEARCH_STEPS`."""
    if not indices:
        return 0
    members = set(indices)
    peers = {i: {j for j in members if j != i and topology.link(i, j).nvlinks > 0} for i in members}
    best = 1
    steps = 0

    def expand(size: int, candidates: set[int], excluded: set[int]) -> None:
        nonlocal best, steps
        steps += 1
        if not candidates and not excluded:
            best = max(best, size)
            return
        if size + len(candidates) <= best or steps > CLIQUE_SEARCH_STEPS:
            best = max(best, size)
            return
        pivot = max(candidates | excluded, key=lambda v: len(peers[v] & candidates))
        for vertex in sorted(candidates - peers[pivot]):
            expand(size + 1, candidates & peers[vertex], excluded & peers[vertex])
            candidates = candidates - {vertex}
            excluded = excluded | {vertex}

    expand(0, members, set())
    return best
