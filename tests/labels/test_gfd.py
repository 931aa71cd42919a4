"""GPU Feature Discovery's labels from what nvplugin serves, against fixtures that restate GFD's
rules (``fixtures/*.labels``: each says which rule gives which value), and GFD's rules one by one.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from nvplugin.config import ReplicatedResources, ResourceRules, Sharing
from nvplugin.errors import InputError
from nvplugin.labels import LabelError, NodeFacts, machine_type_path, node_labels
from nvplugin.labels.extra import gpus_per_numa_node, nvlink_clique
from nvplugin.labels.gfd import (
    architecture,
    gfd_labels,
    gpu_mode,
    labels_without_gpus,
    product,
    version_labels,
)
from nvplugin.node.gpumodels import PCI_CLASS_3D, PCI_CLASS_VGA
from nvplugin.node.model import Driver, Link, Pcie
from nvplugin.nodefile.builtin import builtin_names
from nvplugin.nodefile.reader import load_node
from nvplugin.rm.plan import plan_resources
from tests.support.labelcases import (
    ALL_1G_5GB,
    MPS,
    MPS_RENAMED,
    RENAMED,
    SCENARIOS,
    TIME_SLICED,
    Scenario,
    compute,
    read_fixture,
)
from tests.support.topologies import from_links

# What NVIDIA's own end-to-end test expects of a GFD-labelled node, restated: each key present
# with a value of this shape (plus MIG keys when a strategy serves MIG devices).
GFD_SHAPES = {
    "nvidia.com/cuda.driver.major": r"[0-9]+",
    "nvidia.com/cuda.driver.minor": r"[0-9]+",
    "nvidia.com/cuda.driver.rev": r"[0-9]*",
    "nvidia.com/cuda.runtime.major": r"[0-9]+",
    "nvidia.com/cuda.runtime.minor": r"[0-9]+",
    "nvidia.com/cuda.driver-version.full": r"[0-9]+\.[0-9]+(\.[0-9]+)?",
    "nvidia.com/cuda.runtime-version.full": r"[0-9]+\.[0-9]+",
    "nvidia.com/gpu.machine": r".+",
    "nvidia.com/gpu.count": r"[0-9]+",
    "nvidia.com/gpu.replicas": r"[0-9]+",
    "nvidia.com/gpu.sharing-strategy": r"none|mps|time-slicing",
    "nvidia.com/gpu.product": r"[A-Za-z0-9_.-]+",
    "nvidia.com/gpu.memory": r"[0-9]+",
    "nvidia.com/gpu.family": r"[a-z-]+",
    "nvidia.com/mig.capable": r"true|false",
    "nvidia.com/gpu.compute.major": r"[0-9]+",
    "nvidia.com/gpu.compute.minor": r"[0-9]+",
    "nvidia.com/mps.capable": r"true|false",
    "nvidia.com/gpu.mode": r"compute|graphics|unknown",
    # GFD writes false on a node without vGPU devices (bare metal, passthrough): a selector
    # on vgpu.present=false must keep matching after the swap.
    "nvidia.com/vgpu.present": r"false",
}
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_labels_match_the_fixture(name: str) -> None:
    assert compute(SCENARIOS[name]) == read_fixture(name)


@pytest.mark.parametrize("name", builtin_names())
@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
def test_every_builtin_node_has_gfds_label_set(name: str, strategy: str) -> None:
    """Every built-in node under every strategy that can serve it: GFD's keys with values of
    GFD's shapes, every key and value a valid Kubernetes label, and the timestamp when asked."""
    try:
        labels = compute(Scenario(name, mig_strategy=strategy), timestamp=1_700_000_000)
    except InputError as exc:  # single refuses a node that is not cut alike
        assert strategy == "single" and "migStrategy single" in str(exc)
        return
    for key, shape in GFD_SHAPES.items():
        assert re.fullmatch(shape, labels[key]), (key, labels[key])
    assert labels["nvidia.com/gfd.timestamp"] == "1700000000"
    assert ("nvidia.com/mig.strategy" in labels) == (strategy != "none")
    for key, value in labels.items():
        assert LABEL_KEY.match(key) and len(key.split("/")[-1]) <= 63, key
        assert LABEL_VALUE.match(value) and len(value) <= 63, (key, value)
    spec = load_node(name)
    assert (
        labels["nvidia.com/gpu.count"]
        == str(sum(1 for gpu in spec.gpus if gpu.name == spec.gpus[0].name))
        or strategy == "single"
    )


