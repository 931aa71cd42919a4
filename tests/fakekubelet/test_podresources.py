"""The fake kubelet's pod resources API answers what its managers hold: asked over its real unix
socket while the real plugin (``nvplugin serve --simulate``) serves the devices, for MIG devices
under the mixed strategy, time-sliced replicas, several resources, and static CPUs."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import grpc
import pytest

from nvplugin.admit.admission import Admission, AdmitSettings
from nvplugin.api.podresources.v1 import api_pb2, api_pb2_grpc
from nvplugin.fakekubelet.podresources import listed_containers
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.nodesession import load_topology
from tests.support.nrt import pod_resources_answers
from tests.support.tinyplugin import run

pytestmark = pytest.mark.process  # each test runs nvplugin serve

Row = tuple[str, str, str, str, tuple[int, ...]]


def _guaranteed(name: str, cpus: int, **extended: int) -> Container:
    limits: dict[str, str | int] = {"cpu": cpus, "memory": "1Gi"}
    limits.update(extended)
    return Container.of(name, limits=limits)


def _device_rows(answer: api_pb2.ListPodResourcesResponse) -> set[Row]:
    rows = set()
    for pod in answer.pod_resources:
        for container in pod.containers:
            for entry in container.devices:
                assert len(entry.device_ids) == 1  # one entry per device and NUMA node
                nodes = tuple(n.ID for n in entry.topology.nodes)
                rows.add(
                    (pod.name, container.name, entry.resource_name, entry.device_ids[0], nodes)
                )
    return rows


def _cpu_rows(answer: api_pb2.ListPodResourcesResponse) -> dict[tuple[str, str], tuple[int, ...]]:
    return {
        (pod.name, c.name): tuple(c.cpu_ids)
        for pod in answer.pod_resources
        for c in pod.containers
        if c.cpu_ids
    }


def _held(
    admission: Admission, pods: list[Pod]
) -> tuple[set[Row], dict[tuple[str, str], tuple[int, ...]]]:
    """What the managers hold for the listed containers, NUMA nodes as the plugin reported them."""
    devices, cpus = set(), {}
    for pod in pods:
        for container in listed_containers(pod):
            for resource in admission.devices.resources():
                held = admission.devices.container_devices(pod.uid, container.name, resource)
                numa = admission.devices.device_numa(resource)
                for device in held or ():
                    devices |= {
                        (pod.name, container.name, resource, device, (n,)) for n in numa[device]
                    }
            if admission.cpus.cpus(pod.uid, container.name):
                cpus[(pod.name, container.name)] = admission.cpus.cpus(pod.uid, container.name)
    return devices, cpus


def test_mig_several_resources_and_static_cpus() -> None:
    settings = AdmitSettings(
        simulate="dgx-a100-mig",
        mig_strategy="mixed",
        cpu_manager_policy="static",
        reserved_cpus="0",
        topology_manager_policy="best-effort",
    )
    topology = load_topology("dgx-a100-mig")

    async def main() -> None:
        async with Admission(settings, topology) as admission:
            resources = sorted(
                (r for r in admission.devices.resources() if "mig-" in r),
                key=lambda r: -len(admission.devices.healthy_devices(r)),
            )
            first, second = resources[:2]
            assert len(admission.devices.healthy_devices(second)) >= 3
            sidecar = Container.of(
                "sidecar", limits={"cpu": 1, "memory": "1Gi", first: 1}, restart_policy="Always"
            )
            init = Container.of("init", limits={"cpu": 1, "memory": "1Gi", second: 1})
            pods = [
                Pod.of("a", [_guaranteed("main", 2), _guaranteed("gpu", 1, **{first: 1})]),
                Pod.of(
                    "b",
                    [Container.of("app", limits={"cpu": 2, "memory": "1Gi", first: 1, second: 1})],
                    init_containers=[init, sidecar],
                ),
                Pod.of("c", [Container.of("app", limits={second: 2})], namespace="other"),
            ]
            for pod in pods:
                assert (await admission.admit(pod)).admitted
            listed, allocatable = await pod_resources_answers(admission.pod_resources.socket_path)
            devices, cpus = _held(admission, pods)
            assert _device_rows(listed) == devices
            assert {r[2] for r in devices} == {first, second}
            assert _cpu_rows(listed) == cpus
            assert set(cpus) == {("a", "main"), ("a", "gpu"), ("b", "sidecar"), ("b", "app")}
            assert [(p.name, p.namespace) for p in listed.pod_resources] == [
                ("a", "default"),
                ("b", "default"),
                ("c", "other"),
            ]
            # Sidecars are listed, regular init containers are not, app containers last.
            assert [c.name for c in listed.pod_resources[1].containers] == ["sidecar", "app"]
            # Allocatable: every healthy device with its NUMA node; the CPUs but the reserved.
            healthy = {
                (e.resource_name, e.device_ids[0], tuple(n.ID for n in e.topology.nodes))
                for e in allocatable.devices
            }
            assert healthy == {
                (r, d, (n,))
                for r in admission.devices.resources()
                for d in admission.devices.healthy_devices(r)
                for n in admission.devices.device_numa(r)[d]
            }
            assert sorted(allocatable.cpu_ids) == [c.id for c in topology.cpus.cpus if c.id != 0]
            assert not allocatable.memory  # no memory manager: the kubelet's None policy

            # A deleted pod is gone from List; Get answers one pod, or the kubelet's error.
            admission.delete(pods[0].uid)
            listed, _ = await pod_resources_answers(admission.pod_resources.socket_path)
            assert [p.name for p in listed.pod_resources] == ["b", "c"]
            assert _device_rows(listed) == _held(admission, pods[1:])[0]
            async with grpc.aio.insecure_channel(
                f"unix://{admission.pod_resources.socket_path}"
            ) as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                got = await stub.Get(
                    api_pb2.GetPodResourcesRequest(pod_name="c", pod_namespace="other"), timeout=10
                )
                assert got.pod_resources == listed.pod_resources[1]
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await stub.Get(
                        api_pb2.GetPodResourcesRequest(pod_name="a", pod_namespace="default"),
                        timeout=10,
                    )
                assert error.value.details() == "pod a not found in default"

    run(main())


def test_replicas() -> None:
    config_dir = tempfile.mkdtemp()
    config = Path(config_dir, "ts.yaml")
    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
        "      replicas: 3\n"
    )
    settings = AdmitSettings(simulate="dgx-1", config=str(config))

    async def main() -> None:
        async with Admission(settings, load_topology("dgx-1")) as admission:
            pods = [
                Pod.of(f"p{i}", [Container.of("app", limits={"nvidia.com/gpu": 2})])
                for i in range(3)
            ]
            for pod in pods:
                assert (await admission.admit(pod)).admitted
            listed, allocatable = await pod_resources_answers(admission.pod_resources.socket_path)
            devices, cpus = _held(admission, pods)
            assert _device_rows(listed) == devices
            assert len(devices) == 6 and all("::" in row[3] for row in devices)
            assert _cpu_rows(listed) == cpus == {}
            assert len(allocatable.devices) == 8 * 3
            assert not allocatable.cpu_ids  # CPU manager policy none: nothing exclusive

    try:
        run(main())
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)
