"""``nvplugin admit`` end to end: a subprocess that starts the real plugin (another subprocess) and
drives it with the fake kubelet over real sockets; results checked against the kubelet's texts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nvplugin.nodesession import load_topology
from tests.support.serve import admit, admit_json, kubelet_with, new_dir, pods_file
from tests.support.waiting import WAIT_S

SAMPLES = Path(__file__).resolve().parents[2] / "nvplugin" / "fakekubelet" / "samples"
AFFINITY = ("TopologyAffinityError", "Resources cannot be allocated with Topology locality")


def gpu_pod(name: str, gpus: int | str, extra: str = "") -> str:
    return (
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n"
        f"    - name: main\n      resources:\n        limits: {{nvidia.com/gpu: {gpus}{extra}}}\n"
    )


def pods(*docs: str) -> str:
    return pods_file("---\n".join(docs))


def test_dgx_a100_samples_single_numa_node_with_static_cpus() -> None:
    results = admit_json(
        "--simulate",
        "dgx-a100",
        "--topology-manager-policy",
        "single-numa-node",
        "--cpu-manager-policy",
        "static",
        "--reserved-cpus",
        "0-1",
        str(SAMPLES / "dgx-a100.yaml"),
    )
    topo = load_topology("dgx-a100")
    by_name = {r["pod"]: r for r in results}
    assert [r["pod"] for r in results] == [
        "notebook",
        "trainer",
        "wide-trainer",
        "warm-start",
        "dashboard",
    ]
    [notebook] = by_name["notebook"]["containers"]
    assert by_name["notebook"]["admitted"], results
    assert by_name["notebook"]["reason"] is None
    assert notebook["gpu_indices"] == [2]
    assert notebook["devices"] == {"nvidia.com/gpu": [topo.gpus[2].uuid]}
    assert notebook["numa_nodes"] == [1]
    assert notebook["cpus"] == [16, 17, 144, 145]  # two whole cores on NUMA node 1
    [trainer] = by_name["trainer"]["containers"]
    assert trainer["gpu_indices"] == [0, 1] and trainer["numa_nodes"] == [3]
    assert set(trainer["cpus"]) <= set(topo.cpus.on_node(3)) and len(trainer["cpus"]) == 16
    wide = by_name["wide-trainer"]
    assert (wide["admitted"], wide["reason"], wide["message"]) == (False, *AFFINITY)
    assert wide["containers"] == [
        {
            "name": "train",
            "devices": {},
            "gpu_indices": [],
            "mig_devices": [],
            "mps": None,
            "cpus": [],
            "numa_nodes": None,
        }
    ]
    init, app = by_name["warm-start"]["containers"]
    assert init["name"] == "fetch-weights" and app["name"] == "serve"
    assert init["gpu_indices"] == app["gpu_indices"] == [3]  # the app reuses the init's GPU
    [dashboard] = by_name["dashboard"]["containers"]
    assert dashboard == {
        "name": "web",
        "devices": {},
        "gpu_indices": [],
        "mig_devices": [],
        "mps": None,
        "cpus": [],
        "numa_nodes": None,  # single-numa-node turns "any node" into don't care
    }


UNAVAILABLE = (
    "UnexpectedAdmissionError",
    "Allocate failed due to requested number of devices unavailable for "
    "nvidia.com/gpu. Requested: 2, Available: 1, which is unexpected",
)


@pytest.mark.parametrize(
    ("policy", "three", "two"),
    [
        # Three GPUs need both NUMA nodes, which is also the narrowest possible: preferred.
        ("best-effort", None, UNAVAILABLE),
        ("restricted", None, AFFINITY),
        ("single-numa-node", AFFINITY, None),
    ],
)
def test_too_few_free_gpus_per_policy(
    policy: str, three: tuple[str, str] | None, two: tuple[str, str] | None
) -> None:
    path = pods(gpu_pod("three", 3), gpu_pod("two", 2))
    results = admit_json(
        "--simulate", "workstation-4gpu", "--topology-manager-policy", policy, path
    )
    for result, expected in zip(results, (three, two), strict=True):
        if expected is None:
            assert result["admitted"], result
            assert result["containers"][0]["numa_nodes"] is not None
        else:
            assert (result["admitted"], result["reason"], result["message"]) == (
                False,
                *expected,
            )
    if three is None:
        assert results[0]["containers"][0]["numa_nodes"] == [0, 1]


def test_policy_none_stores_no_affinity_and_pod_scope_shares_one() -> None:
    path = pods(gpu_pod("a", 2), gpu_pod("b", 1))
    a, b = admit_json("--simulate", "workstation-4gpu", path)
    assert a["containers"][0]["numa_nodes"] is None and b["containers"][0]["numa_nodes"] is None
    assert a["admitted"] and b["admitted"], (a, b)
    # NVLink-aware: the plugin picks the bridged pair 0-3 (or 1-2), not the PIX pair 0-1.
    assert a["containers"][0]["gpu_indices"] in ([0, 3], [1, 2])

    two = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: duo}\nspec:\n  containers:\n"
        "    - name: x\n      resources: {limits: {nvidia.com/gpu: 1}}\n"
        "    - name: y\n      resources: {limits: {nvidia.com/gpu: 1}}\n"
    )
    [duo] = admit_json(
        "--simulate",
        "workstation-4gpu",
        "--topology-manager-policy",
        "restricted",
        "--topology-manager-scope",
        "pod",
        pods(two),
    )
    x, y = duo["containers"]
    assert x["numa_nodes"] == y["numa_nodes"] == [0]
    assert sorted(x["gpu_indices"] + y["gpu_indices"]) == [0, 1]


def test_table_output() -> None:
    done = admit(
        "--simulate",
        "dgx-1",
        "--topology-manager-policy",
        "single-numa-node",
        pods(gpu_pod("pair", 2), gpu_pod("six", 6)),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    print(done.stdout)
    assert lines[0].startswith("node dgx-1: 8 GPUs, 2 NUMA nodes")
    assert any(
        line.split()[:3] == ["pair", "main", "admitted"] and "(NUMA 0)" in line for line in lines
    )
    assert (
        "  -> TopologyAffinityError: Resources cannot be allocated with Topology locality" in lines
    )
    assert "1 of 2 pods admitted" in lines


BAD = [
    (
        "kind: Deployment\napiVersion: apps/v1\nmetadata: {name: d}\n",
        (),
        ["document 1", "kind", "not a Pod"],
    ),
    (
        "apiVersion: v1\nkind: Pod\nmetadata: {}\nspec: {containers: [{name: c}]}\n",
        (),
        ["document 1", "metadata.name", "missing"],
    ),
    (gpu_pod("neg", -1), (), ['pod "neg"', "limits[nvidia.com/gpu]", "greater than or equal to 0"]),
    (gpu_pod("half", '"1.5"'), (), ['pod "half"', "limits[nvidia.com/gpu]", "whole number"]),
    (
        gpu_pod("ok", 1),
        ("--topology-manager-policy", "strict"),
        ["topologyManagerPolicy", '"strict"'],
    ),
    (gpu_pod("ok", 1), ("--topology-manager-scope", "node"), ["topologyManagerScope", '"node"']),
    (
        gpu_pod("ok", 1),
        ("--topology-manager-policy", "best-effort", "--topology-manager-policy-options", "x=1"),
        ['unknown Topology Manager Policy option: "x"'],
    ),
    (
        gpu_pod("ok", 1),
        ("--simulate", "dgx-1", "--reserved-cpus", "0-1,200"),
        ["error: reserved-cpus: 0-1,200 is not a subset of online-cpus: 0-79\n"],
    ),
    (
        gpu_pod("ok", 1),
        ("--simulate", "dgx-1", "--cpu-manager-policy", "static"),
        ["unable to determine reserved CPU resources for static policy"],
    ),
    (gpu_pod("ok", 1), ("--simulate", "no-such-node"), ["no-such-node"]),
]


@pytest.mark.parametrize(("text", "flags", "needles"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_exits_2_naming_what(
    text: str, flags: tuple[str, ...], needles: list[str]
) -> None:
    done = admit(*flags, pods(text))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.startswith("error: ")
    assert "Traceback" not in done.stderr
    for needle in needles:
        assert needle in done.stderr


def test_policy_options_are_not_read_under_policy_none() -> None:
    # The kubelet's NewManager returns before it parses the options when the policy is none:
    # a bad option starts it. The report says they were not read.
    options = ("--topology-manager-policy-options", "fastest=true")
    done = admit("--simulate", "dgx-1", *options, pods(gpu_pod("ok", 1)))
    assert done.returncode == 0, done.stderr
    assert "1 of 1 pods admitted" in done.stdout
    assert "note: --topology-manager-policy-options (fastest) not read" in done.stdout


def test_plugin_dying_mid_run_rejects_later_pods_with_the_kubelet_message() -> None:
    path = pods(gpu_pod("first", 1), gpu_pod("second", 1), gpu_pod("third", 1))
    done = admit(
        "--simulate",
        "dgx-1",
        "--topology-manager-policy",
        "best-effort",
        "--output",
        "json",
        "--kill-plugin-after",
        "first",
        path,
    )
    assert done.returncode == 1, done.stderr
    first, second, third = json.loads(done.stdout)
    assert first["admitted"]
    message = (
        "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "
        "nvidia.com/gpu, which is unexpected"
    )
    for later in (second, third):
        assert (later["reason"], later["message"]) == ("UnexpectedAdmissionError", message)
    assert "the device plugin (nvplugin serve, pid" in done.stderr
    assert "was killed by signal 9 before pod 'second' was admitted" in done.stderr


SIDECAR_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: side}
spec:
  initContainers:
    - name: init1
      resources: {limits: {nvidia.com/gpu: 3, cpu: "2", memory: 1Gi}}
    - name: sidecar
      restartPolicy: Always
      resources: {limits: {nvidia.com/gpu: 1, cpu: "1", memory: 1Gi}}
    - name: init2
      resources: {limits: {nvidia.com/gpu: 2, cpu: "4", memory: 1Gi}}
  containers:
    - name: main
      resources: {limits: {nvidia.com/gpu: 2, cpu: "2", memory: 1Gi}}
"""


