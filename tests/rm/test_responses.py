"""Allocate responses for every device-list strategy combination and both ID strategies, asserted
field by field over real gRPC on a real unix socket; DeviceSpecs against a fake dev root; the
config keys that choose them (file, env, flags) and their errors."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path

import pytest

from nvplugin.config import Config, load_config
from nvplugin.errors import InputError
from nvplugin.nodesession import load_topology
from nvplugin.rm import Responder, make_responder
from nvplugin.rm.devices import base_devices
from tests.support.service import allocate_request, run, serving, write_config

STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
COMBINATIONS = [c for n in range(1, 5) for c in combinations(STRATEGIES, n)]
ENV = "NVIDIA_VISIBLE_DEVICES"
MOUNT_ROOT = "/var/run/nvidia-container-devices"
ANNOTATION = re.compile(r"^cdi\.k8s\.io/nvplugin_[0-9a-f]{16}$")
TOPOLOGY = load_topology("workstation-4gpu")


def responder_of(config: Config) -> Responder:
    return make_responder(
        config.device_list_strategy,
        config.device_id_strategy,
        pass_device_specs=config.pass_device_specs,
        dev_root=config.dev_root,
        cdi_annotation_prefix=config.cdi_annotation_prefix,
    )


# --- every combination, field by field -------------------------------------------------------


@pytest.mark.parametrize("id_strategy", ["uuid", "index"])
@pytest.mark.parametrize("strategies", COMBINATIONS, ids="+".join)
def test_allocate_response_fields(strategies: tuple[str, ...], id_strategy: str) -> None:
    # Through the config loader, as the daemon builds it (the list given in reverse order:
    # the order of application is fixed, not the config's).
    config = load_config(
        write_config(
            "version: v1\nflags:\n  plugin:\n    deviceListStrategy: [{}]\n"
            "    deviceIDStrategy: {}\n".format(", ".join(reversed(strategies)), id_strategy)
        )
    )
    assert config.device_list_strategy == tuple(reversed(strategies))

    async def body() -> None:
        async with serving(TOPOLOGY, responder=responder_of(config)) as s:
            # Two containers; the first lists its GPUs out of index order.
            request = allocate_request([s.uuid(3), s.uuid(1)], [s.uuid(0)])
            reply = await s.stub.Allocate(request)
            assert len(reply.container_responses) == 2
            for response, indices in zip(reply.container_responses, ([1, 3], [0]), strict=True):
                ids = [str(i) if id_strategy == "index" else s.uuid(i) for i in indices]
                expected_env: dict[str, str] = {}
                if "volume-mounts" in strategies:
                    expected_env = {ENV: MOUNT_ROOT}
                elif "envvar" in strategies:
                    expected_env = {ENV: ",".join(ids)}
                assert dict(response.envs) == expected_env

                mounts = [(m.container_path, m.host_path, m.read_only) for m in response.mounts]
                if "volume-mounts" in strategies:
                    assert mounts == [(f"{MOUNT_ROOT}/{i}", "/dev/null", False) for i in ids]
                else:
                    assert mounts == []

                names = [f"k8s.device-plugin.nvidia.com/gpu={i}" for i in ids]
                annotations = dict(response.annotations)
                if "cdi-annotations" in strategies:
                    assert len(annotations) == 1
                    ((key, value),) = annotations.items()
                    assert ANNOTATION.match(key), key
                    assert value == ",".join(names)
                else:
                    assert annotations == {}

                cdi = [d.name for d in response.cdi_devices]
                assert cdi == (names if "cdi-cri" in strategies else [])
                assert list(response.devices) == []  # no pass_device_specs

    run(body)


def test_default_is_envvar_with_uuids() -> None:
    config = load_config(None)
    assert config.device_list_strategy == ("envvar",)
    assert config.device_id_strategy == "uuid"
    assert config.pass_device_specs is False
    assert config.dev_root == "/"
    assert config.cdi_annotation_prefix == "cdi.k8s.io/"

    async def body() -> None:
        async with serving(TOPOLOGY, responder=responder_of(config)) as s:
            reply = await s.stub.Allocate(allocate_request([s.uuid(2), s.uuid(0)]))
            (response,) = reply.container_responses
            assert dict(response.envs) == {ENV: f"{s.uuid(0)},{s.uuid(2)}"}
            assert not response.mounts and not response.annotations
            assert not response.cdi_devices and not response.devices

    run(body)


def test_cdi_annotation_key_is_stable_per_device_set_and_prefix_is_configurable() -> None:
    config = load_config(
        write_config(
            "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-annotations\n"
            "    cdiAnnotationPrefix: cdi.example.org/\n"
        )
    )

    async def body() -> None:
        async with serving(TOPOLOGY, responder=responder_of(config)) as s:
            reply = await s.stub.Allocate(
                allocate_request([s.uuid(0), s.uuid(1)], [s.uuid(1), s.uuid(0)], [s.uuid(2)])
            )
            keys = [next(iter(r.annotations)) for r in reply.container_responses]
            assert all(k.startswith("cdi.example.org/nvplugin_") for k in keys)
            assert keys[0] == keys[1]  # same devices, same key (whatever the request order)
            assert keys[2] != keys[0]
            assert "NVIDIA_VISIBLE_DEVICES" not in reply.container_responses[0].envs

    run(body)


# --- DeviceSpecs -------------------------------------------------------------------------------


def fake_dev_root(present: Sequence[str]) -> str:
    root = tempfile.mkdtemp()
    os.makedirs(os.path.join(root, "dev"))
    for name in present:
        Path(root, "dev", name).write_text("")
    return root


@pytest.mark.parametrize("id_strategy", ["uuid", "index"])
def test_device_specs_for_gpus_and_present_control_nodes(id_strategy: str) -> None:
    root = fake_dev_root(["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia3"])  # no uvm-tools, modeset
    config = load_config(
        None,
        flags={
            "flags.plugin.passDeviceSpecs": True,
            "flags.nvidiaDevRoot": root,
            "flags.plugin.deviceIDStrategy": id_strategy,
            "flags.plugin.deviceListStrategy": "envvar,cdi-cri",
        },
    )

    async def body() -> None:
        async with serving(TOPOLOGY, responder=responder_of(config)) as s:
            reply = await s.stub.Allocate(allocate_request([s.uuid(3), s.uuid(1)]))
            (response,) = reply.container_responses
            specs = [(d.container_path, d.host_path, d.permissions) for d in response.devices]
            gpus = [s.topology.gpus[1], s.topology.gpus[3]]
            expected = [
                (f"/dev/nvidia{g.minor}", f"{root}/dev/nvidia{g.minor}", "rw") for g in gpus
            ]
            expected += [
                (f"/dev/{n}", f"{root}/dev/{n}", "rw") for n in ("nvidiactl", "nvidia-uvm")
            ]
            assert specs == expected
            ids = ["1", "3"] if id_strategy == "index" else [g.uuid for g in gpus]
            assert response.envs[ENV] == ",".join(ids)
            assert [d.name for d in response.cdi_devices] == [
                f"k8s.device-plugin.nvidia.com/gpu={i}" for i in ids
            ]
            # A control node appearing later (nvidia-uvm-tools loaded) is picked up.
            Path(root, "dev", "nvidia-uvm-tools").write_text("")
            reply = await s.stub.Allocate(allocate_request([s.uuid(0)]))
            paths = [d.container_path for d in reply.container_responses[0].devices]
            assert paths == [
                "/dev/nvidia0",
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
            ]

    run(body)


def test_default_dev_root_host_paths_are_under_slash_dev() -> None:
    responder = make_responder(pass_device_specs=True)
    response = responder.container_response(base_devices([TOPOLOGY.gpus[2]]))
    assert response.devices[0].host_path == "/dev/nvidia2"
    assert response.devices[0].container_path == "/dev/nvidia2"


# --- config: sources and errors ----------------------------------------------------------------


def test_strategy_keys_from_env_and_flags() -> None:
    env = {
        "DEVICE_LIST_STRATEGY": "volume-mounts,cdi-cri",
        "DEVICE_ID_STRATEGY": "index",
        "PASS_DEVICE_SPECS": "true",
        "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
        "CDI_ANNOTATION_PREFIX": "cdi.example.org/",
    }
    config = load_config(None, env=env)
    assert config.device_list_strategy == ("volume-mounts", "cdi-cri")
    assert config.device_id_strategy == "index"
    assert config.pass_device_specs is True
    assert config.dev_root == "/run/nvidia/driver"
    assert config.cdi_annotation_prefix == "cdi.example.org/"
    flagged = load_config(None, env=env, flags={"flags.plugin.deviceListStrategy": "envvar"})
    assert flagged.device_list_strategy == ("envvar",)
    shown = flagged.as_dict()["flags"]["plugin"]
    assert shown["deviceListStrategy"] == ["envvar"]
    assert shown["deviceIDStrategy"] == "index"
    assert shown["passDeviceSpecs"] is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "    deviceListStrategy: [envvar, cdi]\n",
            "key \"flags.plugin.deviceListStrategy[1]\": 'cdi' is not one of envvar, "
            "volume-mounts, cdi-annotations, cdi-cri",
        ),
        ("    deviceListStrategy: [envvar, envvar]\n", "'envvar' is listed twice"),
        ("    deviceListStrategy: []\n", "expected at least 1 item"),
        ("    deviceListStrategy: 3\n", "expected a list of strings, got 3"),
        ("    deviceIDStrategy: serial\n", "'serial' is not one of uuid, index"),
        (
            "    passDeviceSpecs: yes please\n",
            'key "flags.plugin.passDeviceSpecs": expected true or false',
        ),
        ("    cdiAnnotationPrefix: cdi.k8s.io\n", "must end with '/'"),
        (
            "    containerDriverRoot: run/nvidia/driver\n",
            "key \"flags.plugin.containerDriverRoot\": 'run/nvidia/driver' is not an absolute",
        ),
        ("    cdiAnnotationPrefix: Not_A_Domain/\n", "cannot prefix an annotation key"),
    ],
)
def test_bad_strategy_values_name_the_key(text: str, expected: str) -> None:
    with pytest.raises(InputError) as caught:
        load_config(write_config("version: v1\nflags:\n  plugin:\n" + text))
    assert caught.value.exit_code == 2
    assert expected in str(caught.value)


def test_bad_strategy_flag_and_env_name_their_source() -> None:
    with pytest.raises(InputError) as caught:
        load_config(None, flags={"flags.plugin.deviceListStrategy": "envvar,mounts"})
    assert str(caught.value).startswith(
        'flag --device-list-strategy (config key "flags.plugin.deviceListStrategy[1]")'
    )
    assert "'mounts'" in str(caught.value)
    with pytest.raises(InputError) as caught:
        load_config(None, env={"DEVICE_ID_STRATEGY": "serial"})
    assert "DEVICE_ID_STRATEGY" in str(caught.value)
