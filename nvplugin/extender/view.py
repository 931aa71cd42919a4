"""The extender's view of the cluster: each node's NRT object, less what pods the extender
passed and the scheduler bound there still hold until the NRT shows them (reservations), and the
answers to filter and prioritize over it.

Nodes with the same free state for the resources a pod asks for are judged once
(:class:`~nvplugin.extender.cache.JudgeCache`); the naive way, one admission per node, is kept
for the benchmark and the tests (``naive=True``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from nvplugin.extender.cache import JudgeCache
from nvplugin.extender.judge import (
    CANDIDATE,
    Judge,
    Needs,
    StateKey,
    Verdict,
    Zones,
    pod_signature,
    zones_of,
)
from nvplugin.extender.nrt import NodeTopology
from nvplugin.fakekubelet.pods import CPU, QOS_GUARANTEED, Pod
from nvplugin.fakekubelet.topologymanager import StartupError
from nvplugin.fakekubelet.topologymanager.scope import REASON_UNEXPECTED
from nvplugin.log import get_logger

RESERVATION_S = 120.0
"""How long a reservation counts at most when the node's NRT never shows its pod."""
MAX_SCORE = 10
"""The extender protocol's highest priority (``MaxExtenderPriority``)."""

_log = get_logger("nvplugin.extender")


@dataclass(frozen=True)
class Weights:
    """Prioritize's weights: fewer NUMA nodes for the pod, then the best group's score."""

    numa: float = 1.0
    group: float = 0.5


@dataclass
class Reservation:
    """What a bound pod takes on its node until the NRT shows it."""

    pod_uid: str
    taken: tuple[tuple[str, int, int], ...]
    fingerprint: str | None
    generation: int | None
    expires: float


Clamp = Mapping[str, int] | None


def pod_clamp(pod: Pod) -> Clamp:
    """Per device resource, the count above which a zone's items make no difference to the pod.

    A pod whose devices all go to one container takes at most its request from any zone, so a
    zone's device counts can be cut to the request without changing a hint, an allocation or a
    verdict -- only the totals some rejections print, which :func:`unclamp` puts back. Nodes
    whose free states differ only above that then share one judgement. Exclusive CPUs are not
    cut: the static policy packs them by how many CPUs each NUMA node has, and has free, counts
    above the request included. With several containers taking, which zone an earlier one took
    from can decide a later one's hints through counts above the cut, so nothing is cut (None).
    """
    takers = [c for c in pod.all_containers if any(q.int_value for q in c.limits.values())]
    if len(takers) != 1:
        return None
    only = takers[0]
    return {r: q.int_value for r, q in only.limits.items() if q.int_value > 0 and r != CPU}


_AVAILABLE = re.compile(r"(unavailable for (\S+)\. Requested: \d+, Available: )(\d+)")
"""The device manager's rejection whose total a clamp can have cut (CPUs are never cut)."""


def one_container_needs(pod: Pod, devices: Iterable[str], exclusive: bool) -> Needs:
    """What a one-container pod takes: its device limits, and its CPU request when whole in a
    Guaranteed pod (exclusive CPUs under the static policy)."""
    (only,) = pod.all_containers
    out = [(r, only.limits[r].int_value) for r in sorted(devices) if r in only.limits]
    cpu = only.requests.get(CPU)
    whole = None if cpu is None else cpu.whole_number
    if exclusive and whole:
        out.append((CPU, whole))
    return tuple(out)


def unclamp(verdict: Verdict, hidden: Mapping[str, int]) -> Verdict:
    """A rejection's printed totals with the items a clamp hid added back."""
    message = verdict.message or ""
    match = _AVAILABLE.search(message)
    extra = 0 if match is None else hidden.get(match.group(2), 0)
    if match is not None and extra:
        number = int(match.group(3)) + extra
        message = message[: match.start(3)] + str(number) + message[match.end(3) :]
    return Verdict(verdict.admit, verdict.reason, message, verdict.taken)


@dataclass(frozen=True)
class PodPlan:
    names: tuple[str, ...]
    exclusive: bool
    single: bool
    clamp: Clamp
    clamp_key: tuple[tuple[str, int], ...] | None
    signature: tuple[object, ...]
    needs: Needs | None
    """For a one-container pod, what it takes (see judge.one_node_verdict)."""
    shape: int
    """A small number per distinct ``signature`` (cheaper to hash, node by node)."""
    most: Mapping[str, int]
    """Resource -> the most of it one container asks for (absent: none)."""


