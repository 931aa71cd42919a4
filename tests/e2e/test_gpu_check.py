"""``make gpu-check`` (scripts/gpu_check.py) without a GPU: the same steps on a simulated node
with a scripted Xid, and the report's parts from known inputs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.support.serve import new_dir, node_file

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_report_of_a_simulated_node_with_an_xid() -> None:
    directory = new_dir()
    node = node_file(directory, "dgx-a100", [{"after_s": 0.5, "gpu": 2, "xid": 79}])
    out = Path(directory) / "out"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--simulate", node, "--out", str(out), "--serve-s", "3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = result.stdout
    assert "devices: 8 GPU(s) (8x NVIDIA A100-SXM4-40GB), 0 MIG device(s)" in report
    assert "numa: GPUs on node(s) 1, 3, 5, 7" in report
    assert "spec: CDI 0.5.0 kind k8s.device-plugin.nvidia.com/gpu, 9 devices" in report
    assert "health events seen in 3s: 1 (gpu unhealthy gpu=2)" in report
    for step in ("capture", "topology", "generate", "cdi check", "serve"):
        assert f"ok   {step}" in report, step
    assert "9 names resolve" in report
    assert "nvidia.com/gpu: 7 healthy; exit 0" in report
    assert report.rstrip().endswith("result: ok")
    spec = json.loads((out / "cdi" / "k8s.device-plugin.nvidia.com-gpu.json").read_text())
    assert len(spec["devices"]) == 9
    assert (out / "node.yaml").read_text().startswith("#")
    assert (out / "served-spec" / "k8s.device-plugin.nvidia.com-gpu.json").is_file()


def test_a_failed_step_fails_the_check_and_is_named() -> None:
    module = script()
    report = module.check("no-such-node", Path(new_dir()), 0.1)
    assert not report.ok
    assert not report.steps[0].ok and "no-such-node" in report.steps[0].detail
    assert "result: FAILED" in report.text()


def test_health_events_are_read_from_the_json_log() -> None:
    module = script()
    lines = [
        '{"event": "gpu unhealthy", "gpu": 1, "xid": 79}',
        "not json",
        '{"event": "gpu recovered", "gpu": 1}',
        '{"event": "serving"}',
    ]
    assert module.health_events(lines) == ["gpu unhealthy gpu=1", "gpu recovered gpu=1"]
