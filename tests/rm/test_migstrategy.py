"""migStrategy none / single / mixed over discovered nodes, as NVIDIA's plugin defines them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nvplugin.errors import InputError
from nvplugin.node.mig import MIG_MODELS
from nvplugin.node.model import Gpu, Topology
from nvplugin.nodefile.reader import load_node, parse_node
from nvplugin.nodesession import load_topology
from nvplugin.resourcenames import resource_name_problem
from nvplugin.rm.devices import Device
from nvplugin.rm.migstrategy import (
    MIG_STRATEGIES,
    apply_strategy,
    check_strategy,
    mixed_resource_name,
)
from nvplugin.rm.responses import device_id

MIXED = load_node("dgx-a100-mig").topology()


def _with_mig(layouts: list[str | None]) -> Topology:
    """The DGX A100 with ``layouts[i]`` as GPU i's ``mig`` value (None: no key)."""
    text = (Path(__file__).parents[2] / "nvplugin/nodefile/nodes/dgx-a100.yaml").read_text()
    lines = []
    gpu = 0
    for line in text.splitlines():
        if line.startswith("  - {name: NVIDIA A100") and line.endswith("}"):
            layout = layouts[gpu]
            gpu += 1
            if layout is not None:
                line = f"{line[:-1]}, mig: {layout}}}"
        lines.append(line)
    return parse_node("\n".join(lines), "test").topology()


ALL_1G = _with_mig(["[" + ", ".join(["1g.5gb"] * 7) + "]"] * 8)


def test_strategy_names_are_nvidias() -> None:
    assert MIG_STRATEGIES == ("none", "single", "mixed")
    with pytest.raises(InputError, match="migStrategy 'Mixed' is not one of none, single, mixed"):
        check_strategy("Mixed")


def test_none_serves_every_gpu_whole_and_warns_about_mig_ones() -> None:
    layout = apply_strategy(MIXED.gpus, "none")
    assert layout.gpus == MIXED.gpus and layout.mig == ()
    assert [re.findall(r"^GPU (\d+) ", w) for w in layout.warnings] == [[str(i)] for i in range(6)]
    assert apply_strategy(load_node("dgx-a100").topology().gpus, "none").warnings == ()


def test_mixed_serves_one_resource_per_profile_beside_whole_gpus() -> None:
    layout = apply_strategy(MIXED.gpus, "mixed")
    assert [g.index for g in layout.gpus] == [6, 7]
    counts = {name: len(devices) for name, devices in layout.mig}
    assert counts == {
        "nvidia.com/mig-1g.5gb": 16,
        "nvidia.com/mig-3g.20gb": 3,
        "nvidia.com/mig-2g.10gb": 3,
        "nvidia.com/mig-1g.10gb": 1,
        "nvidia.com/mig-1g.5gb.me": 1,
    }
    assert list(counts) == [name for name, _ in layout.mig]  # by each resource's first device
    ones = layout.resource("nvidia.com/mig-1g.5gb")
    assert [d.mig.label for d in ones][-3:] == ["1:6", "2:2", "2:3"]
    assert {d.numa_node for d in ones} == {3, 1}
    assert all(d.numa_node == d.gpu.numa_node for _, ds in layout.mig for d in ds)
    (warning,) = layout.warnings
    assert warning.startswith("GPU 5 (NVIDIA A100-SXM4-40GB) has MIG enabled but no MIG devices")


def test_mixed_names_take_the_gpu_resources_domain_and_are_valid() -> None:
    layout = apply_strategy(MIXED.gpus, "mixed", resource_name="example.com/gpu")
    assert "example.com/mig-1g.5gb.me" in [name for name, _ in layout.mig]
    for model in MIG_MODELS:
        for profile in model.profiles:
            name = mixed_resource_name(profile.name)
            assert resource_name_problem(name) is None, name
    assert mixed_resource_name("1c.3g.20gb+me") == "nvidia.com/mig-1c.3g.20gb.me"


