"""MIG devices in the resource plan under each ``migStrategy``: resources per profile,
``resources.mig`` renames, exclusions, time-slicing, collisions, warnings; and NVIDIA's MIG
settings from file, env and flags."""

from __future__ import annotations

import pytest

from nvplugin.config import load_config
from nvplugin.errors import InputError
from nvplugin.rm import ResourcePlan, ServedResource
from tests.support.migplans import HOMOGENEOUS, NODE, config_of, plan_of

# GPUs 0-1: 1g.5gb x7 (NUMA 3); GPU2: 3g.20gb, 2g.10gb, 1g.5gb x2 (NUMA 1); GPU3: 3g.20gb x2
# (NUMA 1); GPU4: 2g.10gb x2, 1g.10gb, 1g.5gb+me (NUMA 7); GPU5: MIG on, no devices (NUMA 7);
# GPUs 6-7: MIG off (NUMA 5).
MIXED_COUNTS = {
    "nvidia.com/mig-1g.5gb": 16,
    "nvidia.com/mig-3g.20gb": 3,
    "nvidia.com/mig-2g.10gb": 3,
    "nvidia.com/mig-1g.10gb": 1,
    "nvidia.com/mig-1g.5gb.me": 1,
    "nvidia.com/gpu": 2,
}


def counts(plan: ResourcePlan) -> dict[str, int]:
    return {r.name: r.device_count for r in plan.resources}


def labels(resource: ServedResource) -> list[str]:
    return [m.mig.label for m in resource.migs]


# --- the plan ----------------------------------------------------------------------------------


def test_mixed_serves_one_resource_per_profile_beside_the_gpus_with_mig_off() -> None:
    plan = plan_of(config_of())
    assert counts(plan) == MIXED_COUNTS
    # ordered by first device: GPU0's 1g.5gb, GPU2's 3g.20gb and 2g.10gb, GPU4's, then GPU6
    assert [r.name for r in plan.resources] == [
        "nvidia.com/mig-1g.5gb",
        "nvidia.com/mig-3g.20gb",
        "nvidia.com/mig-2g.10gb",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.5gb.me",
        "nvidia.com/gpu",
    ]
    small = plan.resource("nvidia.com/mig-1g.5gb")
    assert small is not None and small.socket == "nvplugin-mig-1g.5gb.sock"
    assert [g.index for g in small.gpus] == [0, 1, 2]  # the parents, whose health it follows
    assert labels(small)[-3:] == ["1:6", "2:2", "2:3"]
    medium = plan.resource("nvidia.com/mig-3g.20gb")
    assert medium is not None and labels(medium) == ["2:0", "3:0", "3:1"]
    assert {m.numa_node for m in medium.migs} == {1}
    gpu = plan.resource("nvidia.com/gpu")
    assert gpu is not None and [g.index for g in gpu.gpus] == [6, 7] and not gpu.migs
    assert plan.warnings == (
        "GPU 5 (NVIDIA A100-SXM4-40GB) has MIG enabled but no MIG devices: it serves nothing "
        "until MIG devices are created on it",
    )
    shown = plan.labels()
    assert shown[0] == "(as 7 MIG devices)" and shown[5] == "(MIG, no MIG devices)"
    assert shown[6] == "nvidia.com/gpu"
    assert plan.mig_labels()["4:3"] == "nvidia.com/mig-1g.5gb.me"
    data = plan.as_dict()
    assert data["mig_strategy"] == "mixed"
    entry = next(r for r in data["resources"] if r["name"] == "nvidia.com/mig-3g.20gb")
    assert entry == {
        "name": "nvidia.com/mig-3g.20gb",
        "socket": "nvplugin-mig-3g.20gb.sock",
        "gpus": [2, 3],
        "mig_devices": ["2:0", "3:0", "3:1"],
        "sharing": None,
        "replicas": 1,
        "devices": 3,
        "renamed_from": None,
    }


def test_resources_mig_renames_by_whole_profile_name_first_match_wins() -> None:
    config = config_of(
        "resources:\n  mig:\n"
        "    - {pattern: '1g.5gb', name: mig-small}\n"  # not 1g.5gb+me: the whole name
        "    - {pattern: '?g.*', name: mig-other}\n"
        "    - {pattern: '7g.*', name: mig-whole}\n"
    )
    plan = plan_of(config)
    assert counts(plan) == {
        "nvidia.com/mig-small": 16,
        "nvidia.com/mig-other": 8,  # 3g.20gb x3, 2g.10gb x3, 1g.10gb, 1g.5gb+me
        "nvidia.com/gpu": 2,
    }
    other = plan.resource("nvidia.com/mig-other")
    assert other is not None and labels(other)[:3] == ["2:0", "2:1", "3:0"]
    assert plan.warnings[1:] == (
        "resources.mig[2].pattern '7g.*' matches no MIG device on this node (profiles: "
        "1g.10gb, 1g.5gb, 1g.5gb+me, 2g.10gb, 3g.20gb)",
    )
    assert config.as_dict()["resources"]["mig"][0] == {
        "pattern": "1g.5gb",
        "name": "nvidia.com/mig-small",
    }


def test_exclusions_hide_gpus_with_their_mig_devices_and_single_mig_devices() -> None:
    hidden = NODE.gpus[3].mig_devices[0].uuid
    config = config_of(f"resources:\n  exclude:\n    uuids: [{NODE.gpus[0].uuid}, {hidden}]\n")
    plan = plan_of(config)
    assert counts(plan)["nvidia.com/mig-1g.5gb"] == 9
    medium = plan.resource("nvidia.com/mig-3g.20gb")
    assert medium is not None and labels(medium) == ["2:0", "3:1"]
    assert plan.as_dict()["excluded"] == [0]
    assert plan.as_dict()["excluded_mig_devices"] == ["3:0"]
    assert plan.labels()[0] == "(excluded)" and plan.mig_labels()["3:0"] == "(excluded)"


