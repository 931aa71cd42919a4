"""The committed generated code must match what `make proto` produces from the proto today."""

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nvplugin.api.podresources.v1 import api_pb2 as podresources_pb2
from nvplugin.api.v1beta1 import api_pb2

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (Path("nvplugin/api/v1beta1"), Path("nvplugin/api/podresources/v1"))


@pytest.mark.process
def test_committed_code_is_not_stale() -> None:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, str(REPO / "proto" / "generate.py"), out],
            check=True,
            capture_output=True,
        )
        for package in PACKAGES:
            generated = sorted(p.name for p in (Path(out) / package).glob("api_pb2*"))
            assert generated == [
                "api_pb2.py",
                "api_pb2.pyi",
                "api_pb2_grpc.py",
                "api_pb2_grpc.pyi",
            ]
            for name in generated:
                fresh = (Path(out) / package / name).read_text()
                committed = (REPO / package / name).read_text()
                assert fresh == committed, f"{package / name} is stale: run `make proto`"


def test_podresources_wire_names_and_numbers_match_the_kubelet_api() -> None:
    fd = podresources_pb2.DESCRIPTOR
    assert fd.package == "v1"
    services = {s.name: [m.name for m in s.methods] for s in fd.services_by_name.values()}
    assert services == {"PodResourcesLister": ["List", "GetAllocatableResources", "Get"]}
    fields = {
        (m.name, f.name): (f.number, f.type, f.is_repeated)
        for m in fd.message_types_by_name.values()
        for f in m.fields
    }
    S, I64, U64, M = (9, 3, 4, 11)  # FieldDescriptor.TYPE_STRING, _INT64, _UINT64, _MESSAGE
    assert fields == {
        ("AllocatableResourcesResponse", "devices"): (1, M, True),
        ("AllocatableResourcesResponse", "cpu_ids"): (2, I64, True),
        ("AllocatableResourcesResponse", "memory"): (3, M, True),
        ("ListPodResourcesResponse", "pod_resources"): (1, M, True),
        ("PodResources", "name"): (1, S, False),
        ("PodResources", "namespace"): (2, S, False),
        ("PodResources", "containers"): (3, M, True),
        ("ContainerResources", "name"): (1, S, False),
        ("ContainerResources", "devices"): (2, M, True),
        ("ContainerResources", "cpu_ids"): (3, I64, True),
        ("ContainerResources", "memory"): (4, M, True),
        ("ContainerResources", "dynamic_resources"): (5, M, True),
        ("ContainerMemory", "memory_type"): (1, S, False),
        ("ContainerMemory", "size"): (2, U64, False),
        ("ContainerMemory", "topology"): (3, M, False),
        ("ContainerDevices", "resource_name"): (1, S, False),
        ("ContainerDevices", "device_ids"): (2, S, True),
        ("ContainerDevices", "topology"): (3, M, False),
        ("TopologyInfo", "nodes"): (1, M, True),
        ("NUMANode", "ID"): (1, I64, False),
        ("DynamicResource", "claim_name"): (2, S, False),
        ("DynamicResource", "claim_namespace"): (3, S, False),
        ("DynamicResource", "claim_resources"): (4, M, True),
        ("ClaimResource", "cdi_devices"): (1, M, True),
        ("ClaimResource", "driver_name"): (2, S, False),
        ("ClaimResource", "pool_name"): (3, S, False),
        ("ClaimResource", "device_name"): (4, S, False),
        ("CDIDevice", "name"): (1, S, False),
        ("GetPodResourcesRequest", "pod_name"): (1, S, False),
        ("GetPodResourcesRequest", "pod_namespace"): (2, S, False),
        ("GetPodResourcesResponse", "pod_resources"): (1, M, False),
    }


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