def test_sidecar_pod_scope_restricted_with_static_cpus() -> None:
    # Effective pod request: max(2 + 1, max(3, 1 + 2)) = 3 GPUs, which fit NUMA node 0 of a
    # DGX-1 (four GPUs per node). Init containers' devices and CPUs are reused by later
    # containers; the sidecar keeps its own, so the main container may not share them.
    path = pods(SIDECAR_POD, gpu_pod("pair", 2), gpu_pod("three", 3))
    side, pair, three = admit_json(
        "--simulate",
        "dgx-1",
        "--topology-manager-policy",
        "restricted",
        "--topology-manager-scope",
        "pod",
        "--cpu-manager-policy",
        "static",
        "--reserved-cpus",
        "0",
        path,
    )
    topo = load_topology("dgx-1")
    assert side["admitted"], side
    c = {x["name"]: x for x in side["containers"]}
    assert [x["name"] for x in side["containers"]] == ["init1", "sidecar", "init2", "main"]
    assert all(x["numa_nodes"] == [0] for x in c.values())
    gpus = {name: set(x["gpu_indices"]) for name, x in c.items()}
    assert len(gpus["init1"]) == 3 and all(topo.gpus[i].numa_node == 0 for i in gpus["init1"])
    assert len(gpus["sidecar"]) == 1 and gpus["sidecar"] < gpus["init1"]
    assert gpus["init2"] == gpus["main"] == gpus["init1"] - gpus["sidecar"]
    cpus = {name: set(x["cpus"]) for name, x in c.items()}
    assert [len(cpus[n]) for n in ("init1", "sidecar", "init2", "main")] == [2, 1, 4, 2]
    assert cpus["main"] <= cpus["init2"] and not cpus["sidecar"] & (cpus["init2"] | cpus["main"])
    assert 0 not in set().union(*cpus.values())  # reserved
    assert set().union(*cpus.values()) <= set(topo.cpus.on_node(0))
    # Three GPUs of NUMA node 0 are held: a pair fits node 1 ...
    assert pair["admitted"] and pair["containers"][0]["numa_nodes"] == [1]
    # ... and three more cannot come from one node any more.
    assert (three["admitted"], three["reason"], three["message"]) == (False, *AFFINITY)


