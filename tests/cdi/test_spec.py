"""The CDI spec of every built-in node under every way of serving it: valid by CDI's schema and
rules, at the least version its fields need, and every ID every Allocate returns resolving to
exactly one device of the written spec, whose nodes are that device's."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvplugin.cdi.generate import generate, qualified_names
from nvplugin.cdi.registry import load
from nvplugin.cdi.spec import ALL
from nvplugin.cdi.validate import minimum_version, problems
from nvplugin.cdi.writer import write_spec
from nvplugin.config import Config, load_config
from nvplugin.node.mig import caps_device
from nvplugin.nodesession import NodeSession, builtin_names, open_node
from nvplugin.rm import make_responder, plan_for
from nvplugin.rm.devices import Device
from tests.support.migplans import HOMOGENEOUS
from tests.support.service import write_config

TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/gpu, replicas: 4}
"""
MPS = """\
version: v1
sharing:
  mps:
    resources:
    - {name: nvidia.com/gpu, replicas: 2}
"""


def config(text: str = "version: v1\n", **flags: str) -> Config:
    path = write_config(text)
    return load_config(path, flags=dict(flags), env={})


@pytest.fixture(scope="module")
def homogeneous() -> Iterator[str]:
    directory = tempfile.mkdtemp()
    path = os.path.join(directory, "a100-3g.yaml")
    Path(path).write_text(HOMOGENEOUS)
    yield path


CASES = [
    *[(name, {}, "") for name in builtin_names()],
    ("dgx-a100", {"flags.plugin.deviceIDStrategy": "index"}, ""),
    ("dgx-a100-mig", {"flags.migStrategy": "mixed"}, ""),
    ("dgx-a100-mig", {"flags.migStrategy": "mixed", "flags.plugin.deviceIDStrategy": "index"}, ""),
    ("HOMOGENEOUS", {"flags.migStrategy": "single"}, ""),
    ("HOMOGENEOUS", {"flags.migStrategy": "single", "flags.plugin.deviceIDStrategy": "index"}, ""),
    ("dgx-1", {}, TIME_SLICING),
    ("dgx-1", {"flags.plugin.deviceIDStrategy": "index"}, TIME_SLICING),
    ("mixed-a100-t4", {}, MPS),
    ("dgx-a100-mig", {"flags.migStrategy": "mixed"}, TIME_SLICING),
]


def expected_nodes(device: Device) -> list[str]:
    nodes = [f"/dev/nvidia{device.gpu.minor}"]
    if device.mig is not None:
        assert device.mig.caps is not None
        nodes += [caps_device(device.mig.caps.gpu_instance)]
        nodes += [caps_device(device.mig.caps.compute_instance)]
    return nodes


def _check_node(node: NodeSession, cfg: Config) -> None:
    plan = plan_for(cfg, node.topology.gpus)
    made = generate(cfg, plan, node.topology, node.scan.driver.version, node.driver_root)
    spec = made.spec
    assert made.missing == ()
    assert problems(spec) == []
    assert spec["cdiVersion"] == minimum_version(spec) == "0.5.0"  # device node hostPath
    assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu"
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec["containerEdits"]["env"]
    directory = tempfile.mkdtemp()
    write_spec(directory, cfg.cdi_kind, spec)
    registry = load([directory])
    assert registry.errors == [] and registry.conflicts == {}
    # One device per name Allocate can return, plus all; nothing else.
    assert sorted(registry.devices) == sorted(qualified_names(cfg, plan))
    responder = make_responder(
        ("cdi-annotations", "cdi-cri"), cfg.device_id_strategy, cdi_kind=cfg.cdi_kind
    )
    every: set[str] = set()
    for served in plan.resources:
        for device in served.devices:  # every replica and MPS share, one container each
            response = responder.container_response([device])
            names = [d.name for d in response.cdi_devices]
            assert list(response.annotations.values()) == [",".join(names)]
            (name,) = names
            entry = registry.resolve(name)
            assert entry is not None, name
            assert entry.nodes == expected_nodes(device), name
            every.update(expected_nodes(device))
        # One container with all of them: each name resolves to its own device.
        response = responder.container_response(list(served.devices))
        for got in response.cdi_devices:
            assert registry.resolve(got.name) is not None, got.name
    everything = registry.resolve(f"{cfg.cdi_kind}={ALL}")
    assert everything is not None and set(everything.nodes) == every


@pytest.mark.parametrize(("node", "flags", "text"), CASES)
def test_the_spec_is_valid_and_every_allocated_id_resolves(
    node: str, flags: dict[str, str], text: str, homogeneous: str
) -> None:
    cfg = config(text or "version: v1\n", **flags)
    with open_node(homogeneous if node == "HOMOGENEOUS" else node) as session:
        _check_node(session, cfg)