@dataclass
class NodeEntry:
    nrt: NodeTopology
    reservations: dict[str, Reservation] = field(default_factory=dict)
    zones: dict[str, Zones] = field(default_factory=dict)
    """Resource -> effective per-zone counts (the NRT's less the reservations)."""
    clamped: dict[tuple[str, int], tuple[Zones, int]] = field(default_factory=dict)
    """(resource, cut) -> the counts cut there, and the free items the cut hid."""
    keys: dict[object, tuple[StateKey, dict[str, int]]] = field(default_factory=dict)
    """What a pod plan's key is on this node (dropped with every recount)."""
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    """Pod shape -> this node's verdict (dropped with every recount)."""
    scores: dict[int, int] = field(default_factory=dict)
    """Pod shape -> this node's priority (dropped with every recount)."""


class View:
    """NRT objects by node, reservations, and the verdicts (see module doc)."""

    def __init__(
        self,
        *,
        weights: Weights = Weights(),
        reservation_s: float = RESERVATION_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.weights = weights
        self.reservation_s = reservation_s
        self.clock = clock
        self.cache = JudgeCache()
        self._nodes: dict[str, NodeEntry] = {}
        self._said: set[tuple[str, str]] = set()
        # The latest pass per pod and node, waiting for the pod's binding.
        self._passed: dict[str, dict[str, Verdict]] = {}
        self._last_plan: tuple[Pod, PodPlan] | None = None
        self._shapes: dict[tuple[object, ...], int] = {}
        self._next_shape = 0

    # --- state ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._nodes)

    def nrt(self, node: str) -> NodeTopology | None:
        entry = self._nodes.get(node)
        return entry.nrt if entry is not None else None

    def set_nrt(self, nrt: NodeTopology) -> None:
        """A node's NRT, new or changed: reservations it shows are dropped."""
        old = self._nodes.get(nrt.name)
        entry = NodeEntry(nrt)
        if old is not None:
            entry.reservations = {
                uid: r for uid, r in old.reservations.items() if not self._shown(r, nrt)
            }
        self._nodes[nrt.name] = entry
        self._recount(entry)

    def remove_nrt(self, node: str) -> None:
        self._nodes.pop(node, None)

    @staticmethod
    def _shown(r: Reservation, nrt: NodeTopology) -> bool:
        if r.fingerprint is not None and nrt.fingerprint is not None:
            return nrt.fingerprint != r.fingerprint
        return r.generation is not None and (nrt.generation or 0) > r.generation

    def _recount(self, entry: NodeEntry) -> None:
        minus: dict[tuple[str, int], int] = {}
        for r in entry.reservations.values():
            for resource, node, n in r.taken:
                minus[(resource, node)] = minus.get((resource, node), 0) + n
        entry.zones = {}
        for resource, counts in entry.nrt.resources.items():
            zones = zones_of(counts)
            if minus:
                zones = tuple(
                    (n, c, a, max(0, v - minus.get((resource, n), 0))) for n, c, a, v in zones
                )
            entry.zones[resource] = zones
        entry.clamped = {}
        entry.keys = {}
        entry.verdicts = {}
        entry.scores = {}

    def bound(self, pod_uid: str, node: str) -> bool:
        """The scheduler bound ``pod_uid`` to ``node``: reserve what it would take there, if
        the extender passed it there. True when a reservation was made."""
        verdict = self._passed.pop(pod_uid, {}).get(node)
        entry = self._nodes.get(node)
        if verdict is None or entry is None or pod_uid in entry.reservations:
            return False
        entry.reservations[pod_uid] = Reservation(
            pod_uid,
            verdict.taken,
            entry.nrt.fingerprint,
            entry.nrt.generation,
            self.clock() + self.reservation_s,
        )
        self._recount(entry)
        return True

    def pod_gone(self, pod_uid: str) -> None:
        self._passed.pop(pod_uid, None)
        for entry in self._nodes.values():
            if entry.reservations.pop(pod_uid, None) is not None:
                self._recount(entry)

    def expire(self) -> int:
        """Drop reservations past their bound; how many."""
        now = self.clock()
        dropped = 0
        for entry in self._nodes.values():
            old = [u for u, r in entry.reservations.items() if r.expires <= now]
            for uid in old:
                del entry.reservations[uid]
            if old:
                dropped += len(old)
                self._recount(entry)
        return dropped

    def reservations(self, node: str) -> tuple[Reservation, ...]:
        entry = self._nodes.get(node)
        return tuple(entry.reservations.values()) if entry is not None else ()

    def _say_once(self, node: str, what: str, **details: object) -> None:
        if (node, what) not in self._said and len(self._said) < 100_000:
            self._said.add((node, what))
            _log.warning(what, node=node, **details)

    # --- verdicts --------------------------------------------------------------------------

    def key(
        self,
        entry: NodeEntry,
        resources: Sequence[str],
        exclusive_cpu: bool,
        clamp: Clamp,
        single_container: bool = False,
    ) -> tuple[StateKey, dict[str, int]]:
        """The verdict's key, and per resource how many free items the clamp hid (see
        :func:`pod_clamp`)."""
        nrt = entry.nrt
        cpu_policy = nrt.cpu_policy or "none"
        names = [r for r in resources if r in entry.zones]
        if exclusive_cpu and cpu_policy == "static" and CPU in entry.zones:
            names.append(CPU)
        wanted = []
        hidden: dict[str, int] = {}
        for r in names:
            limit = clamp.get(r) if clamp is not None else None
            if limit is None:
                wanted.append((r, entry.zones[r]))
                continue
            memo = entry.clamped.get((r, limit))
            if memo is None:
                zones = entry.zones[r]
                clamped = tuple(
                    (n, min(c, limit), min(a, limit), min(v, limit)) for n, c, a, v in zones
                )
                gap = sum(z[3] for z in zones) - sum(z[3] for z in clamped)
                memo = entry.clamped[(r, limit)] = (clamped, gap)
            wanted.append((r, memo[0]))
            if memo[1]:
                hidden[r] = memo[1]
        if CPU not in names:
            cpu_policy = "none"  # no exclusive CPUs in play: both policies judge alike
        scope = nrt.scope
        if single_container:
            scope = "container"  # one container's merge is the pod's merge
        key = StateKey(nrt.policy, scope, cpu_policy, nrt.zones, tuple(wanted))
        return key, hidden

    def verdict(self, node: str, pod: Pod, *, naive: bool = False) -> Verdict | None:
        """The kubelet's verdict for ``pod`` on ``node``; None when the node has no NRT."""
        entry = self._nodes.get(node)
        if entry is None:
            self._say_once(node, "node has no NodeResourceTopology; passed unjudged")
            return None
        nrt = entry.nrt
        if nrt.cpu_policy is None:
            self._say_once(node, "NRT gives no cpuManagerPolicy; judging devices alone")
        if nrt.memory_policy == "Static":
            self._say_once(node, "memory manager Static is not modelled; memory not aligned")
        plan = self._plan(pod)
        if not naive:
            done = entry.verdicts.get(plan.shape)
            if done is not None:
                return done
        resources = tuple(r for r in plan.names if r in entry.zones)
        if naive:
            key, _ = self.key(entry, resources, plan.exclusive, None)
            try:
                return Judge(key).judge(pod)
            except StartupError as exc:
                return self._startup(node, str(exc))
        memo = (resources, plan.clamp_key, plan.exclusive, plan.single)
        found = entry.keys.get(memo)
        if found is None:
            if len(entry.keys) >= 64:  # many pod shapes: start over rather than grow
                entry.keys.clear()
            found = entry.keys[memo] = self.key(
                entry, resources, plan.exclusive, plan.clamp, plan.single
            )
        key, hidden = found
        verdict = self.cache.verdict(
            key, pod, plan.signature, lambda text: self._startup(node, text), plan.needs
        )
        if hidden and not verdict.admit:
            verdict = unclamp(verdict, hidden)
        if len(entry.verdicts) >= 64:  # many pod shapes: start over rather than grow
            entry.verdicts.clear()
        entry.verdicts[plan.shape] = verdict
        return verdict

    def _plan(self, pod: Pod) -> PodPlan:
        """What of ``pod`` every node's judgement needs, worked out once per pod."""
        last = self._last_plan
        if last is not None and last[0] is pod:
            return last[1]
        clamp = pod_clamp(pod)
        names = {r for c in pod.all_containers for r in c.limits} - {CPU, "memory"}
        exclusive = pod.qos_class == QOS_GUARANTEED
        single = len(pod.all_containers) == 1
        signature = pod_signature(pod)
        shape = self._shapes.get(signature)
        if shape is None:
            if len(self._shapes) >= 10_000:  # numbers stay unique: entries may hold old ones
                self._shapes.clear()
            shape = self._shapes[signature] = self._next_shape
            self._next_shape += 1
        plan = PodPlan(
            names=tuple(sorted(names)),
            exclusive=exclusive,
            single=single,
            clamp=clamp,
            clamp_key=None if clamp is None else tuple(sorted(clamp.items())),
            signature=signature,
            needs=one_container_needs(pod, names, exclusive) if single else None,
            shape=shape,
            most={
                r: max(c.count(r) for c in pod.all_containers)
                for r in {r for c in pod.all_containers for r in (*c.limits, *c.requests)}
            },
        )
        self._last_plan = (pod, plan)
        return plan

    def _startup(self, node: str, text: str) -> Verdict:
        self._say_once(node, "the kubelet's settings would not start; node refused", error=text)
        return Verdict(False, REASON_UNEXPECTED, f"topology manager: {text}")

    def filter(
        self, pod: Pod, nodes: Iterable[str], *, naive: bool = False
    ) -> tuple[list[str], dict[str, str]]:
        """Passing node names (in the order given) and failed ones with the kubelet's text."""
        passed: list[str] = []
        failed: dict[str, str] = {}
        remember: dict[str, Verdict] = {}
        for node in nodes:
            verdict = self.verdict(node, pod, naive=naive)
            if verdict is None or verdict.admit:
                passed.append(node)
                if verdict is not None:
                    remember[node] = verdict
            else:
                failed[node] = f"nvplugin: the kubelet would reject the pod: {verdict.text}"
        if pod.uid != CANDIDATE:
            self._passed[pod.uid] = remember
            if len(self._passed) > 10_000:
                del self._passed[next(iter(self._passed))]
        return passed, failed

    def score(self, node: str, pod: Pod, verdict: Verdict | None) -> float:
        """0..1: fewer NUMA nodes first (Volcano's ``100 - 100 * numa / max``), then the best
        group's score for the pod's GPU count against the node's best possible."""
        entry = self._nodes.get(node)
        if entry is None or verdict is None or not verdict.admit:
            return 0.0
        zones = max(1, len(entry.nrt.zones))
        used = len(verdict.numa_nodes)
        numa = 1.0 - used / zones if used else 1.0
        group = 0.0
        for resource, groups in entry.nrt.best_groups.items():
            want = self._plan(pod).most.get(resource, 0)
            top = max((g.score for g in groups), default=0)
            for g in groups:
                if g.size == want and want > 1 and top > 0:
                    group = max(group, g.score / top)
                elif g.size == want and want == 1:
                    group = max(group, 1.0)
        w = self.weights
        total = w.numa + w.group
        return (w.numa * numa + w.group * group) / total if total > 0 else 0.0

    def prioritize(self, pod: Pod, nodes: Iterable[str]) -> list[tuple[str, int]]:
        """(node, 0..10) for each node, in the order given."""
        shape = self._plan(pod).shape
        out = []
        for node in nodes:
            entry = self._nodes.get(node)
            kept = None if entry is None else entry.scores.get(shape)
            if kept is None:
                verdict = self.verdict(node, pod)
                kept = round(MAX_SCORE * self.score(node, pod, verdict))
                if entry is not None:
                    if len(entry.scores) >= 64:  # many pod shapes: start over rather than grow
                        entry.scores.clear()
                    entry.scores[shape] = kept
            out.append((node, kept))
        return out

    def explain(self, pod: Pod, nodes: Iterable[str]) -> list[Mapping[str, object]]:
        """``nvplugin place``: each node's verdict, reason and score."""
        rows: list[Mapping[str, object]] = []
        for node in nodes:
            verdict = self.verdict(node, pod)
            rows.append(
                {
                    "node": node,
                    "admit": None if verdict is None else verdict.admit,
                    "reason": None if verdict is None else verdict.reason,
                    "message": "no NodeResourceTopology" if verdict is None else verdict.message,
                    "numa_nodes": [] if verdict is None else list(verdict.numa_nodes),
                    "score": round(MAX_SCORE * self.score(node, pod, verdict)),
                }
            )
        return rows

    def names(self) -> list[str]:
        return sorted(self._nodes)