def test_time_slicing_replicates_mig_devices() -> None:
    config = config_of(
        "sharing:\n  timeSlicing:\n    resources:\n"
        "      - {name: mig-1g.5gb, replicas: 4}\n"
        "      - {name: nvidia.com/mig-3g.20gb, replicas: 2, rename: mig-medium-shared}\n"
        "      - {name: mig-7g.40gb, replicas: 2}\n"
    )
    plan = plan_of(config)
    assert counts(plan)["nvidia.com/mig-1g.5gb"] == 64
    shared = plan.resource("nvidia.com/mig-medium-shared")
    assert shared is not None and shared.device_count == 6
    assert shared.base == "nvidia.com/mig-3g.20gb"
    assert plan.mig_labels()["3:1"] == "nvidia.com/mig-medium-shared x2 (<uuid>::0..1)"
    assert plan.warnings[-1] == (
        "sharing.timeSlicing.resources[2].name nvidia.com/mig-7g.40gb is no resource of this "
        "node (no MIG device is served as it)"
    )


def test_too_many_mig_replicas_for_the_kubelet_name_the_key() -> None:
    config = config_of(
        "sharing:\n  timeSlicing:\n    resources:\n      - {name: mig-1g.5gb, replicas: 100000}\n"
    )
    with pytest.raises(InputError) as caught:
        plan_of(config)
    message = str(caught.value)
    assert 'config key "sharing.timeSlicing.resources[0].replicas"' in message
    assert "16 MIG device(s) of nvidia.com/mig-1g.5gb" in message and "at most" in message


def test_a_mig_resource_cannot_take_a_name_already_served() -> None:
    # resources.gpus names a resource as a MIG profile's would be: only the node can tell.
    config = config_of("resources:\n  gpus:\n    - {pattern: '*A100*', name: mig-1g.5gb}\n")
    with pytest.raises(InputError) as caught:
        plan_of(config)
    assert str(caught.value) == (
        'config key "MIG profile 1g.5gb (migStrategy mixed)": nvidia.com/mig-1g.5gb collides '
        "with the resource from resources.gpus[0].name"
    )
    # resources.mig naming the GPU resource: the config alone tells.
    with pytest.raises(InputError) as caught:
        config_of("resources:\n  mig:\n    - {pattern: '*', name: gpu}\n")
    assert 'key "resources.mig[0].name": nvidia.com/gpu is already the resource of whole' in str(
        caught.value
    )
    # time-slicing a MIG resource needs migStrategy mixed
    with pytest.raises(InputError) as caught:
        config_of(
            "sharing:\n  timeSlicing:\n    resources:\n      - {name: mig-1g.5gb, replicas: 2}\n",
            strategy="none",
        )
    assert "nvidia.com/mig-1g.5gb is not a resource this plugin serves" in str(caught.value)


def test_single_serves_every_mig_device_as_the_gpu_resource() -> None:
    from nvplugin.nodefile.reader import parse_node

    homogeneous = parse_node(HOMOGENEOUS, "test").topology()
    plan = plan_of(config_of(strategy="single"), homogeneous.gpus)
    assert counts(plan) == {"nvidia.com/gpu": 4}
    (resource,) = plan.resources
    assert labels(resource) == ["0:0", "0:1", "1:0", "1:1"]
    assert [m.numa_node for m in resource.migs] == [0, 0, 1, 1]
    assert plan.labels() == {0: "(as 2 MIG devices)", 1: "(as 2 MIG devices)"}
    # resources.mig does nothing under single: said, not silently ignored
    renamed = config_of("resources:\n  mig:\n    - {pattern: '*', name: x}\n", "single")
    assert plan_of(renamed, homogeneous.gpus).warnings == (
        "resources.mig applies under migStrategy mixed only; migStrategy is single",
    )
    with pytest.raises(InputError) as caught:
        plan_of(config_of(strategy="single"))
    assert str(caught.value).startswith("migStrategy single needs every GPU in MIG mode")
    # Hiding the GPUs that break single's rule leaves a node it fits.
    hide = [g.uuid for g in NODE.gpus if g.index not in (0, 1)]
    config = config_of(f"resources:\n  exclude:\n    uuids: [{', '.join(hide)}]\n", "single")
    assert counts(plan_of(config)) == {"nvidia.com/gpu": 14}


def test_none_serves_whole_gpus_mig_or_not() -> None:
    plan = plan_of(config_of(strategy="none"))
    assert counts(plan) == {"nvidia.com/gpu": 8}
    assert len(plan.warnings) == 6  # each MIG-enabled GPU: no container can use it whole
    assert plan.mig_labels() == {}


def test_nvidias_mig_settings_load_from_file_env_and_flags() -> None:
    assert config_of().mig_strategy == "mixed"
    assert load_config(None, env={"MIG_STRATEGY": "single"}).mig_strategy == "single"
    flags = {"flags.migStrategy": "none"}
    assert load_config(None, env={"MIG_STRATEGY": "mixed"}, flags=flags).mig_strategy == "none"
    with pytest.raises(InputError) as caught:
        load_config(None, env={"MIG_STRATEGY": "Mixed"})
    assert str(caught.value).startswith("environment variable MIG_STRATEGY")
    assert "none, single, mixed" in str(caught.value)
