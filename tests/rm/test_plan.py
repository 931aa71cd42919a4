"""Resources by GPU model or UUID: first matching pattern wins, the rest stay the default
resource, exclusions hide GPUs from every resource, empty resources are not served, warnings for
config parts that do nothing on the node, errors naming the key; and ``nvplugin devices --config``
showing it all."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nvplugin.config import Config, load_config
from nvplugin.errors import InputError
from nvplugin.nodesession import load_topology
from nvplugin.rm import ResourcePlan, plan_resources
from tests.support.service import write_config

MIXED = load_topology("mixed-a100-t4")  # A100 0,1,4,5; T4 2,3,6,7
A100 = [0, 1, 4, 5]
T4 = [2, 3, 6, 7]


def plan_of(config: Config) -> ResourcePlan:
    return plan_resources(MIXED.gpus, config.resource_name, config.resources, config.sharing)


def config_of(text: str) -> Config:
    return load_config(write_config("version: v1\n" + text))


def served(plan: ResourcePlan) -> dict[str, list[int]]:
    return {r.name: [g.index for g in r.gpus] for r in plan.resources}


def test_default_is_one_resource_with_every_gpu() -> None:
    plan = plan_of(load_config(None))
    assert served(plan) == {"nvidia.com/gpu": list(range(8))}
    assert plan.empty == () and plan.warnings == ()
    assert plan.resources[0].socket == "nvplugin-gpu.sock"


def test_two_models_two_resources_first_match_wins() -> None:
    config = config_of(
        "resources:\n  gpus:\n"
        "    - {pattern: '*a100*', name: a100}\n"  # case-insensitive
        "    - {pattern: 'NVIDIA *', name: nvidia-any}\n"  # also matches the A100s: too late
    )
    plan = plan_of(config)
    assert served(plan) == {"nvidia.com/a100": A100, "nvidia.com/gpu": T4}
    assert [r.socket for r in plan.resources] == ["nvplugin-a100.sock", "nvplugin-gpu.sock"]
    assert plan.empty == ("nvidia.com/nvidia-any",)
    assert plan.warnings == (
        "resources.gpus[1].pattern 'NVIDIA *' matches only GPUs an earlier pattern already took",
    )
    assert plan.assignment == {
        i: "nvidia.com/a100" if i in A100 else "nvidia.com/gpu" for i in range(8)
    }


def test_every_gpu_mapped_leaves_the_default_resource_empty() -> None:
    plan = plan_of(
        config_of(
            "resources:\n  gpus:\n    - {pattern: '*A100*', name: a100}\n"
            "    - {pattern: 'Tesla T?', name: example.org/t4}\n"
        )
    )
    assert served(plan) == {"nvidia.com/a100": A100, "example.org/t4": T4}
    assert plan.empty == ("nvidia.com/gpu",)  # not served, not registered


def test_exclude_by_uuid_and_model_hides_from_every_resource() -> None:
    config = config_of(
        "resources:\n  gpus:\n    - {pattern: '*A100*', name: a100}\n"
        f"  exclude:\n    uuids: [{MIXED.gpus[4].uuid}, GPU-not-on-this-node]\n"
        "    models: ['Tesla T4', 'NVIDIA H100*']\n"
    )
    plan = plan_of(config)
    assert served(plan) == {"nvidia.com/a100": [0, 1, 5]}
    assert [i for i, name in plan.assignment.items() if name is None] == [2, 3, 4, 6, 7]
    assert plan.empty == ("nvidia.com/gpu",)
    assert plan.warnings == (
        "resources.exclude.uuids[1] GPU-not-on-this-node is not a GPU or MIG device on this node",
        "resources.exclude.models[1] 'NVIDIA H100*' matches no GPU on this node "
        "(models: NVIDIA A100 80GB PCIe, Tesla T4)",
    )


def test_pattern_matching_nothing_is_a_warning_not_an_error() -> None:
    plan = plan_of(config_of("resources:\n  gpus:\n    - {pattern: '*H100*', name: h100}\n"))
    assert served(plan) == {"nvidia.com/gpu": list(range(8))}
    assert plan.empty == ("nvidia.com/h100",)
    assert plan.warnings == (
        "resources.gpus[0].pattern '*H100*' matches no GPU on this node "
        "(models: NVIDIA A100 80GB PCIe, Tesla T4)",
    )


def test_time_slicing_one_model_only() -> None:
    config = config_of(
        "resources:\n  gpus:\n    - {pattern: '*T4*', name: t4}\n"
        "sharing:\n  timeSlicing:\n    renameByDefault: true\n"
        "    resources:\n      - {name: t4, replicas: 3}\n"
    )
    plan = plan_of(config)
    assert served(plan) == {"nvidia.com/gpu": A100, "nvidia.com/t4.shared": T4}
    shared = plan.resource("nvidia.com/t4.shared")
    assert shared is not None and shared.replicas.count == 3 and shared.base == "nvidia.com/t4"
    assert shared.socket == "nvplugin-t4.shared.sock"
    assert plan.labels()[2] == "nvidia.com/t4.shared x3 (<uuid>::0..2)"
    assert plan.labels()[0] == "nvidia.com/gpu"
    assert plan.empty == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "resources:\n  gpus:\n    - {pattern: '*A100*', name: A100 80GB}\n",
            'key "resources.gpus[0].name": the ResourceName "nvidia.com/A100 80GB" is invalid',
        ),
        (
            "resources:\n  gpus:\n    - {pattern: '*A100*', name: kubernetes.io/a100}\n",
            'key "resources.gpus[0].name": the ResourceName "kubernetes.io/a100" is invalid',
        ),
        (
            "resources:\n  gpus:\n    - {pattern: '*T4*', name: example.com/gpu}\n",
            'key "resources.gpus[0].name": example.com/gpu would be served on the same socket '
            "nvplugin-gpu.sock as the resource from nvplugin.resourceName",
        ),
        (
            "resources:\n  gpus:\n    - {pattern: '*A100*'}\n",
            'key "resources.gpus[0].name": is missing',
        ),
        (
            "resources:\n  gpus:\n    - {pattern: '*A100*', name: a100, model: x}\n",
            'key "resources.gpus[0]": unknown key "model"; valid keys here: pattern, name',
        ),
        (
            "resources:\n  gpus:\n    - {pattern: 7, name: a100}\n",
            'key "resources.gpus[0].pattern": expected a string, got 7',
        ),
        ("resources:\n  gpus: {pattern: x}\n", 'key "resources.gpus": expected a list'),
        (
            "resources:\n  exclude:\n    uuids: [GPU-1, 2]\n",
            'key "resources.exclude.uuids[1]": expected a string, got 2',
        ),
        (
            "resources:\n  exclude:\n    serials: []\n",
            'unknown key "resources.exclude.serials"; valid keys here: uuids, models',
        ),
        ("resources:\n  migs: []\n", 'unknown key "resources.migs"; did you mean "resources.mig"?'),
    ],
)
def test_bad_resource_config_names_the_key_path(text: str, expected: str) -> None:
    with pytest.raises(InputError) as caught:
        config_of(text)
    assert caught.value.exit_code == 2
    assert expected in str(caught.value)


def test_effective_config_shows_resolved_names() -> None:
    config = config_of("resources:\n  gpus:\n    - {pattern: '*A100*', name: a100}\n")
    assert config.as_dict()["resources"] == {
        "gpus": [{"pattern": "*A100*", "name": "nvidia.com/a100"}],
        "mig": [],
        "exclude": {"uuids": [], "models": []},
    }


# --- nvplugin devices --config -----------------------------------------------------------------


def devices(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", "devices", "--simulate", "mixed-a100-t4", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


CLI_CONFIG = f"""\
version: v1
resources:
  gpus:
    - {{pattern: "*A100*", name: a100}}
    - {{pattern: "*H100*", name: h100}}
  exclude:
    uuids: [{MIXED.gpus[7].uuid}]
