"""Which GPUs a container sees, read from Allocate responses in every form NVIDIA's toolkit reads:
``NVIDIA_VISIBLE_DEVICES``, volume mounts, CDI devices and CDI annotations, by UUID or index."""

from __future__ import annotations

import pytest

from nvplugin.admit.visible import Visible, device_names, resolve, visible_devices
from nvplugin.api.v1beta1 import api_pb2
from nvplugin.nodesession import load_topology

TOPOLOGY = load_topology("dgx-a100-mig")
GPU6 = TOPOLOGY.gpus[6].uuid
MIG_2_1 = TOPOLOGY.gpus[2].mig_devices[1].uuid


def response(**fields: object) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(**fields)  # type: ignore[arg-type]


def mounts(*names: str) -> list[api_pb2.Mount]:
    return [
        api_pb2.Mount(
            container_path=f"/var/run/nvidia-container-devices/{n}", host_path="/dev/null"
        )
        for n in names
    ]


FORMS = {
    "envvar, UUIDs": response(envs={"NVIDIA_VISIBLE_DEVICES": f"{MIG_2_1},{GPU6}"}),
    "envvar, indices": response(envs={"NVIDIA_VISIBLE_DEVICES": "6,2:1"}),
    "volume-mounts": response(
        envs={"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
        mounts=mounts("2:1", GPU6),
    ),
    "cdi-cri": response(
        cdi_devices=[api_pb2.CDIDevice(name=f"nvidia.com/gpu={n}") for n in (GPU6, "2:1")]
    ),
    "cdi-annotations": response(
        annotations={"cdi.k8s.io/nvplugin_0123": f"nvidia.com/gpu={MIG_2_1},nvidia.com/gpu=6"}
    ),
}


@pytest.mark.parametrize("form", FORMS)
def test_every_form_names_the_same_devices(form: str) -> None:
    assert visible_devices(TOPOLOGY, FORMS[form]) == [Visible(2, 1), Visible(6)]


def test_forms_together_count_each_device_once() -> None:
    both = response(
        envs={"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
        mounts=mounts("6"),
        cdi_devices=[api_pb2.CDIDevice(name="nvidia.com/gpu=6")],
    )
    assert device_names(both) == ["6"]
    assert visible_devices(TOPOLOGY, both) == [Visible(6)]


@pytest.mark.parametrize(
    "env", ["void", "none", "all", "", "9", "2:9", "x:1", "GPU-unknown", "6:0", "-1"]
)
def test_what_names_no_device_of_the_node_is_left_out(env: str) -> None:
    assert visible_devices(TOPOLOGY, response(envs={"NVIDIA_VISIBLE_DEVICES": env})) == []


def test_other_mounts_cdi_kinds_and_annotations_are_not_devices() -> None:
    other = response(
        mounts=[api_pb2.Mount(container_path="/usr/lib/libcuda.so", host_path="/x")],
        cdi_devices=[api_pb2.CDIDevice(name="vendor.com/fpga=0")],
        annotations={"example.com/note": "nvidia.com/gpu"},
    )
    assert device_names(other) == []


def test_labels_and_order() -> None:
    assert resolve(TOPOLOGY, MIG_2_1) == Visible(2, 1)
    assert Visible(2, 1).label == "2:1" and Visible(6).label == "6"
    ordered = sorted([Visible(6), Visible(2, 1), Visible(2)], key=lambda v: v.index)
    assert ordered == [Visible(2), Visible(2, 1), Visible(6)]
