"""``nvplugin devices`` and ``nvplugin topo`` as users run them: real subprocesses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nvplugin.config import env_names
from nvplugin.node.views import mig_dict
from nvplugin.nodefile.reader import builtin_names, load_node

pytestmark = pytest.mark.process  # runs nvplugin commands as processes

BUILTINS = builtin_names()
_SETTING_ENV = {*env_names(), "CONFIG_FILE", "DP_DISABLE_HEALTHCHECKS", "DP_ENABLE_HEALTHCHECKS"}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("name", BUILTINS)
def test_devices_table(name: str) -> None:
    result = _cli("devices", "--simulate", name)
    assert result.returncode == 0, result.stderr
    gpu_table, _, mig_table = result.stdout.partition("\n\n")
    lines = gpu_table.splitlines()
    spec = load_node(name)
    mig = any(gpu.mig is not None for gpu in spec.gpus)
    header = ["INDEX", "UUID", "NAME", "MEMORY", "BUS", "ID", "NUMA"]
    assert lines[0].split() == [*header, "MIG"] if mig else header
    assert len(lines) == 1 + len(spec.gpus)
    for line, gpu in zip(lines[1:], spec.gpus, strict=True):
        assert line.startswith(f"{gpu.index} ")
        assert gpu.uuid in line and gpu.name in line and gpu.pci_bus_id in line
        assert f"{gpu.memory_mib} MiB" in line
        numa = "N/A" if gpu.numa_node is None else str(gpu.numa_node)
        cells = line.split()
        if mig:
            state = "off" if gpu.mig is None else f"({len(gpu.mig)})"
            assert cells[-1] == state
            cells = cells[:-2] if gpu.mig is not None else cells[:-1]
        assert cells[-1] == numa
    assert bool(mig_table) == mig


@pytest.mark.parametrize("name", BUILTINS)
def test_devices_json(name: str) -> None:
    result = _cli("devices", "--simulate", name, "--output", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    topo = load_node(name).topology()
    assert data["name"] == name
    assert data["gpus"] == [
        {
            "index": g.index,
            "uuid": g.uuid,
            "name": g.name,
            "memory_mib": g.memory_mib,
            "pci_bus_id": g.pci_bus_id,
            "numa_node": g.numa_node,
            "mig": {"devices": [mig_dict(m) for m in g.mig_devices]} if g.mig_enabled else None,
        }
        for g in topo.gpus
    ]


@pytest.mark.parametrize("name", BUILTINS)
def test_topo_json_contract(name: str) -> None:
    result = _cli("topo", "--simulate", name, "--output", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    topo = load_node(name).topology()
    assert set(data) == {"name", "gpus", "pairs"}
    assert [g["index"] for g in data["gpus"]] == list(range(len(topo)))
    assert all(
        set(g) == {"index", "uuid", "name", "memory_mib", "pci_bus_id", "numa_node", "mig"}
        for g in data["gpus"]
    )
    n = len(topo)
    assert [(p["a"], p["b"]) for p in data["pairs"]] == [
        (a, b) for a in range(n) for b in range(a + 1, n)
    ]
    for pair in data["pairs"]:
        link = topo.link(pair["a"], pair["b"])
        assert pair == {
            "a": pair["a"],
            "b": pair["b"],
            "pcie": link.pcie.name,
            "nvlinks": link.nvlinks,
            "score": link.score,
        }


@pytest.mark.parametrize("name", BUILTINS)
def test_topo_matrix(name: str) -> None:
    result = _cli("topo", "--simulate", name)
    assert result.returncode == 0, result.stderr
    topo = load_node(name).topology()
    n = len(topo)
    text = result.stdout
    matrix, _, rest = text.partition("Legend:")
    assert "Pair scores" in rest
    rows = [line.split() for line in matrix.splitlines() if re.match(r"^GPU\d+ ", line)]
    assert len(rows) == n
    for i, row in enumerate(rows):
        assert row[0] == f"GPU{i}"
        cells = row[1 : n + 1]
        assert cells == ["X" if c is None else c.cell for c in topo.links[i]]
    scores = [line.split() for line in rest.splitlines() if re.match(r"^GPU\d+ ", line)]
    for i, row in enumerate(scores):
        assert row[1:] == ["-" if i == j else str(topo.score(i, j)) for j in range(n)]


@pytest.mark.parametrize("name", BUILTINS)
def test_topo_mermaid_has_every_nvlink_edge(name: str) -> None:
    result = _cli("topo", "--simulate", name, "--output", "mermaid")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith("```mermaid\ngraph LR\n") and text.endswith("```\n")
    topo = load_node(name).topology()
    edges = re.findall(r'^  gpu(\d+) ---\|"NV(\d+)"\| gpu(\d+)$', text, re.M)
    expected = {(a, b, link.nvlinks) for a, b, link in topo.pairs() if link.nvlinks}
    assert {(int(a), int(b), int(k)) for a, k, b in edges} == expected
    assert len(edges) == len(expected)
    for gpu in topo.gpus:
        assert re.search(rf'^    gpu{gpu.index}\["GPU{gpu.index}<br/>', text, re.M)
    numa = {g.numa_node for g in topo.gpus}
    for node in numa:
        title = "NUMA node unknown" if node is None else f"NUMA node {node}"
        assert f'["{title}"]' in text
    assert text.count("subgraph") == len(numa) and text.count("\n  end\n") == len(numa)


def test_devices_without_driver_exits_1_with_clear_message() -> None:
    try:
        import ctypes

        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver; the message is tested in-process")
    result = _cli("devices")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: NVML library libnvidia-ml.so.1 not found: ")
    assert "is the NVIDIA driver installed" in result.stderr
    assert "NVIDIA container runtime" in result.stderr
    assert "--simulate" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_output_choice_is_a_usage_error() -> None:
    result = _cli("topo", "--simulate", "dgx-1", "--output", "dot")
    assert result.returncode == 2
    assert "'dot' is not one of" in result.stderr


def test_devices_imports_stay_light() -> None:
    """The 0.5 s start-up budget: the devices path must not import numpy or grpc."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "nvplugin", "devices", "--simulate", "dgx-2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()}
    assert "pynvml" in imported
    assert not {m for m in imported if m.split(".")[0] in {"numpy", "grpc"}}


