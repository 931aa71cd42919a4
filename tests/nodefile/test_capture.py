"""``nvplugin node capture``: the node file of a machine through NVML and sysfs. The simulated
NVML stands in for a GPU node, so capturing a simulated node must give back its node file's
content -- for every built-in node, every test node, and generated ones."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from nvplugin.node.model import Cpu, CpuLayout
from nvplugin.nodefile.capture import host_memory_mib
from nvplugin.nodefile.cpus import CpuLists, CpuSpec, describe_layout
from nvplugin.nodefile.reader import NodeSpec, builtin_names, load_node, parse_node
from nvplugin.nodefile.topoimport import Source, import_topo
from nvplugin.nodesession import capture_node
from tests.support.nodefiles import EVENTS_NODE, GOOD, UNEVEN_FABRIC, node_files, write_node_file

SHAPES = Path(__file__).parent / "topo"

GRACE = """version: v1
name: grace-hopper
numa_distances: [[10, 80], [80, 10]]   # node 1: the GPU's memory, no CPUs
cpus: {numa_cpus: ["0-71", ""]}
gpus: [{name: NVIDIA GH200 480GB, memory_mib: 97871, numa_node: 0}]
links: |2
        GPU0
  GPU0  X
"""

ROUND_ROBIN = """version: v1
name: round-robin
cpus:
  numa_cpus: ["0-46:2", "1-47:2"]
  threads_per_core: 2
gpus: [{name: A, numa_node: 0}, {name: A, numa_node: 1}]
links: |2
        GPU0     GPU1
  GPU0  X        NV4+SYS
  GPU1  NV4+SYS  X
""".replace('"0-46:2"', '"' + ",".join(map(str, range(0, 48, 2))) + '"').replace(
    '"1-47:2"', '"' + ",".join(map(str, range(1, 48, 2))) + '"'
)

TEST_NODES = {
    "nodefile-good": GOOD,
    "events": EVENTS_NODE.replace("{events}", "  - {after_s: 1, gpu: 0, xid: 79}"),
    "uneven-fabric": UNEVEN_FABRIC,
    "grace-hopper": GRACE,
    "round-robin": ROUND_ROBIN,
}


def _content(spec: NodeSpec) -> NodeSpec:
    """What a capture can see: all but the file name and the scripted events."""
    return dataclasses.replace(spec, source="", events=())


def _node_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("name", builtin_names())
def test_capturing_a_builtin_node_gives_its_node_file_back(name: str) -> None:
    text = capture_node(name)
    assert yaml.safe_load(text)["version"] == "v1"
    assert _content(parse_node(text, "captured")) == _content(load_node(name))


@pytest.mark.parametrize("name", sorted(TEST_NODES))
def test_capturing_a_test_node_gives_its_node_file_back(name: str, tmp_path: Path) -> None:
    path = _node_file(tmp_path, TEST_NODES[name])
    assert _content(parse_node(capture_node(path), "captured")) == _content(load_node(path))


@pytest.mark.parametrize("path", sorted(SHAPES.glob("*.txt")), ids=lambda p: p.name)
def test_capturing_an_imported_node_gives_it_back(path: Path, tmp_path: Path) -> None:
    imported = import_topo(Source(path.read_text(), path.name), path.stem)
    file = _node_file(tmp_path, imported)
    assert _content(parse_node(capture_node(file), "captured")) == _content(load_node(file))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_files())
def test_capturing_generated_nodes_gives_them_back(case: tuple[str, dict[str, object]]) -> None:
    path = write_node_file(case[0])
    try:
        assert _content(parse_node(capture_node(path), "captured")) == _content(load_node(path))
    finally:
        Path(path).unlink()
        Path(path).parent.rmdir()


def test_capture_writes_the_pcie_relation_under_nvlinks() -> None:
    text = capture_node("dgx-h100")
    matrix = yaml.safe_load(text)["links"]
    assert "NV18+NODE" in matrix and "NV18+SYS" in matrix
    assert "nvswitch_links: 18" in text


def test_explicit_cpu_lists_for_what_the_compact_form_cannot_say(tmp_path: Path) -> None:
    grace = yaml.safe_load(capture_node(_node_file(tmp_path, GRACE)))
    assert grace["cpus"] == {
        "numa_cpus": ["0-71", ""],
        "socket_cpus": ["0-71"],
        "threads_per_core": 1,
    }
    odd = parse_node(capture_node(_node_file(tmp_path, ROUND_ROBIN)), "captured")
    assert isinstance(odd.cpus, CpuLists)
    assert odd.cpu_layout.on_node(1) == tuple(range(1, 48, 2))
    # siblings as Linux numbers them when CPUs alternate: 0 and 24 share a core
    cores = {(c.socket, c.core): [] for c in odd.cpu_layout.cpus}
    for c in odd.cpu_layout.cpus:
        cores[(c.socket, c.core)].append(c.id)
    assert cores[(0, 0)] == [0, 24]


def test_sysfs_core_ids_with_gaps_still_give_the_compact_form() -> None:
    """Linux's core_id values skip numbers; only the grouping counts."""
    gappy = [0, 1, 2, 4, 8, 9, 10, 12]
    cpus = [
        Cpu(thread * 16 + socket * 8 + k, socket, core, socket)
        for thread in range(2)
        for socket in range(2)
        for k, core in enumerate(gappy)
    ]
    layout = CpuLayout(tuple(sorted(cpus, key=lambda c: c.id)))
    form, note = describe_layout(layout, 2)
    assert form == CpuSpec(2, 8, 2) and note is None