sharing:
  timeSlicing:
    resources:
      - {{name: gpu, replicas: 4, rename: t4-shared}}
"""


@pytest.mark.process
def test_devices_table_shows_each_gpus_resource() -> None:
    result = devices("--config", write_config(CLI_CONFIG))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[-1] == "RESOURCE"
    by_index = {int(line.split()[0]): line for line in lines[1:]}
    assert sorted(by_index) == list(range(8))
    for index in A100:
        assert by_index[index].endswith("  nvidia.com/a100")
    for index in (2, 3, 6):
        assert by_index[index].endswith("  nvidia.com/t4-shared x4 (<uuid>::0..3)")
    assert by_index[7].endswith("  (excluded)")
    assert result.stderr == (
        "warning: resources.gpus[1].pattern '*H100*' matches no GPU on this node "
        "(models: NVIDIA A100 80GB PCIe, Tesla T4)\n"
    )


@pytest.mark.process
def test_devices_json_has_the_plan() -> None:
    result = devices("--config", write_config(CLI_CONFIG), "--output", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [g["resource"] for g in data["gpus"]] == [
        "nvidia.com/a100",
        "nvidia.com/a100",
        "nvidia.com/t4-shared x4 (<uuid>::0..3)",
        "nvidia.com/t4-shared x4 (<uuid>::0..3)",
        "nvidia.com/a100",
        "nvidia.com/a100",
        "nvidia.com/t4-shared x4 (<uuid>::0..3)",
        "(excluded)",
    ]
    plan = data["resources"]
    assert plan["resources"] == [
        {
            "name": "nvidia.com/a100",
            "socket": "nvplugin-a100.sock",
            "gpus": A100,
            "sharing": None,
            "replicas": 1,
            "devices": 4,
            "renamed_from": None,
        },
        {
            "name": "nvidia.com/t4-shared",
            "socket": "nvplugin-t4-shared.sock",
            "gpus": [2, 3, 6],
            "sharing": "time-slicing",
            "replicas": 4,
            "devices": 12,
            "renamed_from": "nvidia.com/gpu",
        },
    ]
    assert plan["excluded"] == [7]
    assert plan["empty"] == ["nvidia.com/h100"]


@pytest.mark.process
def test_devices_without_config_is_unchanged_and_bad_config_exits_2() -> None:
    plain = devices()
    assert plain.returncode == 0
    assert "RESOURCE" not in plain.stdout.splitlines()[0]
    bad = devices("--config", write_config("flags:\n  plugin:\n    deviceListStrategy: magic\n"))
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: config file /tmp/")
    assert 'key "flags.plugin.deviceListStrategy[0]"' in bad.stderr
    assert "Traceback" not in bad.stderr


# --- the README's example is real -------------------------------------------------------------

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> tuple[str, list[str]]:
    """The example config of the README's "Example: an A100 + T4 node" and its console lines."""
    text = README.read_text()
    section = text[text.index("### Example: an A100 + T4 node") :]
    config = re.search(r"```yaml\n(.*?)```", section, re.S)
    console = re.search(r"```console\n\$ [^\n]*\n(.*?)```", section, re.S)
    assert config is not None and console is not None
    return config.group(1), console.group(1).splitlines()