def test_common_edits_carry_the_driver_files_and_hooks() -> None:
    cfg = config()
    with open_node("dgx-a100") as node:
        plan = plan_for(cfg, node.topology.gpus)
        spec = generate(cfg, plan, node.topology, "550.127.05", node.driver_root).spec
    edits = spec["containerEdits"]
    nodes = {n["path"]: n for n in edits["deviceNodes"]}
    assert nodes["/dev/nvidiactl"] == {
        "path": "/dev/nvidiactl",
        "hostPath": "/dev/nvidiactl",
        "type": "c",
        "major": 195,
        "minor": 255,
        "permissions": "rw",
    }
    assert (nodes["/dev/nvidia-uvm"]["major"], nodes["/dev/nvidia-uvm"]["minor"]) == (508, 0)
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.127.05"
    assert mounts[lib]["hostPath"] == lib and "ro" in mounts[lib]["options"]
    assert "/usr/bin/nvidia-smi" in mounts
    assert "/lib/firmware/nvidia/550.127.05/gsp_ga10x.bin" in mounts
    assert "noexec" in mounts["/run/nvidia-persistenced/socket"]["options"]
    # The hook (nvidia-ctk, the default path) links the sonames and updates the cache.
    hooks = edits["hooks"]
    assert [h["args"][:3] for h in hooks] == [
        ["nvidia-ctk", "hook", "create-symlinks"],
        ["nvidia-ctk", "hook", "update-ldcache"],
    ]
    assert "libcuda.so.550.127.05::/usr/lib/x86_64-linux-gnu/libcuda.so.1" in hooks[0]["args"]


def test_host_paths_follow_the_driver_and_dev_roots() -> None:
    """NVIDIA's nvidiaDriverRoot and nvidiaDevRoot: the host's roots the spec's host paths are
    written under; container paths stay as under the driver root."""
    cfg = config(**{"flags.nvidiaDriverRoot": "/run/nvidia/driver", "flags.nvidiaDevRoot": "/"})
    with open_node("dgx-a100") as node:
        plan = plan_for(cfg, node.topology.gpus)
        spec = generate(cfg, plan, node.topology, "550.127.05", node.driver_root).spec
    mount = spec["containerEdits"]["mounts"][0]
    assert mount["hostPath"].startswith("/run/nvidia/driver/usr/lib/")
    assert mount["containerPath"].startswith("/usr/lib/")
    node0 = spec["devices"][0]["containerEdits"]["deviceNodes"][0]
    assert (node0["path"], node0["hostPath"]) == ("/dev/nvidia0", "/dev/nvidia0")


def test_without_the_hook_the_sonames_are_mounted_instead() -> None:
    cfg = config(**{"flags.plugin.nvidiaCTKPath": "/usr/bin/no-such-hook"})
    with open_node("dgx-a100") as node:
        plan = plan_for(cfg, node.topology.gpus)
        spec = generate(cfg, plan, node.topology, "550.127.05", node.driver_root).spec
    edits = spec["containerEdits"]
    assert "hooks" not in edits
    paths = {m["containerPath"] for m in edits["mounts"]}
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in paths
    assert problems(spec) == []


def test_the_cdi_hook_is_named_as_nvidia_cdi_hook() -> None:
    cfg = config(**{"flags.plugin.nvidiaCTKPath": "/usr/bin/nvidia-cdi-hook"})
    with open_node("dgx-a100") as node:
        plan = plan_for(cfg, node.topology.gpus)
        spec = generate(cfg, plan, node.topology, "550.127.05", node.driver_root).spec
    hooks = spec["containerEdits"]["hooks"]
    assert [h["args"][:2] for h in hooks] == [
        ["nvidia-cdi-hook", "create-symlinks"],
        ["nvidia-cdi-hook", "update-ldcache"],
    ]
    assert all(h["hookName"] == "createContainer" for h in hooks)


def test_a_missing_device_node_or_library_is_named() -> None:
    cfg = config()
    with open_node("dgx-a100") as node:
        root = node.driver_root
        assert root is not None
        os.unlink(os.path.join(root, "dev", "nvidia3"))
        os.unlink(os.path.join(root, "usr/lib/x86_64-linux-gnu/libcuda.so.550.127.05"))
        plan = plan_for(cfg, node.topology.gpus)
        made = generate(cfg, plan, node.topology, "550.127.05", root)
    assert made.missing == (
        f"device node {root}/dev/nvidia3",
        f"library libcuda.so.<driver version> under {root} "
        "(usr/lib64, usr/lib/x86_64-linux-gnu, usr/lib/aarch64-linux-gnu, ...)",
    )