def test_threads_numbered_unlike_x86_become_one_thread_cores_with_a_note() -> None:
    """SMT4 numbered core by core (POWER): not expressible, so each CPU is its own core."""
    cpus = tuple(Cpu(i, 0, i // 4, 0) for i in range(16))
    form, note = describe_layout(CpuLayout(cpus), 1)
    assert form == CpuLists((tuple(range(16)),), (tuple(range(16)),), 1)
    assert note is not None and "threads_per_core: 1" in note


@pytest.mark.process
def test_capture_command(tmp_path: Path) -> None:
    out = tmp_path / "captured.yaml"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "nvplugin", *args], capture_output=True, text=True, timeout=60
        )

    done = cli("node", "capture", "--simulate", "dgx-a100", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"wrote {out}\n"
    mine = cli("topo", "--simulate", str(out), "--output", "json")
    theirs = cli("topo", "--simulate", "dgx-a100", "--output", "json")
    assert mine.returncode == 0 and mine.stdout == theirs.stdout


def test_capture_writes_mig_layouts_and_says_which_it_cannot() -> None:
    """A node file's MIG layout is one compute instance per GPU instance, from the profile
    tables: a smaller compute instance is written as its GPU instance (with a comment), and a
    profile variant no table has leaves the GPU without ``mig`` (with a comment), never a failed
    capture."""
    from nvplugin.nodefile.capture import write_capture
    from nvplugin.nodesession import load_topology

    topology = load_topology("dgx-a100-mig")
    gpus = list(topology.gpus)
    small_ci = tuple(dataclasses.replace(m, profile=f"1c.{m.profile}") for m in gpus[3].mig_devices)
    gpus[3] = dataclasses.replace(gpus[3], mig_devices=small_ci)  # 1c.3g.20gb x2
    gfx = dataclasses.replace(gpus[4].mig_devices[0], profile="2g.10gb+gfx")
    gpus[4] = dataclasses.replace(gpus[4], mig_devices=(gfx,))
    text = write_capture(dataclasses.replace(topology, gpus=tuple(gpus)), (12,) * 8, "a test")
    spec = parse_node(text, "captured")
    assert [i.profile.name for i in spec.gpus[3].mig or ()] == ["3g.20gb", "3g.20gb"]
    assert spec.gpus[4].mig is None and spec.gpus[5].mig == ()
    lines = text.splitlines()
    gpu3 = next(line for line in lines if '"00000000:4E:00.0"' in line)
    assert gpu3.endswith(
        "# compute instances smaller than their GPU instance written as the latter"
    )
    gpu4 = next(line for line in lines if '"00000000:87:00.0"' in line)
    assert "# MIG on (2g.10gb+gfx), not written: A100 40GB has no MIG profile" in gpu4


def test_a_hosts_memory_is_its_memtotal(tmp_path: Path) -> None:
    """On a real host the node's memory is /proc/meminfo's MemTotal (the kubelet's capacity),
    in MiB; a file without it gives none."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       528179072 kB\nMemFree:        1000 kB\n")
    assert host_memory_mib(str(meminfo)) == 528179072 // 1024
    meminfo.write_text("MemFree:        1000 kB\n")
    assert host_memory_mib(str(meminfo)) is None
    assert host_memory_mib(str(tmp_path / "absent")) is None
    assert yaml.safe_load(capture_node("dgx-1"))["memory_mib"] == load_node("dgx-1").memory_mib