@pytest.mark.process
def test_readme_example_config_and_devices_output() -> None:
    config_text, shown = readme_example()
    result = devices("--config", write_config(config_text))
    assert result.returncode == 0, result.stderr
    assert shown == result.stderr.splitlines() + result.stdout.splitlines()


def test_readme_lists_every_key_of_the_config_file() -> None:
    """The README's annotated config lists every setting (those NVIDIA's plugin has and nvplugin
    refuses are listed in the paragraph after it)."""
    from nvplugin.config import SETTINGS

    text = README.read_text()
    section = text[text.index("### The config file: NVIDIA's format") :]
    block = section[: section.index("## What containers get")]
    for path, setting in SETTINGS.items():
        leaf = path.rsplit(".", 1)[-1]
        if setting.supported is not None or setting.note:
            assert leaf in block, path
        else:
            assert re.search(rf"[\s{{]{leaf}:", block), path


@pytest.mark.slow  # 100 000 UUIDs through the config loader: seconds
def test_an_exclude_list_for_a_whole_fleet_gives_one_warning_not_one_per_uuid() -> None:
    """100 000 UUIDs of other nodes' GPUs (a ConfigMap shared by a fleet) and two of this
    node's: one warning sums the others up, naming the first few."""
    others = [f"GPU-{n:06d}" for n in range(100_000)]  # short: the file stays under 4 MiB
    mine = [MIXED.gpus[4].uuid, MIXED.gpus[6].uuid]
    uuids = [*others[:3], mine[0], *others[3:], mine[1]]
    config = config_of(f"resources:\n  exclude:\n    uuids: [{', '.join(uuids)}]\n")
    plan = plan_of(config)
    assert [i for i, name in plan.assignment.items() if name is None] == [4, 6]
    (warning,) = plan.warnings
    assert warning.startswith(
        "resources.exclude.uuids: 100000 of its 100002 entries are not GPUs or MIG devices on "
        f"this node; [0] {others[0]}, [1] {others[1]}, [2] {others[2]}, [4] {others[3]} and "
        "99996 more"
    )
