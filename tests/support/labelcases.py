"""The nodes and configs the label fixtures (``fixtures/<name>.labels``) describe, and the one way
the tests compute labels for them: the simulated node discovered through the real NVML calls, the
config loaded by the real loader, the plan, then :func:`nvplugin.labels.node_labels`."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from nvplugin.config import load_config
from nvplugin.labels import node_facts, node_labels
from nvplugin.nodesession import open_node
from nvplugin.rm.plan import plan_for

FIXTURES = Path(__file__).resolve().parents[1] / "labels" / "fixtures"

TIME_SLICED = """
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""
RENAMED_BY_DEFAULT = """
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""
RENAMED = """
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        rename: nvidia.com/gpu-shared
        replicas: 4
"""
MPS = """
sharing:
  mps:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""
MPS_RENAMED = """
sharing:
  mps:
    resources:
      - name: nvidia.com/gpu
        rename: nvidia.com/gpu-mps
        replicas: 4
"""
MIG_TIME_SLICED = """
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/mig-1g.5gb
        replicas: 4
"""
EXCLUDED = """
resources:
  exclude:
    models: ["Tesla T4"]
"""

ALL_1G_5GB = """\
version: v1
name: a100-all-1g
gpus:
  - name: NVIDIA A100-SXM4-40GB
    mig: [1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb]
  - name: NVIDIA A100-SXM4-40GB
    mig: [1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb]
links: |2
        GPU0   GPU1
  GPU0  X      NV12
  GPU1  NV12   X
"""
"""Every GPU cut into seven 1g.5gb: what migStrategy single serves."""

OLD_DRIVER = """\
version: v1
name: old-driver
machine: "Precision 7920 Tower"
driver: {version: "470.82", cuda: "11.4"}
gpus:
  - {name: NVIDIA RTX A6000, memory_mib: 49140}
  - {name: NVIDIA RTX A6000, memory_mib: 49140, pci_class: "0x030200"}
links: |2
        GPU0  GPU1
  GPU0  X     NV4
  GPU1  NV4   X
"""
"""A driver without a revision, a machine name with blanks, a board switched to compute mode
beside one in graphics mode."""

A30_VM = """\
version: v1
name: a30-vm
machine: "VMware7,1"
driver: {version: "535.183.01", cuda: "12.2"}
gpus:
  - {name: NVIDIA A30, memory_mib: 24576, numa_node: 0}
links: |2
        GPU0
  GPU0  X
"""
"""A shape this work was not built on: a public report of a GPU Operator node (GFD v0.17.0), an
A30 in a VMware guest with MIG off under migStrategy single, restated as a node file; its GFD
labels are the fixture (the operator's own labels -- gpu.deploy.*, gpu.present, mig.config* --
left out; vgpu.present=false is what GFD writes on a node without vGPU devices)."""


@dataclass(frozen=True)
class Scenario:
    node: str  # a built-in name, or node-file text
    config: str | None = None
    mig_strategy: str | None = None


SCENARIOS: dict[str, Scenario] = {
    "dgx-a100": Scenario("dgx-a100"),
    "dgx-a100.time-sliced": Scenario("dgx-a100", TIME_SLICED),
    "dgx-a100.renamed-by-default": Scenario("dgx-a100", RENAMED_BY_DEFAULT),
    "dgx-a100.renamed": Scenario("dgx-a100", RENAMED),
    "dgx-a100.mps": Scenario("dgx-a100", MPS),
    "dgx-a100.mps.renamed": Scenario("dgx-a100", MPS_RENAMED),
    "dgx-a100-mig.none": Scenario("dgx-a100-mig"),
    "dgx-a100-mig.mixed.mps": Scenario("dgx-a100-mig", MPS, "mixed"),
    "dgx-a100-mig.mixed": Scenario("dgx-a100-mig", mig_strategy="mixed"),
    "dgx-a100-mig.mixed.time-sliced": Scenario("dgx-a100-mig", MIG_TIME_SLICED, "mixed"),
    "all-1g.single": Scenario(ALL_1G_5GB, mig_strategy="single"),
    "all-1g.single.time-sliced": Scenario(ALL_1G_5GB, TIME_SLICED, "single"),
    "all-1g.mixed.time-sliced": Scenario(ALL_1G_5GB, TIME_SLICED, "mixed"),
    "dgx-1": Scenario("dgx-1"),
    "dgx-2": Scenario("dgx-2"),
    "dgx-h100": Scenario("dgx-h100"),
    "pcie-8gpu": Scenario("pcie-8gpu"),
    "no-numa": Scenario("no-numa"),
    "workstation-4gpu": Scenario("workstation-4gpu"),
    "mixed-a100-t4": Scenario("mixed-a100-t4"),
    "mixed-a100-t4.excluded": Scenario("mixed-a100-t4", EXCLUDED),
    "old-driver": Scenario(OLD_DRIVER),
    "a30-vm.single": Scenario(A30_VM, mig_strategy="single"),
}


def compute(scenario: Scenario, timestamp: int | None = None) -> dict[str, str]:
    """The labels of ``scenario`` (no timestamp unless given)."""
    directory = Path(tempfile.mkdtemp())
    node = scenario.node
    if "\n" in node:
        (directory / "node.yaml").write_text(node)
        node = str(directory / "node.yaml")
    config_path = None
    if scenario.config is not None:
        (directory / "config.yaml").write_text(scenario.config)
        config_path = str(directory / "config.yaml")
    config = load_config(config_path, flags={"flags.migStrategy": scenario.mig_strategy})
    with open_node(node) as session:
        facts = node_facts(
            session.topology, session.scan.driver, config.gfd.machine_type_file, session.sysfs_root
        )
    return node_labels(facts, plan_for(config, facts.topology.gpus), timestamp)


def read_fixture(name: str) -> dict[str, str]:
    """``fixtures/<name>.labels``: ``key=value`` lines; ``#`` lines say which rule gives what."""
    labels = {}
    for line in (FIXTURES / f"{name}.labels").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            labels[key] = value
    return labels
