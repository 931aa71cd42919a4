"""Node files: every bad input gets exit code 2 and one message naming file, field and value;
good files (hand-written and hypothesis-generated) round-trip through the fake NVML."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings

from nvplugin.errors import InputError
from nvplugin.node.model import Link, Pcie
from nvplugin.nodefile.reader import builtin_names, load_node, parse_node
from nvplugin.nodesession import open_node
from tests.support.nodefiles import GOOD, node_files, write_node_file


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", *args], capture_output=True, text=True, timeout=60
    )


def test_good_file_loads() -> None:
    spec = load_node(write_node_file(GOOD))
    assert [g.uuid for g in spec.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert spec.links[0][1] == Link(Pcie.SYS, 2)


def test_documented_example_parses() -> None:
    """The README's node file, with the nvidia-smi style indented header."""
    text = """version: v1
name: my-node
numa_distances: [[10, 21], [21, 10]]     # optional; one row per NUMA node
cpus: {sockets: 2, cores_per_socket: 32, threads_per_core: 2}   # optional (fake kubelet)
gpus:                                    # list order = NVML index
  - name: NVIDIA H100 80GB HBM3
    uuid: GPU-8e7c0000
    memory_mib: 81559
    pci_bus_id: "00000000:18:00.0"
    numa_node: 0
    nvswitch_links: 18
  - name: NVIDIA H100 80GB HBM3
    numa_node: 0
    nvswitch_links: 18
links: |2                                # nvidia-smi topo -m style, GPU columns only
        GPU0       GPU1
  GPU0  X          NV18+NODE
  GPU1  NV18+NODE  X
events: []
"""
    spec = parse_node(text, "example")
    assert spec.links[0][1] == Link(Pcie.NODE, 18)
    assert spec.gpus[1].pci_bus_id == "00000000:11:00.0"
    assert spec.gpus[1].uuid.startswith("GPU-")
    assert len(spec.cpu_layout.cpus) == 128


def test_defaults() -> None:
    text = """version: v1
name: defaults
gpus: [{name: A, numa_node: 1}, {name: A, numa_node: 1}, {name: A}]
links: |2
  GPU0 GPU1 GPU2
  GPU0 X NV4 NV1
  GPU1 NV4 X PIX
  GPU2 NV1 PIX X
"""
    spec = parse_node(text, "t")
    again = parse_node(text, "t")
    assert [g.uuid for g in spec.gpus] == [g.uuid for g in again.gpus]
    assert len({g.uuid for g in spec.gpus}) == 3
    assert [g.pci_bus_id for g in spec.gpus] == [
        "00000000:10:00.0",
        "00000000:11:00.0",
        "00000000:12:00.0",
    ]
    assert spec.gpus[0].memory_mib == 16384
    assert spec.links[0][1] == Link(Pcie.NODE, 4)  # same NUMA node
    assert spec.links[0][2] == Link(Pcie.SYS, 1)  # GPU2's node unknown
    assert spec.numa_distances == ((10, 20), (20, 10))
    # default CPUs: one socket per NUMA node, 16 cores, 2 threads
    assert (spec.cpus.sockets, spec.cpus.cores_per_socket, spec.cpus.threads_per_core) == (
        2,
        16,
        2,
    )
    assert spec.cpu_layout.on_node(1)[:2] == (16, 17)


def _swap(old: str, new: str, text: str = GOOD) -> str:
    assert old in text
    return text.replace(old, new)


