"""The CPUs of a node file, in its two forms, and how each is found from what a machine shows.

- The **compact** form, :class:`CpuSpec`: sockets x cores x threads, numbered as Linux numbers x86
  servers (:meth:`CpuLayout.build`). Most machines are exactly this.
- The **explicit** form, :class:`CpuLists`: each NUMA node's and each socket's CPU list, as
  ``/sys/devices/system/node/node*/cpulist`` and ``lscpu`` show them, for the rest: CPUs numbered
  alternately across sockets, NUMA nodes without CPUs (GPU memory on Grace Hopper), odd VMs.

:func:`describe_layout` picks the form for a layout read from sysfs (``nvplugin node capture``);
:func:`fit_affinities` finds one from the ``CPU Affinity`` lists of ``nvidia-smi topo -m``
(``nvplugin node import``, and a node file whose ``links`` is a whole paste). Both give the
compact form whenever it reproduces what was seen, so files stay short.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nvplugin.node.model import CpuLayout

MAX_GUESSED_NUMA_NODES = 8
"""The most NUMA nodes :func:`fit_affinities` tries beyond those the text names (a DGX A100 in
NPS4 has 8, with GPUs on only four of them)."""


@dataclass(frozen=True, slots=True)
class CpuSpec:
    """The compact form: ``sockets`` x ``cores_per_socket`` x ``threads_per_core``."""

    sockets: int
    cores_per_socket: int
    threads_per_core: int

    def layout(self, numa_nodes: int) -> CpuLayout:
        """The CPUs over ``numa_nodes`` NUMA nodes; ValueError when they do not split evenly."""
        return CpuLayout.build(
            self.sockets, self.cores_per_socket, self.threads_per_core, numa_nodes
        )


@dataclass(frozen=True, slots=True)
class CpuLists:
    """The explicit form: the CPU ids of each NUMA node (index = node id) and of each socket."""

    numa_cpus: tuple[tuple[int, ...], ...]
    socket_cpus: tuple[tuple[int, ...], ...]
    threads_per_core: int

    def layout(self) -> CpuLayout:
        """The CPUs; ValueError when the lists disagree (see :meth:`CpuLayout.from_lists`)."""
        return CpuLayout.from_lists(self.numa_cpus, self.socket_cpus, self.threads_per_core)


CpuForm = CpuSpec | CpuLists


def layout_of(form: CpuForm, numa_nodes: int) -> CpuLayout:
    """The CPUs a form gives on a node with ``numa_nodes`` NUMA nodes (ValueError if none)."""
    if isinstance(form, CpuSpec):
        return form.layout(numa_nodes)
    if len(form.numa_cpus) != numa_nodes:
        raise ValueError(f"lists {len(form.numa_cpus)} NUMA nodes, the node has {numa_nodes}")
    return form.layout()


def describe_layout(layout: CpuLayout, numa_nodes: int) -> tuple[CpuForm, str | None]:
    """The node-file form that gives ``layout`` (sockets and cores renumbered by lowest CPU id),
    and a note when sibling threads could not be expressed (then each CPU is its own core)."""
    normal = layout.normalized()
    sockets = normal.sockets
    threads = normal.threads_per_core
    total = len(normal.cpus)
    if sockets and threads and total % (sockets * threads) == 0:
        compact = CpuSpec(sockets, total // (sockets * threads), threads)
        try:
            if compact.layout(numa_nodes) == normal:
                return compact, None
        except ValueError:
            pass
    numa_cpus = tuple(normal.on_node(n) for n in range(numa_nodes))
    socket_cpus = tuple(normal.on_socket(s) for s in range(sockets))
    lists = CpuLists(numa_cpus, socket_cpus, threads)
    try:
        if lists.layout() == normal:
            return lists, None
    except ValueError:
        pass
    note = (
        f"the hardware threads of a core are not numbered the x86 way here, so each of the "
        f"{total} CPUs is written as its own core (threads_per_core: 1)"
    )
    return CpuLists(numa_cpus, socket_cpus, 1), note


@dataclass(frozen=True)
class AffinityFit:
    """CPUs and NUMA nodes consistent with a text's CPU Affinity lists.

    ``labels``: the NUMA node found for each unlabeled list, in the order given. ``notes``: what
    was guessed, for a comment in the node file.
    """

    cpus: CpuForm
    numa_nodes: int
    labels: tuple[int, ...]
    notes: tuple[str, ...]


def fit_affinities(
    labeled: Mapping[tuple[int, ...], tuple[int, ...]],
    unlabeled: Sequence[tuple[int, ...]],
    min_nodes: int,
) -> AffinityFit | None:
    """CPUs for a machine of which only some CPU lists are known; None when none is.

    ``labeled`` maps a set of NUMA nodes (a GPU's ``NUMA Affinity``: one node, or a range) to
    the CPUs of those nodes together; ``unlabeled`` are lists each of one NUMA node whose id the
    text does not say (drivers before the NUMA Affinity column); ``min_nodes`` is the least NUMA
    node count (one more than the highest node named).

    The first compact form that reproduces every list wins, trying the fewest NUMA nodes first,
    then 2 threads per core before 1, 4, 8, then 2 sockets before 1, 4, 8 (a two-socket server
    is the common GPU node). The text shows neither sockets nor threads, so the notes say these
    are a guess. When no compact form fits, the lists themselves become the explicit form.
    """
    lists = [*labeled.values(), *unlabeled]
    if not any(lists):
        return None
    top = max(max(cpus) for cpus in lists if cpus) + 1
    for nodes in range(max(min_nodes, 1), max(min_nodes, MAX_GUESSED_NUMA_NODES) + 1):
        for threads in (2, 1, 4, 8):
            for sockets in (1, 2) if nodes == 1 else (2, 1, 4, 8):
                for total in _totals(lists, top, threads):
                    fit = _try(labeled, unlabeled, nodes, threads, sockets, total)
                    if fit is not None:
                        return fit
    return _explicit(labeled, unlabeled, min_nodes)


def _totals(lists: Sequence[tuple[int, ...]], top: int, threads: int) -> list[int]:
    """CPU counts worth trying: the highest CPU seen + 1, and with several threads per core,
    ``threads`` x the distance between a list's first two runs (the sibling offset), which
    reveals CPUs above the highest seen when the last NUMA node has no GPU."""
    totals = {top}
    if threads > 1:
        for cpus in lists:
            runs = _runs(cpus)
            if len(runs) == threads:
                totals.add(threads * (runs[1][0] - runs[0][0]))
    return sorted(t for t in totals if t >= top)


def _runs(cpus: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive ids, as (first, last)."""
    runs: list[tuple[int, int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], cpu)
        else:
            runs.append((cpu, cpu))
    return runs


def _try(
    labeled: Mapping[tuple[int, ...], tuple[int, ...]],
    unlabeled: Sequence[tuple[int, ...]],
    nodes: int,
    threads: int,
    sockets: int,
    total: int,
) -> AffinityFit | None:
    if total % (sockets * threads):
        return None
    spec = CpuSpec(sockets, total // (sockets * threads), threads)
    try:
        layout = spec.layout(nodes)
    except ValueError:
        return None
    per_node = [layout.on_node(n) for n in range(nodes)]
    for members, cpus in labeled.items():
        if any(n >= nodes for n in members):
            return None
        if tuple(sorted(c for n in members for c in per_node[n])) != tuple(sorted(cpus)):
            return None
    labels = []
    for cpus in unlabeled:
        matches = [n for n in range(nodes) if per_node[n] == tuple(sorted(cpus))]
        if not matches:
            return None
        labels.append(matches[0])
    guess = (
        f"cpus: {_count(sockets, 'socket')} of {spec.cores_per_socket} cores with "
        f"{_count(threads, 'thread')} each reproduce every CPU Affinity list; nvidia-smi topo -m "
        "shows neither sockets nor threads, so check them with lscpu"
    )
    return AffinityFit(spec, nodes, tuple(labels), (guess,))


def _explicit(
    labeled: Mapping[tuple[int, ...], tuple[int, ...]],
    unlabeled: Sequence[tuple[int, ...]],
    min_nodes: int,
) -> AffinityFit:
    """The lists as they are, when no compact form reproduces them.

    Unlabeled lists (there are no labeled ones then) become nodes 0, 1, ... by lowest CPU. A
    NUMA range gives the CPUs no single node claims to its first node. Nodes that no list names
    have no CPUs; each NUMA node with CPUs is its own socket.
    """
    per_node: dict[int, set[int]] = {}
    for members, cpus in sorted(labeled.items(), key=lambda item: (len(item[0]), item[0])):
        rest = set(cpus).difference(*per_node.values())
        if rest:
            per_node.setdefault(members[0], set()).update(rest)
    by_lowest = sorted(range(len(unlabeled)), key=lambda k: min(unlabeled[k], default=0))
    labels = [0] * len(unlabeled)
    for node, k in enumerate(by_lowest):
        per_node.setdefault(node, set()).update(unlabeled[k])
        labels[k] = node
    count = max([min_nodes, 1, *(n + 1 for n in per_node)])
    numa_cpus = tuple(tuple(sorted(per_node.get(n, ()))) for n in range(count))
    socket_cpus = tuple(cpus for cpus in numa_cpus if cpus)
    threads = _threads_from_runs(socket_cpus)
    note = (
        "cpus: no sockets x cores x threads layout reproduces the CPU Affinity lists, so the "
        "lists are "
        f"written as they are; NUMA nodes with no GPU have no CPUs here, each NUMA node is its "
        f"own socket and threads_per_core ({threads}) is a guess: check with lscpu"
    )
    return AffinityFit(CpuLists(numa_cpus, socket_cpus, threads), count, tuple(labels), (note,))


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _threads_from_runs(socket_cpus: Sequence[tuple[int, ...]]) -> int:
    """2, 4 or 8 when every socket's CPUs are that many equal runs (the x86 sibling blocks),
    else 1."""
    counts = set()
    for cpus in socket_cpus:
        runs = _runs(cpus)
        lengths = {last - first for first, last in runs}
        counts.add(len(runs) if len(lengths) == 1 else 1)
    if len(counts) == 1:
        (count,) = counts
        if count in (2, 4, 8):
            return count
    return 1