MIXED_NUMA = """version: v1
name: one-gpu-without-numa
gpus: [{name: A, numa_node: 0}, {name: A, numa_node: 0}, {name: A, numa_node: 1}, {name: A}]
links: |2
        GPU0  GPU1  GPU2  GPU3
  GPU0  X     PIX   SYS   SYS
  GPU1  PIX   X     SYS   SYS
  GPU2  SYS   SYS   X     SYS
  GPU3  SYS   SYS   SYS   X
"""


@pytest.mark.parametrize("policy", ["single-numa-node", "restricted", "best-effort", "none"])
def test_a_gpu_without_numa_node_gets_a_warning_and_is_never_given(
    policy: str, tmp_path: Path
) -> None:
    """The kubelet never counts a GPU without a NUMA node in its hints: under single-numa-node
    and restricted, the fourth one-GPU pod (which would need it) is rejected."""
    node = tmp_path / "node.yaml"
    node.write_text(MIXED_NUMA)
    pod_file = tmp_path / "pods.yaml"
    pod_file.write_text("---\n".join(gpu_pod(f"p{i}", 1) for i in range(4)))
    done = admit(
        "--simulate",
        str(node),
        "--topology-manager-policy",
        policy,
        "--output",
        "json",
        str(pod_file),
    )
    assert done.returncode == 0, done.stderr
    admitted = [r["admitted"] for r in json.loads(done.stdout)]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    if policy == "none":
        assert warnings == [] and admitted == [True] * 4
        return
    assert len(warnings) == 1 and "GPU 3 has no NUMA node" in warnings[0]
    if policy in ("single-numa-node", "restricted"):
        assert admitted == [True, True, True, False]
        assert "never allocated" in warnings[0] and "TopologyAffinityError" in warnings[0]
    else:
        assert admitted == [True] * 4