BAD = [
    # (id, node-file text, fragments the one message must contain)
    (
        "asymmetric",
        _swap("  GPU1  NV2+SYS  X", "  GPU1  NV1+SYS  X"),
        ["links, line 9, column 18", "row GPU0, column GPU1", "'NV1+SYS'", "symmetric"],
    ),
    (
        "non-square-row",
        _swap("  GPU1  NV2+SYS  X", "  GPU1  NV2+SYS"),
        ["links, line 10, column 16", "row GPU1 has 1 cells for 2 device columns"],
    ),
    (
        "non-square-rows",
        _swap("  GPU1  NV2+SYS  X\n", ""),
        ["links, line 8, column 3", "no row GPU1"],
    ),
    (
        "unknown-cell",
        _swap("NV2+SYS  X\n", "NVX  X\n").replace("X        NV2+SYS", "X        NVX"),
        ["links, line 9, column 18", "row GPU0, column GPU1", "unknown cell 'NVX'"],
    ),
    (
        "too-many-nvlinks",
        GOOD.replace("NV2+SYS", "NV19+SYS"),
        ["links, line 9, column 18", "NVLink count must be 1..18", "'NV19+SYS'"],
    ),
    (
        "off-diagonal-x",
        GOOD.replace("NV2+SYS", "X"),
        ["links, line 9, column 18", "X belongs on the diagonal only"],
    ),
    (
        "gpu-count",
        _swap(
            '  - {name: GPU B, uuid: GPU-bbbb, pci_bus_id: "00000000:19:00.0", numa_node: 1}\n', ""
        ),
        ["links", "2 GPU columns but gpus lists 1 GPUs"],
    ),
    (
        "duplicate-uuid",
        _swap("uuid: GPU-bbbb", "uuid: GPU-aaaa"),
        ["gpus[1].uuid", "duplicate", "gpus[0]", "'GPU-aaaa'"],
    ),
    (
        "duplicate-bus-id",
        _swap('"00000000:19:00.0"', '"0000:18:00.0"'),
        ["gpus[1].pci_bus_id", "duplicate", "'00000000:18:00.0'"],
    ),
    (
        "numa-outside-distances",
        _swap("numa_node: 1}", "numa_node: 2}"),
        ["gpus[1].numa_node", "not a NUMA node of numa_distances (nodes 0..1)", "2"],
    ),
    (
        "unknown-top-key",
        GOOD + "colour: blue\n",
        ["colour", "unknown key", "'colour'"],
    ),
    (
        "unknown-gpu-key",
        _swap("{name: GPU A,", "{name: GPU A, memory_gb: 80,"),
        ["gpus[0].memory_gb", "unknown key", "'memory_gb'"],
    ),
    (
        "wrong-type",
        _swap("{name: GPU A,", "{name: GPU A, memory_mib: lots,"),
        ["gpus[0].memory_mib", "must be an integer", "'lots'"],
    ),
    (
        "wrong-type-gpus",
        GOOD.split("gpus:")[0] + "gpus: 3\nlinks: GPU0\n",
        ["gpus", "must be a non-empty list", "3"],
    ),
    (
        "distances-not-square",
        _swap("[[10, 21], [21, 10]]", "[[10, 21], [21]]"),
        ["numa_distances[1]", "square", "[21]"],
    ),
    (
        "nvswitch-mismatch",
        _swap("numa_node: 0}", "numa_node: 0, nvswitch_links: 12}").replace(
            "numa_node: 1}", "numa_node: 1, nvswitch_links: 12}"
        ),
        ["links row GPU0 column GPU1", "NVSwitch fabric", "must say NV12", "'NV2+SYS'"],
    ),
    (
        "duplicate-key",
        _swap("name: good\n", "name: good\nname: again\n"),
        ["line 3", "duplicate key 'name'"],
    ),
    (
        "bad-yaml",
        GOOD + "gpus: [\n",
        ["not valid YAML"],
    ),
    (
        "version",
        _swap("version: v1", "version: 2"),
        ["version", "must be v1", "2"],
    ),
    (
        "event-unknown-key",
        GOOD + "events:\n  - {after_s: 1, gpu: 0, xid: 79, colour: red}\n",
        ["events[0].colour", "unknown key", "'colour'"],
    ),
    (
        "event-gpu-out-of-range",
        GOOD + "events:\n  - {after_s: 1, gpu: 2, xid: 79}\n",
        ["events[0].gpu", "GPU index of this node (0..1)", "2"],
    ),
    (
        "event-two-kinds",
        GOOD + "events:\n  - {after_s: 1, gpu: 0, xid: 79, lost: true}\n",
        ["events[0]", "exactly one of", "'xid, lost'"],
    ),
    (
        "event-negative-time",
        GOOD + "events:\n  - {after_s: -1, gpu: 0, lost: true}\n",
        ["events[0].after_s", ">= 0", "-1"],
    ),
    (
        "event-wait-error-without-for",
        GOOD + "events:\n  - {after_s: 1, wait_error: true}\n",
        ["events[0].for_s", "missing"],
    ),
    (
        "event-fabric-outside-a-fabric",
        GOOD + "events:\n  - {after_s: 1, gpu: 1, fabric: in-progress}\n",
        ["events[0].fabric", "GPU 1 is not in an NVSwitch fabric"],
    ),
    (
        "event-fabric-bad-status",
        _swap("numa_node: 0}", "numa_node: 0, nvswitch_links: 6}")
        + "events:\n  - {after_s: 1, gpu: 0, fabric: {status: sad}}\n",
        ["events[0].fabric.status", "NVML error name", "'sad'"],
    ),
    (
        "event-nvlink-the-gpu-lacks",
        GOOD + "events:\n  - {after_s: 1, gpu: 0, nvlink: {link: 2, state: down}}\n",
        ["events[0].nvlink.link", "GPU 0 has 2 NVLink(s) (0..1)", "2"],
    ),
    (
        "event-nvlink-two-changes",
        GOOD + "events:\n  - {after_s: 1, gpu: 0, nvlink: {link: 0, state: down, errors: 5}}\n",
        ["events[0].nvlink", "exactly one of errors, state"],
    ),
    (
        "event-remap-unknown",
        GOOD + "events:\n  - {after_s: 1, gpu: 0, remap: soon}\n",
        ["events[0].remap", "one of pending, failed", "'soon'"],
    ),
    (
        "event-ecc-step-zero",
        GOOD + "events:\n  - {after_s: 1, gpu: 0, ecc: 0}\n",
        ["events[0].ecc", "0"],
    ),
    (
        "version-without-v",
        _swap("version: v1", "version: 1"),
        ["version", "must be v1 (as in config files)", "1"],
    ),
    (
        "cpus-forms-mixed",
        GOOD + 'cpus: {sockets: 2, numa_cpus: ["0-3", "4-7"]}\n',
        ["cpus.sockets", "not with numa_cpus"],
    ),
    (
        "cpus-list-syntax",
        GOOD + 'cpus: {numa_cpus: ["0-3", "4-x"]}\n',
        ["cpus.numa_cpus[1]", "not a CPU list", "'4-x'"],
    ),
    (
        "cpus-lists-count",
        GOOD + 'cpus: {numa_cpus: ["0-3", "4-7", "8-11"]}\n',
        ["cpus.numa_cpus", "does not fit 2 NUMA node(s)", "lists 3 NUMA nodes"],
    ),
    (
        "cpus-lists-overlap",
        GOOD + 'cpus: {numa_cpus: ["0-3", "3-7"]}\n',
        ["cpus", "CPU 3 is on NUMA nodes 0 and 1"],
    ),
    (
        "cpus-do-not-fit",
        GOOD + "cpus: {sockets: 3, cores_per_socket: 4, threads_per_core: 1}\n",
        ["cpus", "does not fit 2 NUMA node(s)", "sockets"],
    ),
]