SHARINGS = {
    "time-slicing": (TIME_SLICED, "time-slicing", False),
    "time-slicing renamed": (RENAMED, "time-slicing", True),
    "mps": (MPS, "mps", False),
    "mps renamed": (MPS_RENAMED, "mps", True),
}


@pytest.mark.parametrize("name", builtin_names())
@pytest.mark.parametrize("sharing", sorted(SHARINGS))
@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
def test_every_builtin_node_shared_as_gfd_labels_sharing(
    name: str, sharing: str, strategy: str
) -> None:
    """GFD's sharing rules on every built-in node, nvidia.com/gpu replicated 4 ways by time-slicing
    or MPS, renamed or not, under every MIG strategy that can serve it: the resource the gpu.*
    labels describe has replicas 4 and the block's strategy, its product ends -SHARED exactly when
    it is not renamed, and mps.capable is true exactly when MPS shares something. GPUs with MIG on
    are not shared (replicas 0 when every GPU of the model has MIG on); MIG profiles under mixed
    are not shared (the config names nvidia.com/gpu only)."""
    config, kind, renamed = SHARINGS[sharing]
    try:
        labels = compute(Scenario(name, config, strategy))
    except InputError as exc:  # single refuses a node that is not cut alike
        assert strategy == "single" and "migStrategy single" in str(exc)
        return
    spec = load_node(name)
    model = [gpu for gpu in spec.gpus if gpu.name == spec.gpus[0].name]
    # Shared: GPUs of the model with MIG off, or under single the MIG devices served as the GPU.
    whole = strategy == "single" or any(gpu.mig is None for gpu in model)
    replicas = labels["nvidia.com/gpu.replicas"]
    if not whole:
        assert replicas == "0" and labels["nvidia.com/gpu.sharing-strategy"] == "none"
    else:
        assert replicas == "4", labels
        assert labels["nvidia.com/gpu.sharing-strategy"] == kind
        assert labels["nvidia.com/gpu.product"].endswith("-SHARED") != renamed
    assert labels["nvidia.com/mps.capable"] == str(kind == "mps" and replicas == "4").lower()
    for key, value in labels.items():
        if key.startswith("nvidia.com/mig-") and key.endswith(".sharing-strategy"):
            assert value == "none" and not labels[
                key.replace("sharing-strategy", "product")
            ].endswith("-SHARED")


def test_single_on_a_node_not_cut_alike_is_refused_not_labelled_invalid() -> None:
    """GFD labels such a node <model>-MIG-INVALID with count 0; nvplugin does not serve it at
    all (the plan refuses it, naming migStrategy single), so there is nothing to label."""
    with pytest.raises(InputError, match="migStrategy single"):
        compute(Scenario("dgx-a100-mig", mig_strategy="single"))


@pytest.mark.parametrize(
    ("compute_capability", "family"),
    [
        ((1, 3), "tesla"),
        ((2, 1), "fermi"),
        ((3, 7), "kepler"),
        ((5, 2), "maxwell"),
        ((6, 0), "pascal"),
        ((7, 0), "volta"),
        ((7, 2), "volta"),
        ((7, 5), "turing"),
        ((8, 0), "ampere"),
        ((8, 6), "ampere"),
        ((8, 7), "ampere"),
        ((8, 9), "ada-lovelace"),
        ((9, 0), "hopper"),
        ((10, 0), "blackwell"),
        ((12, 0), "blackwell"),
        ((4, 0), "undefined"),
        ((11, 0), "undefined"),
    ],
)
def test_architecture_family(compute_capability: tuple[int, int], family: str) -> None:
    assert architecture(*compute_capability) == family