def test_devices_reads_the_environment_serve_reads(tmp_path: Path) -> None:
    """ "Check your config with `nvplugin devices`" must see what the DaemonSet's `serve` sees:
    NVIDIA's variables (MIG_STRATEGY, CONFIG_FILE) and nvplugin's, not only the flags."""
    clean = {k: v for k, v in os.environ.items() if k not in _SETTING_ENV}

    def devices(*args: str, **env: str) -> dict[str, object]:
        result = subprocess.run(
            [sys.executable, "-m", "nvplugin", "devices", "--simulate", "dgx-a100-mig", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**clean, **env},
        )
        assert result.returncode == 0, result.stderr
        shown: dict[str, object] = json.loads(result.stdout)
        return shown

    by_flag = devices("--mig-strategy", "mixed", "--output", "json")
    assert "nvidia.com/mig-1g.5gb" in json.dumps(by_flag)
    assert devices("--output", "json", MIG_STRATEGY="mixed") == by_flag
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags: {migStrategy: mixed}\n")
    assert devices("--output", "json", CONFIG_FILE=str(config)) == by_flag
    assert devices("--output", "json", "--config", str(config)) == by_flag
    renamed = devices("--output", "json", NVPLUGIN_RESOURCE_NAME="example.com/gpu")
    assert "example.com/gpu" in json.dumps(renamed)


def test_control_characters_in_a_gpu_name_are_never_printed_raw(tmp_path: Path) -> None:
    """A name that would clear the screen, fake a second line and flip the text after it: the
    table, the JSON, the topology and every log line show its escapes, never the characters."""
    node = tmp_path / "hostile.yaml"
    node.write_text(
        "version: v1\nname: hostile\nnuma_distances: [[10]]\n"
        "cpus: {sockets: 1, cores_per_socket: 2, threads_per_core: 1}\n"
        'gpus:\n  - {name: "Tesla \\e[2J\\e[31mT4\\nFAKE LINE\\u202eevil", memory_mib: 15360}\n'
        "links: |2\n        GPU0\n  GPU0  X\nevents: []\n"
    )
    escaped = "Tesla \\x1b[2J\\x1b[31mT4\\nFAKE LINE\\u202eevil"
    for args in (("devices",), ("devices", "--output", "json"), ("topo", "--output", "mermaid")):
        result = _cli(*args, "--simulate", str(node))
        assert result.returncode == 0, result.stderr
        out = result.stdout + result.stderr
        assert not [c for c in out if not c.isprintable() and c != "\n"], args
        assert "\nFAKE LINE" not in out
        assert escaped in (json.loads(result.stdout)["gpus"][0]["name"] if "json" in args else out)