@pytest.mark.parametrize(("text", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_node_file_in_process(text: str, fragments: list[str]) -> None:
    path = write_node_file(text)
    with pytest.raises(InputError) as caught:
        load_node(path)
    message = str(caught.value)
    assert message.startswith(f"node file {path}: ")
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.process
@pytest.mark.parametrize(("text", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_node_file_exits_2_with_one_message(text: str, fragments: list[str]) -> None:
    path = write_node_file(text)
    result = _cli("topo", "--simulate", path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: node file {path}: ")
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.process
def test_unknown_builtin_lists_builtins() -> None:
    result = _cli("devices", "--simulate", "dgx-9")
    assert result.returncode == 2
    assert "unknown node 'dgx-9'" in result.stderr
    assert ", ".join(builtin_names()) in result.stderr


@pytest.mark.process
def test_missing_node_file() -> None:
    result = _cli("devices", "--simulate", "/nonexistent/node.yaml")
    assert result.returncode == 2
    assert "node file /nonexistent/node.yaml: no such file" in result.stderr


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_files())
def test_generated_node_files_round_trip(case: tuple[str, dict[str, object]]) -> None:
    text, expected = case
    path = write_node_file(text)
    spec = load_node(path)
    with open_node(path) as node:
        topo = node.topology
    assert topo == spec.topology()
    n = expected["n"]
    assert isinstance(n, int) and len(topo) == n
    links = expected["links"]
    assert isinstance(links, list)
    for a, b, link in topo.pairs():
        assert (link.pcie.name, link.nvlinks) == links[a][b]
    assert [g.numa_node for g in topo.gpus] == expected["numa"]
    assert [g.memory_mib for g in topo.gpus] == [1024 * (i + 1) for i in range(n)]
    with_uuid = expected["uuid"]
    with_bus = expected["bus"]
    assert isinstance(with_uuid, list) and isinstance(with_bus, list)
    for i, gpu in enumerate(topo.gpus):
        if with_uuid[i]:
            assert gpu.uuid == f"GPU-{i:04d}-gen"
        if with_bus[i]:
            assert gpu.pci_bus_id == f"{i + 1:08X}:{0x80 + i:02X}:00.0"
    # the matrix printed from discovery parses back to the same links
    header = "        " + "  ".join(f"GPU{j}" for j in range(n))
    rows = [
        f"  GPU{i}  " + "  ".join("X" if c is None else c.cell for c in topo.links[i])
        for i in range(n)
    ]
    reparsed = parse_node(
        text.split("links: |2")[0] + "links: |2\n" + "\n".join([header, *rows]) + "\n", "again"
    )
    assert reparsed.links == topo.links
