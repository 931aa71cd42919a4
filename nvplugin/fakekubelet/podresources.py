"""The fake kubelet's pod resources API (the kubelet's ``pkg/kubelet/apis/podresources``, v1):
``List``, ``GetAllocatableResources`` and ``Get`` on ``<kubelet root>/pod-resources/kubelet.sock``,
answered from what the managers hold, as the kubelet answers them:

- ``List``: every active pod, and for each its app containers (and restartable init containers,
  listed first, as the kubelet does with sidecars on); regular init containers are not listed. A
  container's devices come one entry per device and NUMA node, with the NUMA node the plugin
  reported when it was allocated (the device manager's checkpoint form; none: no topology), its
  CPUs are the exclusive ones of the static CPU manager, its memory the memory manager's blocks.
- ``GetAllocatableResources``: every healthy device with the NUMA nodes its plugin reports, the
  CPUs the static policy may give exclusively (every online CPU but the reserved ones; none under
  policy ``none``), the memory manager's blocks.
- ``Get``: one pod by name and namespace; an unknown pod is the kubelet's error text.

The fake kubelet has no memory manager (the kubelet's ``None`` policy): memory lists are empty,
as the kubelet's are under that policy. Answers are built on the loop that owns the managers, from
their state at that moment: no copy is kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence

import grpc
import structlog

from nvplugin.api.podresources import POD_RESOURCES_SOCKET
from nvplugin.api.podresources.v1 import api_pb2, api_pb2_grpc
from nvplugin.fakekubelet.cpumanager import POLICY_STATIC, CpuManager
from nvplugin.fakekubelet.devicemanager.checkpoint import NO_NUMA
from nvplugin.fakekubelet.devicemanager.manager import DeviceManager
from nvplugin.fakekubelet.pods import Container, Pod

_log = structlog.get_logger("nvplugin.fakekubelet.podresources")

PodsSource = Callable[[], Iterable[Pod]]
"""The active pods (the kubelet's pod manager), in the order they were admitted."""


def _topology(nodes: Sequence[int]) -> api_pb2.TopologyInfo | None:
    if not nodes:
        return None
    return api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in nodes])


def _device_entries(
    resource: str, devices: Iterable[tuple[str, Sequence[int]]]
) -> list[api_pb2.ContainerDevices]:
    """One entry per device and NUMA node (a device without NUMA node: one, no topology), as the
    kubelet's ``containerDevicesFromResourceDeviceInstances`` writes them."""
    out = []
    for device, nodes in devices:
        for node in nodes or (None,):
            out.append(
                api_pb2.ContainerDevices(
                    resource_name=resource,
                    device_ids=[device],
                    topology=_topology(() if node is None else (node,)),
                )
            )
    return out


def listed_containers(pod: Pod) -> tuple[Container, ...]:
    """The containers ``List`` reports: restartable init containers, then app containers."""
    return tuple(c for c in pod.init_containers if c.restartable) + pod.containers


def container_resources(
    pod: Pod, container: Container, devices: DeviceManager, cpus: CpuManager | None
) -> api_pb2.ContainerResources:
    entries: list[api_pb2.ContainerDevices] = []
    for resource in devices.resources():
        allocation = devices.container_allocation(pod.uid, container.name, resource)
        if allocation is None:
            continue
        numa: dict[str, list[int]] = {}
        for node, ids in sorted(allocation.by_numa.items()):
            for device in ids:
                nodes = numa.setdefault(device, [])
                if node != NO_NUMA:
                    nodes.append(node)
        ordered = devices.ordered(resource, numa)
        entries += _device_entries(resource, ((d, numa[d]) for d in ordered))
    cpu_ids = cpus.cpus(pod.uid, container.name) if cpus is not None else ()
    return api_pb2.ContainerResources(name=container.name, devices=entries, cpu_ids=cpu_ids)


def pod_resources(
    pod: Pod, devices: DeviceManager, cpus: CpuManager | None
) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[container_resources(pod, c, devices, cpus) for c in listed_containers(pod)],
    )


def list_response(
    pods: Iterable[Pod], devices: DeviceManager, cpus: CpuManager | None
) -> api_pb2.ListPodResourcesResponse:
    return api_pb2.ListPodResourcesResponse(
        pod_resources=[pod_resources(p, devices, cpus) for p in pods]
    )


def allocatable_cpus(cpus: CpuManager | None) -> tuple[int, ...]:
    """What the CPU manager may give exclusively: every online CPU but the reserved ones under
    the static policy, none under ``none``."""
    if cpus is None or cpus.policy != POLICY_STATIC:
        return ()
    return tuple(sorted({c.id for c in cpus.layout.cpus} - cpus.reserved))


def allocatable_response(
    devices: DeviceManager, cpus: CpuManager | None
) -> api_pb2.AllocatableResourcesResponse:
    entries: list[api_pb2.ContainerDevices] = []
    for resource in devices.resources():
        healthy = devices.healthy_devices(resource)
        numa = devices.device_numa(resource)
        ordered = devices.ordered(resource, healthy)
        entries += _device_entries(resource, ((d, numa.get(d, ())) for d in ordered))
    return api_pb2.AllocatableResourcesResponse(devices=entries, cpu_ids=allocatable_cpus(cpus))


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, pods: PodsSource, devices: DeviceManager, cpus: CpuManager | None) -> None:
        self._pods = pods
        self._devices = devices
        self._cpus = cpus

    async def List(
        self,
        request: api_pb2.ListPodResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.ListPodResourcesResponse:
        return list_response(self._pods(), self._devices, self._cpus)

    async def GetAllocatableResources(
        self,
        request: api_pb2.AllocatableResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.AllocatableResourcesResponse:
        return allocatable_response(self._devices, self._cpus)

    async def Get(
        self,
        request: api_pb2.GetPodResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.GetPodResourcesResponse:
        for pod in self._pods():
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return api_pb2.GetPodResourcesResponse(
                    pod_resources=pod_resources(pod, self._devices, self._cpus)
                )
        await context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} not found in {request.pod_namespace}",
        )
        raise AssertionError("abort returns only by raising")


class PodResourcesServer:
    """Serves the pod resources API on ``<directory>/kubelet.sock`` (the directory is created
    mode 0750 when missing; a stale socket file is removed, as the kubelet does)."""

    def __init__(
        self,
        directory: str,
        pods: PodsSource,
        devices: DeviceManager,
        cpus: CpuManager | None = None,
    ) -> None:
        self.directory = directory
        self.socket_path = os.path.join(directory, POD_RESOURCES_SOCKET)
        self._servicer = _Servicer(pods, devices, cpus)
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        if self._server is not None:
            return
        os.makedirs(self.directory, mode=0o750, exist_ok=True)
        if os.path.lexists(self.socket_path):
            os.unlink(self.socket_path)
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self._servicer, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        _log.info("pod resources serving", socket=self.socket_path)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