INDEX_IDS = "\n    deviceIDStrategy: index"
STRATEGIES = {
    "index IDs, volume mounts": "deviceListStrategy: [volume-mounts]" + INDEX_IDS,
    "index IDs, CDI annotations": "deviceListStrategy: cdi-annotations" + INDEX_IDS,
    "UUIDs, CDI devices": "deviceListStrategy: [cdi-cri]",
}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_what_containers_see_is_read_whatever_the_plugins_strategies(
    strategy: str, tmp_path: Path
) -> None:
    """admit learns a container's GPUs and MIG devices from its Allocate responses: the same
    answer whichever NVIDIA form the plugin writes them in (time-sliced MIG devices here)."""
    config = tmp_path / "config.yaml"
    sharing = "sharing:\n  timeSlicing:\n    resources: [{name: mig-1g.5gb, replicas: 2}]\n"
    config.write_text(f"version: v1\nflags:\n  plugin:\n    {STRATEGIES[strategy]}\n{sharing}")
    flags = ("--simulate", "dgx-a100-mig", "--mig-strategy", "mixed")
    samples = str(SAMPLES / "dgx-a100-mig.yaml")
    default = tmp_path / "default.yaml"
    default.write_text(f"version: v1\n{sharing}")
    expected = admit_json(*flags, "--config", str(default), samples)
    assert admit_json(*flags, "--config", str(config), samples) == expected
    pair = next(r for r in expected if r["pod"] == "pair")["containers"][0]
    assert len(pair["mig_devices"]) == 2 and len(pair["gpu_indices"]) == 1


