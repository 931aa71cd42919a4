"""What GPU Feature Discovery reads of a node, simulated: the driver and CUDA versions, each GPU's
compute capability, MIG support and PCI class, the MIG devices' multiprocessors and engines, and
the DMI product name -- from the node file through the real pynvml calls and the generated sysfs,
back out through ``nvplugin node capture``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from nvplugin.errors import InputError
from nvplugin.node.gpumodels import PCI_CLASS_3D, PCI_CLASS_VGA, gpu_model
from nvplugin.node.mig import MIG_MODELS
from nvplugin.node.model import Driver, MigUnits
from nvplugin.node.sysfs import DMI_PRODUCT_NAME, read_machine_type, read_pci_class
from nvplugin.nodefile.reader import load_node, parse_node
from nvplugin.nodefile.spec import DEFAULT_DRIVER
from nvplugin.nodesession import capture_node, open_node

NODE = """\
version: v1
name: facts
machine: "ProLiant DL380 Gen10"
driver: {version: "535.183.01", cuda: "12.2"}
gpus:
  - {name: NVIDIA A100-SXM4-40GB, mig: [3g.20gb, 1g.5gb+me]}
  - {name: Tesla T4, compute_capability: "7.5", pci_class: "0x030000"}
  - {name: Experimental GPU, compute_capability: 9.1}
  - {name: NVIDIA H100 80GB HBM3, compute_capability: null}
links: |2
        GPU0  GPU1  GPU2  GPU3
  GPU0  X     SYS   SYS   SYS
  GPU1  SYS   X     SYS   SYS
  GPU2  SYS   SYS   X     SYS
  GPU3  SYS   SYS   SYS   X
"""


def _write(text: str) -> str:
    path = Path(tempfile.mkdtemp()) / "node.yaml"
    path.write_text(text)
    return str(path)


def test_the_node_file_says_what_gfd_reads() -> None:
    spec = parse_node(NODE, "test")
    assert spec.driver == Driver("535.183.01", (12, 2))
    assert spec.machine == "ProLiant DL380 Gen10"
    assert [g.compute_capability for g in spec.gpus] == [(8, 0), (7, 5), (9, 1), None]
    three_d, vga = PCI_CLASS_3D, PCI_CLASS_VGA
    assert [g.pci_class for g in spec.gpus] == [three_d, vga, three_d, three_d]
    assert [g.mig_capable for g in spec.gpus] == [True, False, False, True]


def test_defaults_come_from_the_model_table() -> None:
    spec = load_node("workstation-4gpu")
    assert spec.driver == DEFAULT_DRIVER and spec.machine is None
    assert {(g.compute_capability, g.pci_class) for g in spec.gpus} == {((7, 5), PCI_CLASS_VGA)}
    assert gpu_model("Some Unknown Board") is None
    unknown = parse_node(NODE.replace("Experimental GPU, compute_capability: 9.1", "X"), "t")
    assert unknown.gpus[2].compute_capability is None


def test_discovery_reads_them_through_nvml_and_sysfs() -> None:
    with open_node(_write(NODE)) as node:
        driver, gpus = node.scan.driver, node.topology.gpus
        machine = read_machine_type(os.path.join(node.sysfs_root, DMI_PRODUCT_NAME))
        assert read_pci_class(node.sysfs_root, gpus[1].pci_bus_id) == PCI_CLASS_VGA
    assert driver == Driver("535.183.01", (12, 2))
    assert machine == "ProLiant DL380 Gen10"
    assert [g.compute_capability for g in gpus] == [(8, 0), (7, 5), (9, 1), None]
    assert [g.mig_capable for g in gpus] == [True, False, False, True]
    assert [g.pci_class for g in gpus] == [PCI_CLASS_3D, PCI_CLASS_VGA, PCI_CLASS_3D, PCI_CLASS_3D]
    three, media = gpus[0].mig_devices
    assert three.units == MigUnits(42, 3, 2, 0, 0, 0)
    assert media.units == MigUnits(14, 1, 1, 0, 1, 1)
    assert (three.slices, three.compute_slices, media.slices, media.compute_slices) == (3, 3, 1, 1)


def test_discovery_matches_every_builtin_node_file() -> None:
    for name in ("dgx-a100-mig", "workstation-4gpu", "dgx-h100"):
        with open_node(name) as node:
            assert node.topology == load_node(name).topology()
            assert node.scan.driver == load_node(name).driver


def test_capture_writes_them_back() -> None:
    text = capture_node(_write(NODE))
    assert "machine: ProLiant DL380 Gen10" in text
    assert 'driver: {version: 535.183.01, cuda: "12.2"}' in text
    again = parse_node(text, "captured")
    original = parse_node(NODE, "test")
    assert again.driver == original.driver and again.machine == original.machine
    assert again.gpus == original.gpus
    gpu_lines = [line for line in text.splitlines() if line.startswith("  - {name:")]
    assert ["compute_capability" in line for line in gpu_lines] == [False, False, True, True]
    assert ["pci_class" in line for line in gpu_lines] == [False, True, False, False]


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        (('"535.183.01"', '"535"'), ["driver.version", "X.Y or X.Y.Z"]),
        (('"535.183.01"', "535.1"), ["driver.version", "non-empty string"]),
        (('cuda: "12.2"', 'cuda: "twelve"'), ["driver.cuda", "12.4"]),
        (("driver: {", "driver: {branch: r535, "), ["driver.branch", "unknown key"]),
        (('"0x030000"', '"VGA"'), ["gpus[1].pci_class", "0x030200"]),
        (('"0x030000"', "196608"), ["gpus[1].pci_class", "0x030200"]),
        (('compute_capability: "7.5"', "compute_capability: [7, 5]"), ["gpus[1]", "8.0"]),
        (('"ProLiant DL380 Gen10"', '"two\\nlines"'), ["machine", "one printable line"]),
        (('"ProLiant DL380 Gen10"', '""'), ["machine", "non-empty"]),
    ],
)
def test_bad_values_are_named(change: tuple[str, str], fragments: list[str]) -> None:
    old, new = change
    with pytest.raises(InputError) as failure:
        parse_node(NODE.replace(old, new, 1), "node file n.yaml")
    for fragment in fragments:
        assert fragment in str(failure.value)


def test_every_mig_profile_has_its_multiprocessors_and_engines() -> None:
    for model in MIG_MODELS:
        for profile in model.profiles:
            units = profile.units
            assert units.multiprocessors >= 14 * profile.compute_slices // 2, profile.name
            assert units.copy_engines >= 1, profile.name
            assert profile.media_extensions <= (units.jpeg >= 1 and units.ofa >= 1), profile.name


def test_machine_type_file_is_read_without_blocking_or_failing() -> None:
    directory = Path(tempfile.mkdtemp())
    assert read_machine_type(str(directory / "missing")) is None
    (directory / "empty").write_text("\n\n")
    assert read_machine_type(str(directory / "empty")) is None
    (directory / "dmi").write_text("  DGXH100 \nsecond line\n")
    assert read_machine_type(str(directory / "dmi")) == "DGXH100"
    os.mkfifo(directory / "fifo")  # nobody writes it: opening it to read would block
    assert read_machine_type(str(directory / "fifo")) is None
    assert read_machine_type(str(directory)) is None
