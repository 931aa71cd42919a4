"""One command for a machine with an NVIDIA driver (``make gpu-check``): capture the node, make
the CDI spec from the real driver root, check every name resolves, serve the real NVML to the
fake kubelet for a few seconds, and print a short report.

Every step runs the real ``nvplugin`` commands as child processes. ``--simulate NODE`` runs the
same steps on a simulated node, so the script is tested on machines without a GPU; on a GPU
machine leave it out. Exit 1 when a step fails (the report says which); the work directory
(``--out``) keeps the node file, the spec and the plugin's log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPEC_NAME = "k8s.device-plugin.nvidia.com-gpu.json"
HEALTH_EVENTS = ("gpu unhealthy", "gpu recovered", "all gpus unhealthy")
REGISTER_S = 60.0


def registered(devices: Any) -> bool:
    """Every resource the fake kubelet heard of is registered (and there is one)."""
    return bool(devices.resources()) and all(devices.is_registered(r) for r in devices.resources())


@dataclass
class Step:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class Report:
    steps: list[Step] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(step.ok for step in self.steps)

    def text(self) -> str:
        out = ["nvplugin gpu-check", *self.lines, "", "steps:"]
        for step in self.steps:
            mark = "ok  " if step.ok else "FAIL"
            out.append(f"  {mark} {step.name:<10} {step.seconds:7.2f}s  {step.detail}".rstrip())
        out.append("result: " + ("ok" if self.ok else "FAILED"))
        return "\n".join(out) + "\n"


def nvplugin(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")},
    )


def node_args(simulate: str | None) -> list[str]:
    """Where the node comes from: a simulated node, or the real driver installed at ``/``."""
    return ["--simulate", simulate] if simulate else []


def driver_args(simulate: str | None) -> list[str]:
    """On a host (no plugin container) the driver root is seen at ``/``."""
    return [] if simulate else ["--container-driver-root", "/", "--nvidia-driver-root", "/"]


def topology_summary(topology: dict[str, Any]) -> list[str]:
    """Devices, links and NUMA nodes of ``nvplugin topo --output json``."""
    gpus = topology.get("gpus", [])
    models: dict[str, int] = {}
    for gpu in gpus:
        models[gpu["name"]] = models.get(gpu["name"], 0) + 1
    migs = sum(len((gpu.get("mig") or {}).get("devices", [])) for gpu in gpus)
    numa = sorted({str(gpu["numa_node"]) for gpu in gpus}, key=lambda n: (len(n), n))
    links: dict[str, int] = {}
    for pair in topology.get("pairs", []):
        kind = f"NV{pair['nvlinks']}" if pair.get("nvlinks") else str(pair.get("pcie", "?"))
        links[kind] = links.get(kind, 0) + 1
    return [
        f"devices: {len(gpus)} GPU(s) ("
        + ", ".join(f"{count}x {name}" for name, count in models.items())
        + f"), {migs} MIG device(s)",
        "links (GPU pairs): "
        + (", ".join(f"{n}x {k}" for k, n in sorted(links.items())) or "none"),
        "numa: GPUs on node(s) " + ", ".join(numa),
    ]


def spec_summary(spec: dict[str, Any]) -> str:
    """One line: version, kind, devices, and what every container gets."""
    edits = spec.get("containerEdits", {})
    hooks = [" ".join(h["args"][:3]) for h in edits.get("hooks", [])]
    return (
        f"spec: CDI {spec.get('cdiVersion')} kind {spec.get('kind')}, "
        f"{len(spec.get('devices', []))} devices (all included), "
        f"{len(edits.get('deviceNodes', []))} control nodes, {len(edits.get('mounts', []))} "
        f"mounts, hooks: {', '.join(hooks) or 'none (no nvidia-cdi-hook)'}"
    )


def health_events(log_lines: Sequence[str]) -> list[str]:
    """The health events of a plugin's JSON log: one ``event gpu=N`` string each."""
    events = []
    for line in log_lines:
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("event") in HEALTH_EVENTS:
            gpu = entry.get("gpu")
            events.append(entry["event"] + ("" if gpu is None else f" gpu={gpu}"))
    return events


def timed(report: Report, name: str, run: Any) -> Any:
    start = time.monotonic()
    try:
        ok, detail, value = run()
    except Exception as exc:  # a step's failure is reported, the next steps still run
        ok, detail, value = False, f"{type(exc).__name__}: {exc}", None
    report.steps.append(Step(name, ok, time.monotonic() - start, detail))
    return value


def _command(result: subprocess.CompletedProcess[str]) -> tuple[bool, str]:
    tail = (result.stderr.strip().splitlines() or [""])[-1]
    return result.returncode == 0, "" if result.returncode == 0 else tail