def test_a_config_the_plugin_refuses_exits_2_with_its_message(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nnvplugin: {helth: {}}\n")
    done = admit("--simulate", "dgx-1", "--config", str(config), pods(gpu_pod("ok", 1)))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr == (
        f'error: config file {config}: unknown key "nvplugin.helth"; '
        'did you mean "nvplugin.health"?\n'
    )


def test_the_plugin_serves_every_socket_before_it_registers_any(tmp_path: Path) -> None:
    """What ``nvplugin admit`` relies on to know that the plugin serves everything
    (nvplugin/admit/admission.py): by the first registration, every socket is there."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nresources:\n  gpus: [{pattern: '*A100*', name: a100}]\n"
        "sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, rename: t4}]\n"
    )
    args = ("--simulate", "mixed-a100-t4", "--config", str(config))

    async def body() -> None:
        async with kubelet_with(new_dir(), *args) as (kubelet, serve):
            for resource in ("nvidia.com/a100", "nvidia.com/t4"):
                await kubelet.wait_registered(resource, WAIT_S)
            # The kubelet sees a registration before the plugin has logged it (the Register call
            # returns after): wait for the line.
            await serve.wait_log("registered with kubelet")
            events = [line["event"] for line in serve.lines()]
            first = events.index("registered with kubelet")
            assert events[:first].count("serving") == 2, events

    asyncio.run(asyncio.wait_for(body(), 4 * WAIT_S))


# --- the kubelet's resource fit (docs/kubelet-behaviour.md#resource-fit) --------------------------


def test_resource_fit_refuses_what_the_node_cannot_hold_with_the_kubelets_reasons() -> None:
    """dgx-1: 80 CPUs, 512 GiB. After the container manager admits a pod (GPUs allocated), the
    resource fit refuses one asking for 1000 CPUs (OutOfcpu) or more memory than is left
    (OutOfmemory); a refused pod's GPU goes back, so the next pod gets all eight."""
    results = admit_json(
        "--simulate",
        "dgx-1",
        pods(
            gpu_pod("greedy", 1, ", cpu: '1000'"),
            gpu_pod("big", 2, ", cpu: '8', memory: 400Gi"),
            gpu_pod("hungry", 1, ", memory: 200Gi"),
            gpu_pod("rest", 6),
        ),
    )
    by_name = {r["pod"]: r for r in results}
    assert (by_name["greedy"]["reason"], by_name["greedy"]["message"]) == (
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 1000000, used: 0, capacity: 80000",
    )
    assert by_name["greedy"]["containers"][0]["devices"] == {}
    assert by_name["big"]["admitted"]
    gib = 1024**3
    allocatable = 512 * gib - 100 * 1024**2  # less the hard eviction threshold
    assert (by_name["hungry"]["reason"], by_name["hungry"]["message"]) == (
        "OutOfmemory",
        f"Node didn't have enough resource: memory, requested: {200 * gib}, used: {400 * gib}, "
        f"capacity: {allocatable}",
    )
    assert by_name["rest"]["admitted"]
    assert len(by_name["rest"]["containers"][0]["devices"]["nvidia.com/gpu"]) == 6


def test_max_pods_and_reservations_are_the_kubelets_flags() -> None:
    results = admit_json(
        "--simulate",
        "dgx-1",
        "--max-pods",
        "2",
        "--system-reserved",
        "cpu=2,memory=1Gi",
        "--kube-reserved",
        "cpu=500m",
        pods(
            gpu_pod("too-many-cpus", 1, ", cpu: 78"),
            gpu_pod("fits", 1, ", cpu: 77500m"),
            gpu_pod("small", 1),
            gpu_pod("third", 1),
        ),
    )
    reasons = {r["pod"]: (r["reason"], r["message"]) for r in results}
    assert reasons["too-many-cpus"] == (
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 78000, used: 0, capacity: 77500",
    )
    assert reasons["fits"] == (None, None) and reasons["small"] == (None, None)
    assert reasons["third"] == (
        "OutOfpods",
        "Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2",
    )


def test_static_cpus_reserved_by_flags_sub_milli_quantities_and_overhead() -> None:
    """What the real kubelet 1.32 does: the static policy reserves ceil(1500m) = 2 CPUs (0 and
    40) when only --system-reserved gives the CPU reservation; requests of 1999999999n are 2
    after the API server's rounding, so the pod is Guaranteed and gets 2 exclusive CPUs; the
    fit counts spec.overhead (77 + 1500m = 78500 against 80000 - 1500m, 2000 used)."""
    rounded = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: rounded}\nspec:\n  containers:\n"
        "    - name: main\n      resources:\n"
        "        requests: {cpu: 1999999999n, memory: 1Gi, nvidia.com/gpu: 1}\n"
        "        limits: {cpu: '2', memory: 1Gi, nvidia.com/gpu: 1}\n"
    )
    overhead = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: overhead}\nspec:\n"
        "  overhead: {cpu: 1500m}\n  containers:\n    - name: main\n"
        "      resources: {requests: {cpu: '77'}}\n"
    )
    results = admit_json(
        "--simulate",
        "dgx-1",
        "--cpu-manager-policy",
        "static",
        "--system-reserved",
        "cpu=1500m",
        pods(rounded, overhead),
    )
    by_name = {r["pod"]: r for r in results}
    assert by_name["rounded"]["admitted"]
    assert by_name["rounded"]["containers"][0]["cpus"] == [1, 41]  # 0 and 40 are reserved
    assert (by_name["overhead"]["reason"], by_name["overhead"]["message"]) == (
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 78500, used: 2000, capacity: 78500",
    )


def test_reservations_above_capacity_are_refused_as_the_kubelet_refuses_them() -> None:
    done = admit(
        "--simulate",
        "dgx-1",
        "--system-reserved",
        "memory=600Gi",
        "--kube-reserved",
        "cpu=100",
        pods(gpu_pod("p", 1)),
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        'error: invalid Node Allocatable configuration. Resource "cpu" has a reservation of '
        "{{100 0} {<nil>}  DecimalSI} but capacity of {{80000 -3} {<nil>}  DecimalSI}. "
        'Expected capacity >= reservation. Resource "memory" has a reservation of '
        "{{644349952000 0} {<nil>}  BinarySI} but capacity of {{549755813888 0} {<nil>}  "
        "BinarySI}. Expected capacity >= reservation.\n"
    )


@pytest.mark.parametrize(
    ("flag", "value", "error"),
    [
        ("--kube-reserved", "nvidia.com/gpu=1", 'cannot reserve "nvidia.com/gpu" resource'),
        ("--system-reserved", "cpu", "'cpu' is not <resource>=<quantity>"),
        ("--system-reserved", "memory=-1Gi", 'resource quantity for "memory" cannot be negative'),
        ("--max-pods", "-1", "--max-pods: -1 is negative"),
    ],
)
def test_bad_kubelet_flags_are_refused_before_anything_starts(
    flag: str, value: str, error: str
) -> None:
    done = admit("--simulate", "dgx-1", flag, value, pods(gpu_pod("p", 1)))
    assert done.returncode == 2
    assert error in done.stderr, done.stderr
