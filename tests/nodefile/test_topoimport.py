"""``nvplugin node import`` on real-world shapes of ``nvidia-smi topo -m``
(tests/nodefile/topo/): one command, no edits; NVLinks and NUMA nodes as the text says; the
best-effort answer optimal at every size; the same text pasted whole into a node file's ``links``
loads the same node."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nvplugin.allocator import explain_allocation
from nvplugin.errors import InputError
from nvplugin.node.model import Pcie, Topology
from nvplugin.nodefile.cpus import CpuLists, CpuSpec
from nvplugin.nodefile.reader import NodeSpec, parse_node
from nvplugin.nodefile.topoimport import Source, import_topo, parse_gpu_csv
from nvplugin.nodefile.topotext import TopoTextError, parse_topo
from tests.support.reference import BruteForce, MemoSearch

SHAPES = Path(__file__).parent / "topo"


# file -> (NUMA node of each GPU, NUMA nodes, nvswitch_links of each GPU, cpus: (sockets, cores,
# threads) or "lists")
EXPECTED: dict[str, tuple[list[int | None], int, int, tuple[int, int, int] | str]] = {
    "k80-soc-2016.txt": ([0] * 4 + [1] * 4, 2, 0, (2, 12, 2)),
    "pcie-8gpu-mlx4-2017.txt": ([0] * 4 + [1] * 4, 2, 0, (2, 10, 2)),
    "dgx-a100-nps4-tabs.txt": ([3, 3, 1, 1, 7, 7, 5, 5], 8, 12, (2, 64, 2)),
    "hgx-h100-snc2-9nic.txt": ([0, 0, 0, 1, 2, 2, 3, 3], 4, 18, (2, 48, 2)),
    "rtx4090-8x-sys-tabs.txt": ([0] * 4 + [1] * 4, 2, 0, (2, 56, 2)),
    "rtx5090-2x-tabs-p2p.txt": ([0, 0], 1, 0, (1, 32, 2)),
    "workstation-5gpu-numa1-first.txt": ([1, 0, 0, 0, 0], 2, 0, (2, 8, 2)),
    "dgx2-16gpu-nv6-mlx5.txt": ([0] * 8 + [1] * 8, 2, 6, (2, 24, 2)),
    "a100-header-flush-left.txt": ([3, 3, 1, 1, 7, 7, 5, 5], 8, 12, (2, 64, 2)),
    "pasted-indented-wrapped.txt": ([0, 0], 1, 0, (1, 8, 2)),
    "amd-nps4-numa-ranges.txt": ([0, 0, 2, 2, 4, 4, 6, 6], 8, 0, (2, 64, 2)),
    "vm-4gpu-numa-na.txt": ([None] * 4, 1, 0, (1, 24, 2)),
    "one-gpu-numa-na.txt": ([0, 0, 1, None], 2, 0, (2, 16, 2)),
    "single-gpu.txt": ([0], 1, 0, (1, 8, 2)),
    "gh200-gpu-numa-id.txt": ([0], 1, 0, (1, 36, 2)),
    "interleaved-cpu-numbering.txt": ([0, 0, 1, 1], 2, 0, "lists"),
    "h100-nvl-bridged-pairs.txt": ([0] * 4 + [1] * 4, 2, 0, (2, 32, 2)),
    "hgx-a100-4gpu-nv4-direct.txt": ([0, 0, 1, 1], 2, 0, (2, 32, 2)),
    "dgx1-v100-mlx5-cpu-lists.txt": ([0] * 4 + [1] * 4, 2, 0, (2, 12, 2)),
    "hgx-a100-17nic-numa0.txt": ([0] * 8, 1, 12, (1, 52, 2)),
    "4x-a10-all-sys.txt": ([0] * 4, 1, 0, (1, 64, 2)),
    "2x-desktop-phb-numa-na.txt": ([None] * 2, 1, 0, (1, 6, 2)),
}


INPUTS = sorted(SHAPES.glob("*.txt"))
IDS = [p.name for p in INPUTS]


def _import(path: Path) -> NodeSpec:
    text = import_topo(Source(path.read_text(), f"topo file {path.name}"), path.stem)
    return parse_node(text, path.name)


def _text_cells(text: str, n: int) -> list[list[str]]:
    """The GPU cells of the text, read the simplest way (first row of each GPUk title)."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        tokens = line.split()
        if (
            tokens
            and re.fullmatch(r"GPU\d+", tokens[0])
            and tokens[0] not in rows
            and not tokens[1].startswith("GPU")
        ):
            rows[tokens[0]] = tokens[1 : n + 1]
    return [rows[f"GPU{i}"] for i in range(n)]