@pytest.mark.parametrize(
    ("parts", "shared", "expected"),
    [
        (["NVIDIA A100-SXM4-40GB"], False, "NVIDIA-A100-SXM4-40GB"),
        (["Tesla V100-SXM2-16GB"], True, "Tesla-V100-SXM2-16GB-SHARED"),
        (["NVIDIA  GeForce RTX 3090 (TM)"], False, "NVIDIA-GeForce-RTX-3090-TM"),
        (["NVIDIA A100-SXM4-40GB", "MIG", "1g.5gb"], False, "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
        (
            ["NVIDIA H100 80GB HBM3", "MIG", "1g.10gb.me"],
            True,
            "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me-SHARED",
        ),
        (["", "MIG", "3g.20gb"], False, "MIG-3g.20gb"),
        (["Quadro RTX 8000 ™", ""], False, "Quadro-RTX-8000"),
        (["NVIDIA TITAN X (Pascal)"], False, "NVIDIA-TITAN-X-Pascal"),
    ],
)
def test_product_is_sanitised_and_marked_shared(
    parts: list[str], shared: bool, expected: str
) -> None:
    assert product(parts, shared) == expected


@pytest.mark.parametrize(
    ("dmi", "label"),
    [
        ("Google Compute Engine", "Google-Compute-Engine"),
        ("VMware20,1", "VMware201"),
        ("g6.12xlarge", "g6.12xlarge"),
        ("X9SRA/X9SRA-3", "X9SRAX9SRA-3"),
        (None, "unknown"),
    ],
)
def test_machine_label_is_sanitised_as_gfd_does(dmi: str | None, label: str) -> None:
    """Machine types seen on real nodes (DMI product names) and the labels GFD gave them."""
    assert labels_without_gpus(dmi, None) == {"nvidia.com/gpu.machine": label}


def test_driver_versions_with_and_without_revision() -> None:
    full = version_labels(Driver("535.183.01", (12, 2)))
    assert (
        full["nvidia.com/cuda.driver.rev"]
        == full["nvidia.com/cuda.driver-version.revision"]
        == "01"
    )
    assert full["nvidia.com/cuda.runtime-version.full"] == "12.2"
    short = version_labels(Driver("550.120", (12, 4)))
    assert (
        short["nvidia.com/cuda.driver.rev"]
        == short["nvidia.com/cuda.driver-version.revision"]
        == ""
    )
    assert short["nvidia.com/cuda.driver-version.full"] == "550.120"
    for bad in ("550", "550.1.2.3", "r550.54", ""):
        with pytest.raises(LabelError, match=r"not X\.Y"):
            version_labels(Driver(bad, (12, 4)))


def _facts(gpus: int = 2, **gpu_fields: object) -> NodeFacts:
    topology = from_links("t", _nvlinked(gpus, []))
    changed = tuple(dataclasses.replace(gpu, **gpu_fields) for gpu in topology.gpus)  # type: ignore[arg-type]
    return NodeFacts(dataclasses.replace(topology, gpus=changed), Driver("550.54.15", (12, 4)))


def _plan(facts: NodeFacts, replicas: int = 1):  # type: ignore[no-untyped-def]
    from nvplugin.config.layout import ReplicatedResource, resolve_layout

    entries = (ReplicatedResource("nvidia.com/gpu", replicas),) if replicas > 1 else ()
    rules, slicing = resolve_layout(
        "nvidia.com/gpu",
        ResourceRules(),
        Sharing(time_slicing=ReplicatedResources(resources=entries)),
        "none",
    )
    return plan_resources(facts.topology.gpus, "nvidia.com/gpu", rules, slicing)


def test_without_gpus_only_timestamp_and_machine() -> None:
    facts = dataclasses.replace(_facts(), machine="HPE ProLiant XL675d Gen10 Plus")
    assert gfd_labels(facts, None, 1234) == {
        "nvidia.com/gfd.timestamp": "1234",
        "nvidia.com/gpu.machine": "HPE-ProLiant-XL675d-Gen10-Plus",
    }
    assert node_labels(facts, None, None) == {
        "nvidia.com/gpu.machine": "HPE-ProLiant-XL675d-Gen10-Plus"
    }


def test_unknown_compute_capability_leaves_out_the_architecture() -> None:
    facts = _facts(compute_capability=None)
    labels = gfd_labels(facts, _plan(facts), None)
    assert not {"nvidia.com/gpu.family", "nvidia.com/gpu.compute.major"} & set(labels)
    assert labels["nvidia.com/gpu.product"] == "Test-GPU"


def test_gpu_mode_from_the_pci_classes() -> None:
    gpus = _facts().topology.gpus
    three_d = [dataclasses.replace(g, pci_class=PCI_CLASS_3D) for g in gpus]
    vga = [dataclasses.replace(g, pci_class=PCI_CLASS_VGA) for g in gpus]
    assert gpu_mode(three_d) == "compute"
    assert gpu_mode(vga) == "graphics"
    assert gpu_mode([three_d[0], vga[1]]) == "unknown"
    assert gpu_mode([dataclasses.replace(gpus[0], pci_class=None)]) == "unknown"
    assert gpu_mode([dataclasses.replace(gpus[0], pci_class=0x038000)]) == "unknown"


def test_machine_type_under_a_simulated_sysfs() -> None:
    assert (
        machine_type_path("/sys/class/dmi/id/product_name", "/sys")
        == "/sys/class/dmi/id/product_name"
    )
    assert (
        machine_type_path("/sys/class/dmi/id/product_name", "/dev/shm/t")
        == "/dev/shm/t/class/dmi/id/product_name"
    )
    assert machine_type_path("/etc/machine-type", "/dev/shm/t") == "/etc/machine-type"
    assert machine_type_path("/sysfoo/x", "/dev/shm/t") == "/sysfoo/x"


def _nvlinked(count: int, pairs: list[tuple[int, int]]) -> list[list[Link | None]]:
    links: list[list[Link | None]] = [
        [None if i == j else Link(Pcie.SYS) for j in range(count)] for i in range(count)
    ]
    for a, b in pairs:
        links[a][b] = links[b][a] = Link(Pcie.SYS, 2)
    return links


@pytest.mark.parametrize(
    ("count", "pairs", "clique"),
    [
        (4, [], 1),
        (4, [(0, 1)], 2),
        (4, [(0, 1), (1, 2), (2, 3), (3, 0)], 2),  # a ring: no triangle
        (5, [(0, 1), (0, 2), (1, 2), (2, 3), (3, 4), (2, 4)], 3),
        (6, [(a, b) for a in range(6) for b in range(a + 1, 6) if (a, b) != (0, 5)], 5),
    ],
)
def test_nvlink_clique(count: int, pairs: list[tuple[int, int]], clique: int) -> None:
    topology = from_links("t", _nvlinked(count, pairs))
    assert nvlink_clique(topology, list(range(count))) == clique
    assert nvlink_clique(topology, []) == 0


def test_gpus_per_numa_node() -> None:
    gpus = _facts(4).topology.gpus
    placed = [
        dataclasses.replace(g, numa_node=n) for g, n in zip(gpus, [0, 0, 1, None], strict=True)
    ]
    assert gpus_per_numa_node(placed) == 3  # two on node 0, and the one without a node
    assert gpus_per_numa_node([dataclasses.replace(g, numa_node=None) for g in gpus]) == 4


def test_mps_under_none_labels_only_the_gpus_it_shares() -> None:
    """migStrategy none with MPS on a node with some GPUs with MIG on: MPS is served on the GPUs
    with MIG off only, and the labels say so (mps.capable=true; the model's count is every GPU of
    it, as under none without MPS); when every GPU has MIG on nothing is MPS-shared:
    mps.capable=false (it was true, for GPUs no MPS daemon could serve)."""
    some = compute(Scenario("dgx-a100-mig", MPS))
    assert some["nvidia.com/mps.capable"] == "true"
    assert some["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert some["nvidia.com/gpu.count"] == "8"
    every = compute(Scenario(ALL_1G_5GB, MPS))
    assert every["nvidia.com/mps.capable"] == "false"
    assert every["nvidia.com/gpu.replicas"] == "0"  # MIG on everywhere: nothing shared
