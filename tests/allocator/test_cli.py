"""``nvplugin preferred`` as users run it: a real subprocess on a simulated node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvplugin.nodefile.reader import load_node
from tests.support import bignodes

pytestmark = pytest.mark.process  # runs nvplugin commands as processes


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", "preferred", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_json_answer_dgx1_by_uuid_and_index() -> None:
    uuids = [g.uuid for g in load_node("dgx-1").gpus]
    available = ",".join([uuids[0], "1", "2", uuids[3], "4", "5", "6", "7"])
    done = _run("--simulate", "dgx-1", "--size", "2", "--available", available, "--output", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "devices": [uuids[2], uuids[3]],
        "indices": [2, 3],
        "score": 250,
        "partition_score": 920,
        "policy": "best-effort",
        "proven_optimal": True,
        "gap": 0,
    }


def test_explain_text_shows_partition_pairs_and_tie_break() -> None:
    done = _run("--simulate", "dgx-1", "--size", "2", "--explain")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "GPUs 2, 3" in out
    assert "GPU2-GPU3  NV2+PIX" in out
    assert "score 920" in out
    for group in ("{2,3}", "{0,4}", "{1,5}", "{6,7}"):
        assert group in out
    assert "2 of them share the highest own score 250; the lowest indices win: {2,3}" in out


def test_explain_json_and_simple_policy() -> None:
    done = _run(
        "--simulate", "dgx-1", "--size", "3", "--policy", "simple", "--must-include", "6",
        "--explain", "--output", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["policy"] == "simple" and doc["indices"] == [0, 1, 6]
    explain = doc["explain"]
    assert explain["partition"]["groups"][0] == [0, 1, 6]
    assert len(explain["partition"]["leftover"]) == 2
    assert {p["link"] for p in explain["pairs"]} == {"NV1+PIX", "SYS"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--size", "-1"], "size -1 is negative"),
        (["--size", "2", "--available", "0,3,3"], "GPU 3 given twice"),
        (["--size", "2", "--available", "0,GPU-nope"], "unknown device 'GPU-nope'"),
        (["--size", "2", "--available", "0,1", "--must-include", "3"], "GPU 3 is not in"),
        (["--size", "2", "--available", "0,9"], "unknown device '9'"),
        (["--size", "2", "--policy", "closest"], "'closest' is not one of 'best-effort', 'simple'"),
    ],
)
def test_errors_exit_2_naming_the_value(args: list[str], message: str) -> None:
    done = _run("--simulate", "workstation-4gpu", *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_impossible_request_prints_empty_answer() -> None:
    done = _run("--simulate", "workstation-4gpu", "--size", "5", "--output", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "devices": [],
        "indices": [],
        "score": None,
        "partition_score": None,
        "policy": "best-effort",
        "proven_optimal": True,
        "gap": None,
    }
    text = _run("--simulate", "workstation-4gpu", "--size", "0")
    assert text.returncode == 0 and "no preferred allocation" in text.stdout


@pytest.mark.parametrize(
    ("policy", "chosen", "shown"),
    [("best-effort", ["2:2", "2:3"], "mig"), ("simple", ["0:0", "0:1"], "simple")],
)
def test_policy_applies_to_a_mig_resource(policy: str, chosen: list[str], shown: str) -> None:
    """--policy is the plugin's allocationPolicy for MIG resources too: best-effort is the MIG
    policy (a tight fit on one parent), simple the lowest MIG devices first."""
    mig = ("--simulate", "dgx-a100-mig", "--mig-strategy", "mixed")
    done = _run(*mig, "--resource", "nvidia.com/mig-1g.5gb", "--size", "2", "--policy", policy,
                "--output", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["mig_devices"] == chosen and answer["policy"] == shown
    explained = _run(*mig, "--resource", "nvidia.com/mig-1g.5gb", "--size", "2", "--explain")
    assert explained.returncode == 2
    assert "--explain is about NVLink groups of GPUs; MIG devices have no NVLink" in (
        explained.stderr
    )


@pytest.mark.parametrize(
    ("node", "size", "proven"),
    [("mesh-20", 7, False), ("l4-24", 9, True), ("l4-24-uneven", 7, True)],
)
def test_json_is_all_that_stdout_carries(
    node: str, size: int, proven: bool, tmp_path: Path
) -> None:
    """On a node the budgeted search answers (mesh-20) and on PCIe-switch servers the branch
    search answers exactly: stdout parses as one JSON document saying whether the answer is
    proven, with the gap; no log line anywhere (debug lines only when asked for)."""
    path = bignodes.write(str(tmp_path), node)
    done = _run("--simulate", path, "--size", str(size), "--output", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["proven_optimal"] is proven and len(doc["indices"]) == size
    assert isinstance(doc["gap"], int) and doc["gap"] >= 0
    assert (doc["gap"] == 0) if proven else True
    assert "preferred allocation" not in done.stderr + done.stdout
    explained = _run("--simulate", path, "--size", str(size), "--output", "json", "--explain")
    assert json.loads(explained.stdout)["explain"]["proven_optimal"] is proven
    text = _run("--simulate", path, "--size", str(size), "--explain")
    assert ("not proven optimal" in text.stdout) == (not proven and doc["gap"] > 0)


@pytest.mark.parametrize("command", [["devices"], ["topo"]])
def test_other_json_commands_print_json_alone(command: list[str], tmp_path: Path) -> None:
    path = bignodes.write(str(tmp_path), "l4-20")
    done = subprocess.run(
        [sys.executable, "-m", "nvplugin", *command, "--simulate", path, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)


def test_no_debug_line_at_the_default_level_and_json_is_all_of_stdout(tmp_path: Path) -> None:
    """On a node only a search answers (mesh-20), the allocator notes at debug level that its
    answer is not proven optimal: a command prints no such line by default, and ``--output
    json`` is exactly the JSON document."""
    node = bignodes.write(str(tmp_path), "mesh-20")
    done = _run("--simulate", node, "--size", "5", "--output", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["indices"]
    assert "not proven optimal" not in done.stdout + done.stderr
    assert done.stderr == ""
