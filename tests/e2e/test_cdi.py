"""``nvplugin cdi generate`` and ``cdi check`` as a user runs them, and ``serve`` keeping its spec
true across a reload: real processes, real files."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from nvplugin.nodesession import load_topology
from tests.support.serve import kubelet_with, new_dir, run_nvplugin, run_serve
from tests.support.waiting import WAIT_S

MIG_NODE = "dgx-a100-mig"
MIG = load_topology(MIG_NODE)
NODE = "dgx-a100"
GPUS = load_topology(NODE).gpus
OURS = "k8s.device-plugin.nvidia.com-gpu.json"


def toolkit_spec_by_index(directory: str) -> str:
    """The container toolkit's spec as #1895 reports it: devices named by index only."""
    devices = [
        {
            "name": str(g.index),
            "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{g.index}"}]},
        }
        for g in GPUS
    ]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}})
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices}
    path = os.path.join(directory, "nvidia.yaml")
    Path(path).write_text(json.dumps(spec))  # JSON is YAML: the registry reads .yaml as YAML
    return path


def test_check_finds_a_toolkit_spec_with_index_names_while_the_plugin_returns_uuids() -> None:
    directory = new_dir()
    path = toolkit_spec_by_index(directory)
    args = ("--simulate", NODE, "--cdi-kind", "nvidia.com/gpu", "--spec-dir", directory)
    result = run_nvplugin("cdi", "check", *args, timeout=60)
    assert result.returncode == 1, result.stderr
    unresolved = [line for line in result.stdout.splitlines() if line.startswith("unresolved ")]
    assert unresolved == [f"unresolved nvidia.com/gpu={g.uuid}: no spec defines it" for g in GPUS]
    (fix,) = [line for line in result.stdout.splitlines() if line.startswith("fix: ")]
    assert f"the spec {path} of kind nvidia.com/gpu names devices by index only" in fix
    assert "set deviceIDStrategy to index" in fix
    assert "--device-name-strategy=uuid" in fix
    assert "nvplugin.cdi.kind k8s.device-plugin.nvidia.com/gpu" in fix
    assert f"{len(GPUS)} of {len(GPUS) + 1} CDI names do not resolve" in result.stderr
    # What it says to change, changed: every name resolves.
    index = run_nvplugin("cdi", "check", *args, "--device-id-strategy", "index", timeout=60)
    assert index.returncode == 0, index.stdout + index.stderr
    assert all(line.startswith("ok ") for line in index.stdout.splitlines())