async def _serve(simulate: str | None, out: Path, seconds: float) -> tuple[bool, str, list[str]]:
    directory = tempfile.mkdtemp(prefix="nvplugin-gpucheck-", dir="/tmp")  # short: sockets
    try:
        return await _serve_in(directory, simulate, out, seconds)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _serve_in(
    directory: str, simulate: str | None, out: Path, seconds: float
) -> tuple[bool, str, list[str]]:
    from nvplugin.admit.process import PluginProcess, plugin_environment
    from nvplugin.fakekubelet.kubelet import FakeKubelet

    args = [
        *node_args(simulate),
        *driver_args(simulate),
        "--device-list-strategy",
        "envvar,cdi-cri",
        "--cdi-spec-dir",
        str(out / "served-spec"),
    ]
    async with FakeKubelet(directory) as kubelet:
        serve = PluginProcess(
            directory, *args, env=plugin_environment(), log_path=str(out / "serve.log")
        )
        try:
            deadline = time.monotonic() + REGISTER_S
            while not registered(kubelet.devices):
                if not serve.alive or time.monotonic() > deadline:
                    detail = serve.error() or f"no registration within {REGISTER_S:g}s"
                    return False, detail, serve.text().splitlines()
                with contextlib.suppress(TimeoutError):  # re-checks whether it still runs
                    await kubelet.observer.wait_for(registered, 0.5, "a registration")
            resources = kubelet.devices.resources()
            await asyncio.sleep(seconds)  # health events arrive in their own time
            healthy = {r: len(kubelet.devices.healthy_devices(r)) for r in resources}
        finally:
            if serve.alive:
                serve.send(signal.SIGTERM)
            code = await asyncio.to_thread(serve.wait, 30)
    listed = ", ".join(f"{r}: {n} healthy" for r, n in healthy.items())
    return code == 0, f"{listed}; exit {code}", serve.text().splitlines()


def check(simulate: str | None, out: Path, serve_s: float) -> Report:
    report = Report()
    out.mkdir(parents=True, exist_ok=True)
    node_file = out / "node.yaml"

    def capture() -> tuple[bool, str, None]:
        ok, detail = _command(
            nvplugin("node", "capture", *node_args(simulate), "-o", str(node_file))
        )
        return ok, detail or str(node_file), None

    timed(report, "capture", capture)

    def topology() -> tuple[bool, str, dict[str, Any] | None]:
        result = nvplugin("topo", *node_args(simulate), "--output", "json")
        ok, detail = _command(result)
        return ok, detail, json.loads(result.stdout) if ok else None

    topo = timed(report, "topology", topology)
    if topo is not None:
        report.lines += topology_summary(topo)
    specs = out / "cdi"
    specs.mkdir(exist_ok=True)
    spec_file = specs / SPEC_NAME

    def generate() -> tuple[bool, str, dict[str, Any] | None]:
        result = nvplugin(
            "cdi",
            "generate",
            *node_args(simulate),
            *driver_args(simulate),
            "--output",
            str(spec_file),
        )
        ok, detail = _command(result)
        return ok, detail or str(spec_file), json.loads(spec_file.read_text()) if ok else None

    spec = timed(report, "generate", generate)
    if spec is not None:
        report.lines.append(spec_summary(spec))

    def cdi_check() -> tuple[bool, str, None]:
        result = nvplugin("cdi", "check", *node_args(simulate), "--spec-dir", str(specs))
        resolved = sum(line.startswith("ok ") for line in result.stdout.splitlines())
        fixes = [line for line in result.stdout.splitlines() if line.startswith("fix: ")]
        return result.returncode == 0, f"{resolved} names resolve; " + "; ".join(fixes), None

    timed(report, "cdi check", cdi_check)

    def serve() -> tuple[bool, str, list[str]]:
        return asyncio.run(_serve(simulate, out, serve_s))

    log = timed(report, "serve", serve) or []
    events = health_events(log)
    report.lines.append(
        f"health events seen in {serve_s:g}s: {len(events)}"
        + (f" ({', '.join(events)})" if events else "")
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", metavar="NODE", help="a simulated node (no GPU needed)")
    parser.add_argument("--out", metavar="DIR", help="work directory (default: a new one in /tmp)")
    parser.add_argument("--serve-s", type=float, default=5.0, help="how long to serve (s)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="nvplugin-gpu-check-", dir="/tmp"))
    report = check(args.simulate, out, args.serve_s)
    report.lines.append(f"work directory: {out}")
    sys.stdout.write(report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
