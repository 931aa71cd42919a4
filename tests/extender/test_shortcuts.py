"""The extender's answers found without a whole admission (judge.one_node_verdict, and the
parts of nvplugin/extender/parts.py) equal a fresh admission's: random nodes (1 to 9 NUMA nodes,
some devices unhealthy, some zones without the resource, every policy) and pods of one container
or several, each judged by the extender and by a fresh admission (``naive``)."""

from __future__ import annotations

import io
import random

import structlog

from nvplugin.extender.nrt import parse_nrt
from nvplugin.extender.view import MAX_SCORE, View
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.log import configure
from tests.support.nrtgen import nrt_object

GPU = "nvidia.com/gpu"
NIC = "example.com/nic"


def random_node(
    rng: random.Random,
    name: str,
    policies: tuple[str, ...] = ("single-numa-node", "single-numa-node", "restricted"),
) -> dict[str, object]:
    zones: dict[int, dict[str, tuple[int, int, int]]] = {}
    for node in range(rng.choice((1, 2, 4, 8, 8, 9))):
        zone: dict[str, tuple[int, int, int]] = {}
        for resource, most in ((GPU, 4), (NIC, 2), ("cpu", 12)):
            if rng.random() < 0.1:
                continue
            capacity = rng.randint(0, most)
            healthy = capacity - (rng.random() < 0.2 and capacity > 0)
            zone[resource] = (capacity, healthy, rng.randint(0, healthy))
        zones[node] = zone
    return nrt_object(
        name,
        zones,
        policy=rng.choice(policies),
        scope=rng.choice(("container", "pod")),
        cpu_policy=rng.choice(("none", "static", "static")),
    )


EVERY_POLICY = ("none", "best-effort", "restricted", "single-numa-node")


def view_of(rng: random.Random, nodes: int, policies: tuple[str, ...]) -> View:
    view = View()
    for i in range(nodes):
        view.set_nrt(parse_nrt(random_node(rng, f"node-{i}", policies)))
    return view


def random_pod(rng: random.Random, i: int) -> Pod:
    def container(name: str, **kw: object) -> Container:
        limits: dict[str, str | int] = {GPU: rng.randint(1, 4)}
        if rng.random() < 0.4:
            limits[NIC] = rng.randint(1, 2)
        if rng.random() < 0.7:  # Guaranteed: exclusive CPUs when whole
            limits.update({"cpu": rng.choice(("2", "6", "10", "1500m")), "memory": "1Gi"})
            return Container.of(name, limits=limits, **kw)  # type: ignore[arg-type]
        return Container.of(name, {"cpu": "1"}, limits, **kw)  # type: ignore[arg-type]

    containers = [container("main")]
    inits = []
    if rng.random() < 0.2:
        containers.append(container("second"))
    if rng.random() < 0.1:
        inits.append(container("init", init=True))
    return Pod.of(f"pod-{i}", containers, inits)


def assert_like_fresh_admissions(view: View, pod: Pod) -> None:
    for node in view.names():
        ours = view.verdict(node, pod)
        full = view.verdict(node, pod, naive=True)
        assert ours is not None and full is not None
        assert ours == full, f"{pod} on {node}"


def test_answers_without_admission_equal_the_admissions() -> None:
    rng = random.Random(3606)
    view = view_of(rng, 150, ("single-numa-node", "single-numa-node", "restricted"))
    for i in range(20):
        assert_like_fresh_admissions(view, random_pod(rng, i))
    assert view.cache.short_cut > 100  # answers found without an admission, both ways


def test_answers_under_every_policy_equal_the_admissions() -> None:
    """Every policy: under ``none`` and ``best-effort`` where a pod's exclusive CPUs go
    depends on every NUMA node's free count, above the request too. One-container pods there
    are put together from parts (nvplugin/extender/parts.py), shared by nodes that differ in
    other resources."""
    rng = random.Random(3607)
    view = view_of(rng, 300, EVERY_POLICY)
    for i in range(24):
        assert_like_fresh_admissions(view, random_pod(rng, i))
    assert view.cache.composed > 1000
    assert view.cache.admitted > 0  # pods of several containers still take the whole way


def test_judging_logs_nothing_at_info_level() -> None:
    """The device managers a judgement builds (thousands a request) do not log their plugins'
    registrations and allocations, as the fake kubelet's own device manager does."""
    out = io.StringIO()
    before = structlog.get_config()
    configure("json", "info", stream=out)
    try:
        rng = random.Random(3608)
        view = view_of(rng, 40, EVERY_POLICY)
        for i in range(4):
            pod = random_pod(rng, i)
            view.filter(pod, view.names())
            view.filter(pod, view.names(), naive=True)
        assert view.cache.composed and view.cache.admitted
    finally:
        structlog.configure(**before)
    lines = out.getvalue().splitlines()
    assert not [line for line in lines if "device plugin" in line or "devices allocated" in line]


def test_kept_scores_follow_reservations() -> None:
    """Prioritize keeps each node's score per pod shape; a reservation on the node drops it,
    so the next answer is worked out afresh."""
    rng = random.Random(3609)
    view = view_of(rng, 60, EVERY_POLICY)
    pod = Pod.of("gpus", [Container.of("main", limits={GPU: 2, "cpu": "6", "memory": "1Gi"})])
    changed = 0
    for i in range(30):
        names = view.names()
        scores = dict(view.prioritize(pod, names))  # rejected nodes too: they score 0
        for node in names:
            fresh = round(MAX_SCORE * view.score(node, pod, view.verdict(node, pod, naive=True)))
            assert scores[node] == fresh, node
        # Bind another pod of the same shape to a node where it takes something: that node's
        # free state shrinks.
        other = Pod(f"other-{i}", f"uid-other-{i}", pod.containers)
        passed, _ = view.filter(other, names)
        view.prioritize(other, passed)
        taking = [n for n in passed if view.verdict(n, other).numa_nodes]  # type: ignore[union-attr]
        changed += view.bound(other.uid, rng.choice(taking))
    assert changed > 10
