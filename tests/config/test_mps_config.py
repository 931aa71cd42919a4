"""NVIDIA's ``sharing.mps`` block and ``flags.mpsRoot``, with NVIDIA's meaning: the same shape as
``sharing.timeSlicing``, failRequestsGreaterThanOne true unless the file relaxes it, ``MPS_ROOT``
accepted with or without MPS; refused where NVIDIA refuses (MIG devices, a resource shared two
ways) with the key path.

The files restate NVIDIA's README example (v0.15+) and the GPU Operator's MPS guide.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nvplugin.config import Config, ReplicatedResource, load_config
from nvplugin.config.layout import MPS, TIME_SLICING
from nvplugin.errors import InputError

Write = Callable[..., str]

# NVIDIA's README: "Shared Access to GPUs with CUDA MPS".
README_MPS = """\
version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""

# The GPU Operator's guide: renamed, and the operator's usual keys.
OPERATOR_MPS = """\
version: v1
flags:
  migStrategy: none
sharing:
  mps:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def test_nvidias_readme_example(write: Write) -> None:
    config = load_config(write(README_MPS))
    mps = config.sharing.mps
    assert mps.strategy == MPS
    assert mps.resources == (ReplicatedResource("nvidia.com/gpu", 10),)
    assert mps.fail_requests_greater_than_one is True  # NVIDIA's default for MPS
    assert mps.served_name(mps.resources[0]) == "nvidia.com/gpu"
    assert config.sharing.time_slicing.resources == ()
    assert config.mps_root == "/run/nvidia/mps"
    shown = config.as_dict()["sharing"]["mps"]
    assert shown["failRequestsGreaterThanOne"] is True
    assert shown["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 10, "rename": None, "servedAs": "nvidia.com/gpu"}
    ]


def test_the_gpu_operator_example_renames_by_default(write: Write) -> None:
    config = load_config(write(OPERATOR_MPS))
    assert config.sharing.served_name("nvidia.com/gpu") == "nvidia.com/gpu.shared"
    assert config.sharing.find("nvidia.com/gpu") == (config.sharing.mps, 0)


def test_fail_requests_greater_than_one_can_be_relaxed(write: Write) -> None:
    text = README_MPS.replace("  mps:\n", "  mps:\n    failRequestsGreaterThanOne: false\n")
    assert load_config(write(text)).sharing.mps.fail_requests_greater_than_one is False


@pytest.mark.parametrize("text", ["sharing:\n  mps:\n", "sharing:\n  mps: {}\n"])
def test_an_empty_mps_block_shares_nothing(write: Write, text: str) -> None:
    config = load_config(write(text))
    assert config == Config(source=config.source)


def test_mps_root_from_nvidias_variable_and_flag(write: Write) -> None:
    """NVIDIA's chart sets MPS_ROOT on every plugin container, MPS or not."""
    assert load_config(None, env={"MPS_ROOT": "/run/nvidia/mps"}) == Config()
    config = load_config(write(README_MPS), env={"MPS_ROOT": "/var/run/mps"})
    assert config.mps_root == "/var/run/mps"
    flagged = load_config(write(README_MPS), flags={"flags.mpsRoot": "/srv/mps"})
    assert flagged.mps_root == "/srv/mps"


def test_a_resource_shared_both_ways_is_refused(write: Write) -> None:
    text = (
        README_MPS + "  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n"
    )
    with pytest.raises(InputError) as caught:
        load_config(write(text))
    assert str(caught.value).endswith(
        'key "sharing.mps.resources[0].name": nvidia.com/gpu is already replicated by '
        "sharing.timeSlicing.resources[0]"
    )


def test_two_resources_may_be_shared_two_ways(write: Write) -> None:
    """Beyond NVIDIA (one block for the whole node): T4s time-sliced, A100s through MPS."""
    text = (
        "resources:\n  gpus:\n  - {pattern: '*T4*', name: t4}\n"
        "sharing:\n"
        "  timeSlicing:\n    resources:\n    - {name: t4, replicas: 4}\n"
        "  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n"
    )
    sharing = load_config(write(text)).sharing
    assert sharing.find("nvidia.com/t4") == (sharing.time_slicing, 0)
    assert sharing.find("nvidia.com/gpu") == (sharing.mps, 0)
    assert (sharing.time_slicing.strategy, sharing.mps.strategy) == (TIME_SLICING, MPS)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            README_MPS.replace("replicas: 10", "replicas: 49"),
            'key "sharing.mps.resources[0].replicas": 49 is not between 2 and 48',
        ),
        (
            README_MPS.replace("replicas: 10", "replicas: 1"),
            'key "sharing.mps.resources[0].replicas": 1 is not between 2 and 48',
        ),
        (
            README_MPS.replace("nvidia.com/gpu", "nvidia.com/t4"),
            'key "sharing.mps.resources[0].name": nvidia.com/t4 is not a resource this plugin '
            "serves (have: nvidia.com/gpu)",
        ),
        (
            "flags:\n  migStrategy: mixed\n"
            + README_MPS.replace("nvidia.com/gpu", "nvidia.com/mig-1g.10gb"),
            'key "sharing.mps.resources[0].name": nvidia.com/mig-1g.10gb serves MIG devices: '
            "MPS shares whole GPUs",
        ),
        (
            README_MPS + "flags:\n  mpsRoot: ''\n",
            'key "flags.mpsRoot": is "" but sharing.mps shares resources',
        ),
        (
            "flags:\n  mpsRoot: run/mps\n",
            "key \"flags.mpsRoot\": 'run/mps' is not an absolute path",
        ),
        (
            README_MPS.replace("      replicas: 10", "      replicas: 2\n      devices: [0]"),
            'key "sharing.mps.resources[0].devices": nvplugin does not support replicating',
        ),
    ],
)
def test_what_cannot_work_is_refused_naming_the_key(write: Write, text: str, expected: str) -> None:
    with pytest.raises(InputError) as caught:
        load_config(write(text))
    assert expected in str(caught.value)


def test_mps_under_mixed_shares_the_whole_gpus(write: Write) -> None:
    """NVIDIA refuses MPS with migStrategy mixed altogether; nvplugin only on MIG devices."""
    config = load_config(write("flags:\n  migStrategy: mixed\n" + README_MPS))
    assert config.sharing.find("nvidia.com/gpu") == (config.sharing.mps, 0)
