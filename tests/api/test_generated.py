"""The committed generated code must match what `make proto` produces from the proto today."""

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nvplugin.api.v1beta1 import api_pb2

REPO = Path(__file__).resolve().parents[2]
PACKAGE = Path("nvplugin/api/v1beta1")


@pytest.mark.process
def test_committed_code_is_not_stale() -> None:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, str(REPO / "proto" / "generate.py"), out],
            check=True,
            capture_output=True,
        )
        generated = sorted(p.name for p in (Path(out) / PACKAGE).glob("api_pb2*"))
        assert generated == ["api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi"]
        for name in generated:
            fresh = (Path(out) / PACKAGE / name).read_text()
            committed = (REPO / PACKAGE / name).read_text()
            assert fresh == committed, f"{PACKAGE / name} is stale: run `make proto`"


def test_wire_names_and_numbers_match_the_kubelet_api() -> None:
    fd = api_pb2.DESCRIPTOR
    assert fd.package == "v1beta1"
    services = {s.name: [m.name for m in s.methods] for s in fd.services_by_name.values()}
    assert services == {
        "Registration": ["Register"],
        "DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
    fields = {
        (m.name, f.name): f.number for m in fd.message_types_by_name.values() for f in m.fields
    }
    expected = {
        ("DevicePluginOptions", "pre_start_required"): 1,
        ("DevicePluginOptions", "get_preferred_allocation_available"): 2,
        ("RegisterRequest", "version"): 1,
        ("RegisterRequest", "endpoint"): 2,
        ("RegisterRequest", "resource_name"): 3,
        ("RegisterRequest", "options"): 4,
        ("ListAndWatchResponse", "devices"): 1,
        ("TopologyInfo", "nodes"): 1,
        ("NUMANode", "ID"): 1,
        ("Device", "ID"): 1,
        ("Device", "health"): 2,
        ("Device", "topology"): 3,
        ("PreStartContainerRequest", "devices_ids"): 1,
        ("PreferredAllocationRequest", "container_requests"): 1,
        ("ContainerPreferredAllocationRequest", "available_deviceIDs"): 1,
        ("ContainerPreferredAllocationRequest", "must_include_deviceIDs"): 2,
        ("ContainerPreferredAllocationRequest", "allocation_size"): 3,
        ("PreferredAllocationResponse", "container_responses"): 1,
        ("ContainerPreferredAllocationResponse", "deviceIDs"): 1,
        ("AllocateRequest", "container_requests"): 1,
        ("ContainerAllocateRequest", "devices_ids"): 1,
        ("CDIDevice", "name"): 1,
        ("AllocateResponse", "container_responses"): 1,
        ("ContainerAllocateResponse", "envs"): 1,
        ("ContainerAllocateResponse", "mounts"): 2,
        ("ContainerAllocateResponse", "devices"): 3,
        ("ContainerAllocateResponse", "annotations"): 4,
        ("ContainerAllocateResponse", "cdi_devices"): 5,
        ("Mount", "container_path"): 1,
        ("Mount", "host_path"): 2,
        ("Mount", "read_only"): 3,
        ("DeviceSpec", "container_path"): 1,
        ("DeviceSpec", "host_path"): 2,
        ("DeviceSpec", "permissions"): 3,
    }
    assert fields == expected
    size = api_pb2.ContainerPreferredAllocationRequest.DESCRIPTOR.fields_by_name["allocation_size"]
    assert size.type == size.TYPE_INT32
    numa = api_pb2.NUMANode.DESCRIPTOR.fields_by_name["ID"]
    assert numa.type == numa.TYPE_INT64
