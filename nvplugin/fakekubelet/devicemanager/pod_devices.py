"""Which devices each container holds (the kubelet's ``pod_devices.go``): pod UID -> container ->
resource -> :class:`ContainerAllocation`, with the plugin's Allocate answer kept beside the
devices, as the checkpoint stores them (docs/kubelet-behaviour.md#device-allocation).

The kubelet's ``allocatedDevices`` (what containers hold, per resource) is derived from it
(:meth:`PodDevices.devices`), as is the checkpoint's ``PodDeviceEntries`` (both ways), and the
environment a container gets from its responses (:meth:`PodDevices.container_envs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import structlog

import nvplugin.fakekubelet.devicemanager.checkpoint as ckpt
from nvplugin.api.v1beta1 import api_pb2

_log = structlog.get_logger("nvplugin.fakekubelet.devicemanager")


@dataclass(frozen=True, eq=False)
class ContainerAllocation:
    """The devices one container holds for one resource (the kubelet's ``deviceAllocateInfo``).

    ``by_numa`` groups them by NUMA node as the checkpoint stores them (-1 = no NUMA info);
    ``response`` is the first container response of the plugin's Allocate answer.
    """

    pod_uid: str
    container: str
    resource: str
    device_ids: frozenset[str]
    by_numa: Mapping[int, tuple[str, ...]]
    response: api_pb2.ContainerAllocateResponse


def by_numa_node(
    devices: Iterable[str], numa: Mapping[str, tuple[int, ...]]
) -> dict[int, list[str]]:
    """``devices`` grouped by NUMA node (a device on several nodes under each; none: -1),
    nodes in order, devices in the order given."""
    groups: dict[int, list[str]] = {}
    for d in devices:
        for node in numa.get(d) or (ckpt.NO_NUMA,):
            groups.setdefault(node, []).append(d)
    return dict(sorted(groups.items()))


class PodDevices:
    """Every container's allocations (see module doc)."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, dict[str, ContainerAllocation]]] = {}

    def insert(self, allocation: ContainerAllocation) -> None:
        containers = self._pods.setdefault(allocation.pod_uid, {})
        containers.setdefault(allocation.container, {})[allocation.resource] = allocation

    def get(self, pod_uid: str, container: str, resource: str) -> ContainerAllocation | None:
        return self._pods.get(pod_uid, {}).get(container, {}).get(resource)

    def container(self, pod_uid: str, container: str) -> dict[str, ContainerAllocation]:
        """What the container holds, by resource."""
        return dict(self._pods.get(pod_uid, {}).get(container, {}))

    def pod_devices(self, pod_uid: str, resource: str) -> frozenset[str]:
        """Devices of ``resource`` held by any container of the pod."""
        out: set[str] = set()
        for resources in self._pods.get(pod_uid, {}).values():
            entry = resources.get(resource)
            if entry is not None:
                out |= entry.device_ids
        return frozenset(out)

    def allocations(self) -> list[ContainerAllocation]:
        """Every container allocation, by pod UID, container and resource."""
        return [
            entry
            for uid in sorted(self._pods)
            for container in sorted(self._pods[uid])
            for _, entry in sorted(self._pods[uid][container].items())
        ]

    def pods(self) -> frozenset[str]:
        """UIDs of the pods holding devices."""
        return frozenset(self._pods)

    def remove(self, pod_uids: Iterable[str]) -> list[str]:
        """Forget the pods; the UIDs that held anything."""
        return [uid for uid in pod_uids if self._pods.pop(uid, None) is not None]

    def devices(self) -> dict[str, set[str]]:
        """``podDevices.devices()``: what containers hold, per resource."""
        allocated: dict[str, set[str]] = {}
        for entry in self.allocations():
            allocated.setdefault(entry.resource, set()).update(entry.device_ids)
        return allocated

    def container_envs(self, pod_uid: str, container: str) -> dict[str, str]:
        """The environment from the container's Allocate responses, resources in name order;
        the first value of a name wins."""
        envs: dict[str, str] = {}
        for _, entry in sorted(self.container(pod_uid, container).items()):
            for name, value in entry.response.envs.items():
                envs.setdefault(name, value)
        return envs

    # --- checkpoint ------------------------------------------------------------------------

    def to_entries(self) -> tuple[ckpt.PodDevicesEntry, ...]:
        return tuple(
            ckpt.PodDevicesEntry(
                pod_uid=e.pod_uid,
                container_name=e.container,
                resource_name=e.resource,
                device_ids=dict(e.by_numa),
                alloc_resp=e.response.SerializeToString(),
            )
            for e in self.allocations()
        )

    @classmethod
    def from_entries(cls, entries: Iterable[ckpt.PodDevicesEntry]) -> PodDevices:
        """What a checkpoint's entries say; an entry whose Allocate answer does not parse is
        logged and skipped, as the kubelet does."""
        pods = cls()
        for entry in entries:
            response = api_pb2.ContainerAllocateResponse()
            try:
                response.ParseFromString(entry.alloc_resp)
            except Exception as exc:  # protobuf's DecodeError; the kubelet skips the entry
                _log.error("cannot unmarshal allocResp", pod=entry.pod_uid, error=str(exc))
                continue
            pods.insert(
                ContainerAllocation(
                    entry.pod_uid,
                    entry.container_name,
                    entry.resource_name,
                    entry.all_device_ids(),
                    dict(entry.device_ids),
                    response,
                )
            )
        return pods