def test_a_dozen_shapes_and_the_shared_outputs_are_covered() -> None:
    shapes = [p for p in INPUTS if p.parent == SHAPES]
    assert len(shapes) >= 12
    assert {p.name for p in INPUTS} <= set(EXPECTED)
    sizes = {len(set(re.findall(r"^\s*(GPU\d+)\s", p.read_text(), re.M))) for p in shapes}
    assert {1, 2, 4, 5, 8, 16} <= sizes


@pytest.mark.parametrize("path", INPUTS, ids=IDS)
def test_imports_with_nvlinks_and_numa_as_the_text_says(path: Path) -> None:
    spec = _import(path)
    numa, nodes, switch, cpus = EXPECTED[path.name]
    n = len(numa)
    assert [g.numa_node for g in spec.gpus] == numa
    assert len(spec.numa_distances) == nodes
    assert [g.nvswitch_links for g in spec.gpus] == [switch] * n
    if cpus == "lists":
        assert isinstance(spec.cpus, CpuLists)
    else:
        assert spec.cpus == CpuSpec(*cpus)
    cells = _text_cells(path.read_text(), n)
    for i in range(n):
        for j in range(n):
            link = spec.links[i][j]
            if i == j:
                assert link is None
                continue
            assert link is not None
            text = cells[i][j]
            if text.startswith("NV"):
                assert link.nvlinks == int(text[2:])
                same = numa[i] is not None and numa[i] == numa[j]
                assert link.pcie == (Pcie.NODE if same else Pcie.SYS)
            else:
                assert link.nvlinks == 0
                assert link.pcie == Pcie["SYS" if text == "SOC" else text]


def test_cpu_lists_are_those_of_the_text() -> None:
    spec = _import(SHAPES / "dgx-a100-nps4-tabs.txt")
    assert spec.cpu_layout.on_node(3) == (*range(48, 64), *range(176, 192))
    assert spec.cpu_layout.on_node(0) == (*range(0, 16), *range(128, 144))
    odd = _import(SHAPES / "interleaved-cpu-numbering.txt")
    assert odd.cpu_layout.on_node(0) == tuple(range(0, 48, 2))
    assert odd.cpu_layout.on_node(1) == tuple(range(1, 48, 2))
    ranges = _import(SHAPES / "amd-nps4-numa-ranges.txt")
    both = ranges.cpu_layout.on_node(6) + ranges.cpu_layout.on_node(7)
    assert sorted(both) == [*range(96, 128), *range(224, 256)]


def _reference(topology: Topology) -> BruteForce | MemoSearch:
    return BruteForce(topology) if len(topology) <= 8 else MemoSearch(topology)


@pytest.mark.slow
@pytest.mark.parametrize("path", INPUTS, ids=IDS)
def test_preferred_is_optimal_at_every_size(path: Path) -> None:
    topology = _import(path).topology()
    n = len(topology)
    reference = _reference(topology)
    rng = random.Random(path.name)
    cases = [tuple(range(n))]
    if n <= 8:
        cases += [tuple(sorted(rng.sample(range(n), rng.randint(1, n)))) for _ in range(6)]
    for available in cases:
        for size in range(1, len(available) + 1):
            answer = explain_allocation("best-effort", topology, available, (), size)
            assert list(answer.indices) == reference.answer(available, (), size), (available, size)
            if isinstance(reference, BruteForce):
                assert answer.partition_score == reference.opt(available, (), size)