def test_generate_then_check_and_a_stale_spec_is_named() -> None:
    directory = new_dir()
    spec_file = os.path.join(directory, OURS)
    made = run_nvplugin(
        "cdi",
        "generate",
        "--simulate",
        MIG_NODE,
        "--mig-strategy",
        "mixed",
        "--output",
        spec_file,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    spec = json.loads(Path(spec_file).read_text())
    migs = [m for g in MIG.gpus for m in g.mig_devices]
    assert [d["name"] for d in spec["devices"]][: len(migs)] == [m.uuid for m in migs]
    ok = run_nvplugin(
        "cdi",
        "check",
        "--simulate",
        MIG_NODE,
        "--mig-strategy",
        "mixed",
        "--spec-dir",
        directory,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The same spec after the node is served otherwise (whole GPUs: MIG strategy none).
    stale = run_nvplugin(
        "cdi",
        "check",
        "--simulate",
        MIG_NODE,
        "--mig-strategy",
        "none",
        "--spec-dir",
        directory,
        timeout=60,
    )
    assert stale.returncode == 1
    assert f"unresolved k8s.device-plugin.nvidia.com/gpu={MIG.gpus[0].uuid}" in stale.stdout
    assert "reload or restart nvplugin serve, which writes it again" in stale.stdout
    # stdout is the spec itself with --output -.
    printed = run_nvplugin("cdi", "generate", "--simulate", NODE, timeout=60)
    assert json.loads(printed.stdout)["kind"] == "k8s.device-plugin.nvidia.com/gpu"


def test_serve_rewrites_the_spec_before_the_kubelet_sees_the_new_devices() -> None:
    async def body() -> None:
        directory = new_dir()
        specs = new_dir()
        config = os.path.join(new_dir(), "nvplugin.yaml")
        Path(config).write_text("version: v1\nflags:\n  migStrategy: none\n")
        args = ("--simulate", MIG_NODE, "--config", config, "--device-list-strategy", "cdi-cri")
        spec_file = os.path.join(specs, OURS)

        def names() -> set[str]:
            return {d["name"] for d in json.loads(Path(spec_file).read_text())["devices"]}

        async with kubelet_with(directory, *args, "--cdi-spec-dir", specs) as (kubelet, serve):
            await kubelet.wait_registered("nvidia.com/gpu", WAIT_S)
            assert names() == {g.uuid for g in MIG.gpus} | {"all"}
            others = set(os.listdir(specs)) - {OURS}
            assert others == set()  # nothing of its own beside the spec
            Path(config).write_text("version: v1\nflags:\n  migStrategy: mixed\n")
            seen: list[set[str]] = []

            def mig_listed(m: object) -> bool:
                listed = kubelet.devices.devices("nvidia.com/mig-3g.20gb")
                if listed and not seen:
                    seen.append(names())  # what the spec said when the kubelet saw them
                return bool(listed)

            serve.send(signal.SIGHUP)
            await kubelet.observer.wait_for(mig_listed, WAIT_S, "the MIG devices after SIGHUP")
            migs = {m.uuid for g in MIG.gpus for m in g.mig_devices}
            assert migs <= seen[0]
            # In the plugin's own order: the new spec written, then the MIG resource registered.
            events = [(line.get("event"), str(line.get("endpoint"))) for line in serve.lines()]
            written = [n for n, (event, _) in enumerate(events) if event == "CDI spec written"]
            registered = [
                n
                for n, (event, endpoint) in enumerate(events)
                if event == "registered with kubelet" and "mig-3g.20gb" in endpoint
            ]
            assert len(written) == 2 and registered and written[1] < registered[0]
            medium = MIG.gpus[3].mig_devices[1]
            response = await kubelet.devices.allocate("nvidia.com/mig-3g.20gb", [medium.uuid])
            (name,) = [d.name for d in response.cdi_devices]
            assert name.partition("=")[2] in names()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_serve_fails_naming_the_spec_it_cannot_write() -> None:
    """The spec comes before registering: a spec directory that cannot be made (under a regular
    file) fails the start, exit 1, naming the spec's path; nothing is registered."""
    directory = new_dir()
    blocker = os.path.join(new_dir(), "not-a-directory")
    Path(blocker).write_text("")
    result = run_serve(
        "--simulate",
        NODE,
        "--device-list-strategy",
        "cdi-cri",
        "--cdi-spec-dir",
        blocker,
        "--device-plugin-dir",
        directory,
    )
    assert result.returncode == 1, result.stderr
    assert f"cannot write the CDI spec {blocker}/{OURS}" in result.stderr
    assert not [n for n in os.listdir(directory) if n.endswith(".sock")]


def test_devices_shows_each_served_devices_cdi_name() -> None:
    directory = new_dir()
    config = os.path.join(directory, "cdi.yaml")
    Path(config).write_text(
        "version: v1\nflags:\n  migStrategy: mixed\n  plugin:\n"
        "    deviceListStrategy: cdi-cri\n    deviceIDStrategy: index\n"
    )
    table = run_nvplugin("devices", "--simulate", MIG_NODE, "--config", config, timeout=60)
    assert table.returncode == 0, table.stderr
    assert "k8s.device-plugin.nvidia.com/gpu=3:1" in table.stdout.split("CDI NAME")[1]
    listed = run_nvplugin(
        "devices", "--simulate", MIG_NODE, "--config", config, "--output", "json", timeout=60
    )
    cdi = json.loads(listed.stdout)["cdi"]
    assert cdi["3:1"] == "k8s.device-plugin.nvidia.com/gpu=3:1"
    assert cdi["6"] == "k8s.device-plugin.nvidia.com/gpu=6"
    assert "0" not in cdi  # a MIG-enabled GPU is served as its MIG devices only
