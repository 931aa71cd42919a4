"""``nvplugin labels`` as users run it: a real process whose standard output is exactly the labels
(NFD's feature-file lines), everything else on standard error."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.labelcases import MIG_TIME_SLICED, TIME_SLICED, read_fixture

pytestmark = pytest.mark.process  # runs nvplugin as a process

LINE = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9._-]+=[A-Za-z0-9._-]*$")


def _labels(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", "labels", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _file(text: str) -> str:
    path = Path(tempfile.mkdtemp()) / "config.yaml"
    path.write_text(text)
    return str(path)


def test_stdout_is_the_feature_file_and_the_timestamp_is_now() -> None:
    before = int(time.time())
    done = _labels("--simulate", "dgx-a100")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert done.stdout.endswith("\n") and lines == sorted(lines)
    assert all(LINE.match(line) for line in lines), lines
    labels = dict(line.split("=", 1) for line in lines)
    assert before <= int(labels.pop("nvidia.com/gfd.timestamp")) <= int(time.time())
    assert labels == read_fixture("dgx-a100")


@pytest.mark.parametrize(
    ("args", "fixture"),
    [
        (["--simulate", "dgx-a100-mig", "--mig-strategy", "mixed"], "dgx-a100-mig.mixed"),
        (["--simulate", "dgx-a100", "--config-file", TIME_SLICED], "dgx-a100.time-sliced"),
        (
            ["--simulate", "dgx-a100-mig", "--config", MIG_TIME_SLICED, "--mig-strategy", "mixed"],
            "dgx-a100-mig.mixed.time-sliced",
        ),
    ],
)
def test_config_and_strategy(args: list[str], fixture: str) -> None:
    args = [_file(arg) if "\n" in arg else arg for arg in args]
    done = _labels(*args, "--no-timestamp")
    assert done.returncode == 0, done.stderr
    assert dict(line.split("=", 1) for line in done.stdout.splitlines()) == read_fixture(fixture)


def test_warnings_go_to_stderr() -> None:
    done = _labels("--simulate", "mixed-a100-t4", "--no-timestamp")
    assert done.returncode == 0
    assert "warning: nvidia.com/gpu.* labels describe one model, not ['Tesla T4']" in done.stderr
    assert dict(line.split("=", 1) for line in done.stdout.splitlines()) == read_fixture(
        "mixed-a100-t4"
    )


def test_machine_type_file_and_bad_input() -> None:
    machine = Path(tempfile.mkdtemp()) / "machine"
    machine.write_text("Custom Box 9000\n")
    done = _labels("--simulate", "no-numa", "--machine-type-file", str(machine))
    assert "nvidia.com/gpu.machine=Custom-Box-9000\n" in done.stdout
    refused = _labels("--simulate", "dgx-a100-mig", "--mig-strategy", "single")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "migStrategy single" in refused.stderr
    relative = _labels("--simulate", "no-numa", "--machine-type-file", "machine")
    assert relative.returncode == 2 and "flags.gfd.machineTypeFile" in relative.stderr