def _pasted(path: Path, indicator: str = "|2") -> str:
    text = path.read_text()
    n = len(parse_topo(text).cells)
    body = "".join(f"  {line}\n" if line else "\n" for line in text.splitlines())
    gpus = "".join("  - {name: NVIDIA GPU}\n" for _ in range(n))
    return f"version: v1\nname: {path.stem}\ngpus:\n{gpus}links: {indicator}\n{body}"


@pytest.mark.parametrize("path", INPUTS, ids=IDS)
def test_the_whole_text_pasted_into_links_loads_the_same_node(path: Path) -> None:
    text = _pasted(path)
    assert yaml.safe_load(text)["links"].splitlines()[0] == path.read_text().splitlines()[0]
    pasted = parse_node(text, "pasted")
    imported = _import(path)
    assert pasted.topology() == imported.topology()
    assert pasted.cpu_layout == imported.cpu_layout
    assert [g.nvswitch_links for g in pasted.gpus] == [g.nvswitch_links for g in imported.gpus]


@pytest.mark.parametrize("name", ["pcie-8gpu-mlx4-2017.txt", "dgx-a100-nps4-tabs.txt"])
def test_a_paste_under_a_plain_bar_says_to_write_bar_2(name: str) -> None:
    """Older drivers indent the header further than the rows, current ones start it with a
    tab: under a plain `|` YAML fails either way, and the message says what to write."""
    with pytest.raises(InputError, match=r"write `links: \|2`") as caught:
        parse_node(_pasted(SHAPES / name, "|"), "node file x.yaml")
    assert len(str(caught.value)) < 600


# -- errors name the line and column, and never echo the block --------------------------------
def _bad(old: str, new: str, name: str = "h100-nvl-bridged-pairs.txt") -> str:
    text = (SHAPES / name).read_text()
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (_bad("NV12    NODE", "NV13    NODE"), ["line 2, column 17", "GPU1 says 'NV13' but"]),
        (
            _bad("SYS     SYS ", "QPI     SYS "),
            ["line 2, column 41", "row GPU0, column GPU4: unknown cell 'QPI'"],
        ),
        (_bad("NV12    NODE", "NV99    NODE"), ["line 2, column 17", "NVLink count must be"]),
        (_bad(" X      NV12", " NV12   NV12"), ["line 2, column 10", "diagonal must be X"]),
        (_bad("0-31,64-95      0", "0-31,64-95      zero"), ["line 2", "NUMA Affinity 'zero'"]),
        (_bad("0-31,64-95      0", "0-31;64-95      0"), ["CPU Affinity '0-31;64-95'"]),
        ("GPU0 GPU1\nno rows here\n", ["line 1, column 1", "no nvidia-smi topo -m matrix"]),
        (_bad("GPU7    ", "GPU9    "), ["line 1", "expected GPU7"]),
    ],
    ids=["asymmetric", "unknown-cell", "nvlinks", "diagonal", "numa", "cpus", "no-header", "gap"],
)
def test_errors_name_line_and_column(text: str, fragments: list[str]) -> None:
    with pytest.raises(TopoTextError) as caught:
        parse_topo(text)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    assert len(message) < 400


def test_an_error_in_a_node_files_links_names_the_files_line() -> None:
    text = _pasted(SHAPES / "h100-nvl-bridged-pairs.txt").replace("NV12    NODE", "NV13    NODE", 1)
    with pytest.raises(InputError) as caught:
        parse_node(text, "node file n.yaml")
    # the block starts on line 13 of the file (after 8 GPUs), indented by 2
    assert str(caught.value).startswith("node file n.yaml: links, line 14, column 19: row GPU0")


