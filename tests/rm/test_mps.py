"""MPS in the resource plan and in Allocate responses: replicas like time-slicing's, refused on MIG
devices, and a container's response with NVIDIA's pipe directory and shared memory plus its
shares (k replicas of a GPU = k shares)."""

from __future__ import annotations

import os
import shutil

import pytest

from nvplugin.api.nvidia import MPS_MEMORY_LIMIT_ENV, MPS_PIPE_ENV, MPS_THREADS_ENV
from nvplugin.config import Config, load_config
from nvplugin.errors import InputError
from nvplugin.nodesession import load_topology
from nvplugin.rm import MpsAllocation, Replicas, Responder, plan_for
from nvplugin.rm.devices import base_devices
from nvplugin.rm.mps import share_memory_mib, share_threads
from tests.support.service import write_config

MIXED = load_topology("mixed-a100-t4")  # A100 80GB: 0, 1, 4, 5; T4 (15360 MiB): 2, 3, 6, 7
MIG = load_topology("dgx-a100-mig")  # GPUs 0-5 MIG on, 6-7 off


def config_of(text: str) -> Config:
    path = write_config("version: v1\n" + text)
    try:
        return load_config(path)
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def test_shares_are_fractions_of_memory_and_threads() -> None:
    a100, t4 = MIXED.gpus[0], MIXED.gpus[2]
    assert share_memory_mib(a100, 4) == 20480
    assert share_memory_mib(t4, 3) == 5120
    assert share_memory_mib(t4, 3, shares=2) == 10240
    assert share_memory_mib(t4, 3, shares=9) == 15360  # never more than the GPU
    assert share_threads(4) == 25
    assert share_threads(3) == 33
    assert share_threads(3, shares=2) == 66
    assert share_threads(48) == 2
    assert share_threads(2, shares=5) == 100


def test_an_mps_resource_beside_a_time_sliced_one() -> None:
    config = config_of(
        "resources:\n  gpus:\n  - {pattern: '*T4*', name: t4}\n"
        "sharing:\n"
        "  timeSlicing:\n    resources:\n    - {name: t4, replicas: 2}\n"
        "  mps:\n    renameByDefault: true\n    resources:\n    - {name: gpu, replicas: 4}\n"
    )
    plan = plan_for(config, MIXED.gpus)
    mps = plan.resource("nvidia.com/gpu.shared")
    sliced = plan.resource("nvidia.com/t4")
    assert mps is not None and sliced is not None
    assert mps.replicas == Replicas(4, True, "distributed", "mps")
    assert mps.replicas.mps and not sliced.replicas.mps
    assert [gpu.index for gpu in mps.gpus] == [0, 1, 4, 5]
    assert [d.id for d in mps.devices[:2]] == [f"{MIXED.gpus[0].uuid}::{n}" for n in (0, 1)]
    entries = {entry["name"]: entry for entry in plan.as_dict()["resources"]}
    assert entries["nvidia.com/gpu.shared"]["sharing"] == "mps"
    assert entries["nvidia.com/gpu.shared"]["devices"] == 16
    assert entries["nvidia.com/t4"]["sharing"] == "time-slicing"
    labels = plan.labels()
    assert labels[0] == "nvidia.com/gpu.shared x4 MPS shares (<uuid>::0..3)"
    assert labels[2] == "nvidia.com/t4 x2 (<uuid>::0..1)"


def test_mps_on_mig_devices_is_refused_naming_the_key() -> None:
    config = config_of(
        "flags:\n  migStrategy: single\nsharing:\n  mps:\n    resources:\n"
        "    - {name: gpu, replicas: 2}\n"
    )
    homogeneous = [gpu for gpu in MIG.gpus if gpu.index in (0, 1)]  # 1g.5gb x7 each
    with pytest.raises(InputError) as caught:
        plan_for(config, homogeneous)
    message = str(caught.value)
    assert message.startswith('config key "sharing.mps.resources[0].name": nvidia.com/gpu serves')
    assert "MIG devices here (migStrategy single)" in message


def test_mps_under_mixed_shares_the_gpus_with_mig_off() -> None:
    config = config_of(
        "flags:\n  migStrategy: mixed\nsharing:\n  mps:\n    resources:\n"
        "    - {name: gpu, replicas: 2}\n"
    )
    plan = plan_for(config, MIG.gpus)
    served = plan.resource("nvidia.com/gpu")
    assert served is not None and served.replicas.mps
    assert [gpu.index for gpu in served.gpus] == [6, 7]
    assert not any(r.replicas.shared for r in plan.resources if r.name != "nvidia.com/gpu")