def test_single_serves_a_homogeneous_node_as_the_gpu_resource() -> None:
    layout = apply_strategy(ALL_1G.gpus, "single")
    assert layout.gpus == () and layout.warnings == ()
    ((name, devices),) = layout.mig
    assert name == "nvidia.com/gpu" and len(devices) == 56
    assert [d.mig.label for d in devices[:8]] == [f"0:{i}" for i in range(7)] + ["1:0"]
    custom = apply_strategy(ALL_1G.gpus, "single", resource_name="example.com/mig")
    assert custom.mig[0][0] == "example.com/mig"


def test_single_without_mig_serves_whole_gpus_with_a_warning() -> None:
    plain = load_node("dgx-a100").topology()
    layout = apply_strategy(plain.gpus, "single")
    assert layout.gpus == plain.gpus and layout.mig == ()
    assert layout.warnings == (
        "migStrategy is single but no GPU has MIG enabled: whole GPUs are served",
    )


@pytest.mark.parametrize(
    ("layouts", "problems", "gpus"),
    [
        (
            None,  # the built-in mixed layout
            "5 MIG profiles (1g.10gb, 1g.5gb, 1g.5gb+me, 2g.10gb, 3g.20gb) and 1 GPU with MIG "
            "on but no MIG devices and 2 GPUs with MIG off",
            "GPU 0-1: 1g.5gb x7; GPU 2: 3g.20gb, 2g.10gb, 1g.5gb x2; GPU 3: 3g.20gb x2; GPU 4: "
            "2g.10gb x2, 1g.10gb, 1g.5gb+me; GPU 5: MIG on, no MIG devices; GPU 6-7: MIG off",
        ),
        (
            ["[1g.5gb]"] * 7 + [None],
            "1 GPU with MIG off",
            "GPU 0-6: 1g.5gb; GPU 7: MIG off",
        ),
        (
            ["[1g.5gb]"] * 7 + ["[]"],
            "1 GPU with MIG on but no MIG devices",
            "GPU 0-6: 1g.5gb; GPU 7: MIG on, no MIG devices",
        ),
        (
            ["[1g.5gb]"] * 7 + ["[1g.5gb+me]"],
            "2 MIG profiles (1g.5gb, 1g.5gb+me)",
            "GPU 0-6: 1g.5gb; GPU 7: 1g.5gb+me",
        ),
    ],
)
def test_single_refuses_other_layouts_naming_gpus_and_profiles(
    layouts: list[str | None] | None, problems: str, gpus: str
) -> None:
    topology = MIXED if layouts is None else _with_mig(layouts)
    with pytest.raises(InputError) as caught:
        apply_strategy(topology.gpus, "single")
    message = str(caught.value)
    assert message.startswith(
        "migStrategy single needs every GPU in MIG mode with MIG devices of one and the same "
        f"profile, but this node has {problems}: {gpus}. Use migStrategy mixed"
    )


def test_single_message_stays_short_on_a_large_node() -> None:
    gpus = [
        Gpu(i, f"GPU-{i}", "NVIDIA A100-SXM4-40GB", 40960, f"0:{i}", i, 0, i % 2 == 0, ())
        for i in range(128)
    ]
    with pytest.raises(InputError) as caught:
        apply_strategy(gpus, "single")
    assert len(str(caught.value)) <= 2100


def test_device_ids_are_mig_uuids_or_nvidias_index_form() -> None:
    served = apply_strategy(MIXED.gpus, "mixed").resource("nvidia.com/mig-3g.20gb")
    devices = served
    assert [device_id(d, "index") for d in devices] == ["2:0", "3:0", "3:1"]
    assert [device_id(d, "uuid") for d in devices] == [d.mig.uuid for d in served]
    assert all(isinstance(d, Device) and d.mig.uuid.startswith("MIG-") for d in served)
    assert [d.numa_node for d in served] == [1, 1, 1]


def test_strategies_agree_with_discovery() -> None:
    """The layout of the discovered node is the layout of the node file."""
    discovered = load_topology("dgx-a100-mig")
    for strategy in ("none", "mixed"):
        assert apply_strategy(discovered.gpus, strategy) == apply_strategy(MIXED.gpus, strategy)