# -- the GPU CSV ---------------------------------------------------------------------------------
CSV = """index, name, uuid, memory.total [MiB], pci.bus_id
0, NVIDIA H100 NVL, GPU-0a0a0a0a-0000-4000-8000-000000000000, 95830 MiB, 00000000:1B:00.0
1, NVIDIA H100 NVL, GPU-0a0a0a0a-0000-4000-8000-000000000001, 95830 MiB, 00000000:1C:00.0
"""


def test_gpu_csv_with_and_without_header() -> None:
    rows = parse_gpu_csv(Source(CSV, "gpus.csv"), 2)
    assert rows[1] == {
        "name": "NVIDIA H100 NVL",
        "uuid": "GPU-0a0a0a0a-0000-4000-8000-000000000001",
        "memory_mib": 95830,
        "pci_bus_id": "00000000:1C:00.0",
    }
    bare = "\n".join(line.replace(" MiB", "") for line in CSV.splitlines()[1:])
    assert parse_gpu_csv(Source(bare, "gpus.csv"), 2) == rows


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (CSV.replace("95830 MiB", "lots", 1), "line 2, column 4: memory.total 'lots'"),
        (CSV.replace("pci.bus_id", "pci.bus"), "line 1, column 5: unknown column"),
        (CSV.replace("\n1,", "\n7,"), "line 3, column 1: index '7' is not a GPU"),
        (CSV.splitlines()[0] + "\n" + CSV.splitlines()[1], "no line for GPU 1"),
    ],
)
def test_gpu_csv_errors(text: str, fragment: str) -> None:
    with pytest.raises(InputError, match=re.escape(fragment)):
        parse_gpu_csv(Source(text, "gpus.csv"), 2)


# -- the command ---------------------------------------------------------------------------------
def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", *args],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
    )


@pytest.mark.process
def test_command_reads_a_file_or_stdin_and_takes_the_csv(tmp_path: Path) -> None:
    topo = SHAPES / "h100-nvl-bridged-pairs.txt"
    csv = tmp_path / "gpus.csv"
    csv.write_text(
        CSV.replace("\n1,", "\n1,")
        + "".join(
            f"{i}, NVIDIA H100 NVL, GPU-0a0a0a0a-0000-4000-8000-00000000000{i}, 95830 MiB, "
            f"00000000:{0x1D + i:02X}:00.0\n"
            for i in range(2, 8)
        )
    )
    done = _cli("node", "import", str(topo), "--gpus", str(csv))
    assert done.returncode == 0, done.stderr
    spec = parse_node(done.stdout, "out")
    assert spec.name == "h100-nvl-bridged-pairs"
    assert spec.gpus[1].memory_mib == 95830 and spec.gpus[7].pci_bus_id == "00000000:24:00.0"
    piped = _cli("node", "import", "-", "--name", "from-stdin", stdin=topo.read_text())
    assert piped.returncode == 0, piped.stderr
    assert parse_node(piped.stdout, "out").name == "from-stdin"
    out = tmp_path / "node.yaml"
    written = _cli("node", "import", str(topo), "-o", str(out))
    assert written.returncode == 0 and written.stdout == ""
    assert parse_node(out.read_text(), "out").topology() == _import(topo).topology()
    preferred = _cli("preferred", "--simulate", str(out), "--size", "2", "--output", "json")
    assert preferred.returncode == 0, preferred.stderr
    assert '"indices": [\n    0,\n    1\n  ]' in preferred.stdout


@pytest.mark.process
def test_command_error_is_one_short_line(tmp_path: Path) -> None:
    bad = tmp_path / "topo.txt"
    bad.write_text(_bad("NV6     NV6 ", "NVX     NV6 ", "dgx2-16gpu-nv6-mlx5.txt"))
    done = _cli("node", "import", str(bad))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and len(done.stderr) < 400, done.stderr
    assert done.stderr.startswith(f"error: topo file {bad}: line ")