def test_mps_under_none_serves_only_the_gpus_with_mig_off_and_names_the_rest() -> None:
    """migStrategy none (the GPU Operator's mps-config-all on a node with some MIG GPUs): MPS
    cannot run on a GPU with MIG on, and NVIDIA's MPS daemon skips MIG devices. The GPUs with
    MIG on are left out (named in a warning, shown as such), MPS is served on the rest."""
    config = config_of("sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 4}\n")
    plan = plan_for(config, MIG.gpus)
    (served,) = plan.resources
    assert served.name == "nvidia.com/gpu" and served.replicas.mps
    assert [gpu.index for gpu in served.gpus] == [6, 7]
    assert plan.mps_mig_on == (0, 1, 2, 3, 4, 5)
    assert [plan.served_as[str(n)] for n in range(6)] == [None] * 6
    (warning,) = [w for w in plan.warnings if "MIG" in w]
    assert warning.startswith("GPU 0, 1, 2, 3, 4, 5 have MIG enabled and sharing.mps would")
    assert plan.labels()[0] == "(MIG on: not shared through MPS)"
    assert plan.as_dict()["excluded"] == [] and plan.as_dict()["mps_mig_on"] == [0, 1, 2, 3, 4, 5]
    # Time-slicing still advertises them whole, as NVIDIA does (with its warning).
    sliced = plan_for(
        config_of("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n"),
        MIG.gpus,
    )
    assert sliced.mps_mig_on == () and len(sliced.resources[0].gpus) == 8


def test_fail_requests_greater_than_one_names_the_mps_key() -> None:
    replicas = Replicas(4, True, strategy="mps")
    assert replicas.too_many(1) is None
    message = replicas.too_many(2)
    assert message is not None
    assert "sharing.mps.failRequestsGreaterThanOne allows at most 1 per container" in message
    assert Replicas(4, False, strategy="mps").too_many(3) is None


# --- Allocate ------------------------------------------------------------------------------------


def responder(replicas: int) -> Responder:
    return Responder(mps=MpsAllocation("nvidia.com/gpu", "/run/nvidia/mps", replicas))


def test_one_share_as_nvidia_answers_plus_its_limits() -> None:
    devices = Replicas(4, strategy="mps").devices(base_devices(MIXED.gpus))
    response = responder(4).container_response([devices[9]])  # GPU 2 (a T4), replica 1
    assert dict(response.envs) == {
        "NVIDIA_VISIBLE_DEVICES": MIXED.gpus[2].uuid,
        MPS_PIPE_ENV: "/mps/nvidia.com/gpu/pipe",
        MPS_MEMORY_LIMIT_ENV: "0=3840M",
        MPS_THREADS_ENV: "25",
    }
    assert [(m.container_path, m.host_path, m.read_only) for m in response.mounts] == [
        ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe", False),
        ("/dev/shm", "/run/nvidia/mps/shm", False),
    ]


def test_k_replicas_of_a_gpu_are_k_shares() -> None:
    """Beyond NVIDIA (whose containers get one share whatever they asked): three replicas of GPU 0
    and one of GPU 1 -- memory per GPU by its shares, threads by the fewest."""
    devices = Replicas(4, strategy="mps").devices(base_devices(MIXED.gpus))
    given = [devices[0], devices[2], devices[3], devices[5]]  # GPU 0 x3, GPU 1 x1
    response = responder(4).container_response(given)
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == f"{MIXED.gpus[0].uuid},{MIXED.gpus[1].uuid}"
    assert response.envs[MPS_MEMORY_LIMIT_ENV] == "0=61440M,1=20480M"
    assert response.envs[MPS_THREADS_ENV] == "25"
    whole = responder(4).container_response(devices[:4])  # every share of GPU 0
    assert whole.envs[MPS_MEMORY_LIMIT_ENV] == "0=81920M"
    assert whole.envs[MPS_THREADS_ENV] == "100"


def test_time_sliced_responses_have_no_mps_part() -> None:
    devices = Replicas(4).devices(base_devices(MIXED.gpus))
    response = Responder().container_response(devices[:2])
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": MIXED.gpus[0].uuid}
    assert list(response.mounts) == []
