"""The resource manager: one served resource as the device-plugin server sees it.

The gRPC server (:mod:`nvplugin.plugin.server`) knows nothing about devices: it translates the
kubelet's requests into calls here and the answers back, and turns :class:`RequestError` into
INVALID_ARGUMENT. A :class:`ResourceManager` answers from values fixed when it is made (the
resource's devices and ID lookup, the listing fragments, the Allocate responder) and the policy it
is handed, so its methods never touch NVML and may run on any thread:

- :attr:`~ResourceManager.devices` and :meth:`~ResourceManager.listing`: what ListAndWatch
  advertises, for a health map of the GPUs the devices follow (:attr:`~ResourceManager.gpus`);
- :meth:`~ResourceManager.preferred`: GetPreferredAllocation per container, through the
  resource's policy (:mod:`nvplugin.rm.policies`) and, for replicas, the replica policy on top --
  :meth:`~ResourceManager.checked` (every container) then :meth:`~ResourceManager.prefer` (one
  container, one policy call), so that a caller can take them one at a time and stop between;
- :meth:`~ResourceManager.allocate`: the Allocate reply, a response per container.

Requests are checked before anything is answered: at most :data:`MAX_CONTAINER_REQUESTS`
containers, unknown or repeated IDs, must-include IDs not offered as available, a negative size,
more replicas than ``failRequestsGreaterThanOne`` allows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from nvplugin.allocator import AllocationError, Policy
from nvplugin.api.v1beta1 import api_pb2
from nvplugin.errors import shortened
from nvplugin.rm.devices import Device, sorted_replicas
from nvplugin.rm.listing import KUBELET_MAX_RECEIVE_BYTES, Listing, entry_size
from nvplugin.rm.plan import ServedResource
from nvplugin.rm.responses import Responder
from nvplugin.rm.sharing import Replicas


class RequestError(Exception):
    """A request the kubelet should not have sent; the server answers INVALID_ARGUMENT with this
    message."""


@dataclass(frozen=True)
class ContainerRequest:
    """One container's GetPreferredAllocation request, as IDs."""

    available: Sequence[str]
    must_include: Sequence[str]
    size: int


MAX_CONTAINER_REQUESTS = 8
"""Most container requests one GetPreferredAllocation or Allocate may name. The kubelet names one
(docs/kubelet-behaviour.md#device-allocation); the bound keeps a request's work to a few policy
calls and its reply well within what the kubelet receives, and room for a client that asks for a
pod's few containers at once. Why this number: docs/kubelet-behaviour.md#requests-per-call."""


def check_container_count(total: int, method: str) -> None:
    """RequestError when one ``method`` call names more than :data:`MAX_CONTAINER_REQUESTS`
    container requests."""
    if total > MAX_CONTAINER_REQUESTS:
        raise RequestError(
            f"{total} container requests in one {method}; at most {MAX_CONTAINER_REQUESTS} are "
            "answered (the kubelet sends one per call)"
        )


MAX_SHOWN_ID = 128

"""Longest device ID quoted whole in an error. The message travels in the gRPC status trailer,
which clients cap (8 KiB by default): a 1 MB ID quoted whole would turn INVALID_ARGUMENT into a
transport error on the kubelet's side."""


class ResourceManager:
    """One served resource (see the module docstring)."""

    def __init__(self, resource: ServedResource, responder: Responder | None = None) -> None:
        self.resource = resource
        self._responder = responder if responder is not None else Responder()
        self._devices = resource.devices
        self._by_id = {device.id: device for device in self._devices}
        self._gpus = tuple(gpu.index for gpu in resource.gpus)
        self._listing = Listing(self._devices)

    @property
    def name(self) -> str:
        return self.resource.name

    @property
    def devices(self) -> tuple[Device, ...]:
        """What ListAndWatch advertises, in unit order then replica order."""
        return self._devices

    @property
    def gpus(self) -> tuple[int, ...]:
        """The GPUs whose health the devices follow, in index order."""
        return self._gpus

    @property
    def replicas(self) -> Replicas:
        return self.resource.replicas

    def listing(self, health: Mapping[int, bool]) -> api_pb2.ListAndWatchResponse:
        """The ListAndWatch list when ``health`` (GPU index -> healthy, every GPU of
        :attr:`gpus`) holds."""
        return self._listing.message(health)

    def uuids(self) -> list[str]:
        """UUIDs of what it serves (its GPUs, or its MIG devices), in unit order."""
        return [device.uuid for device in self.resource.bases]

    def unhealthy_uuids(self, health: Mapping[int, bool]) -> list[str]:
        """UUIDs of its Unhealthy units under ``health`` (MIG devices: all of an Unhealthy
        parent's), in unit order."""
        return [device.uuid for device in self.resource.bases if not health[device.gpu.index]]

    # --- requests ---

    def preferred(self, policy: Policy, requests: Sequence[ContainerRequest]) -> list[list[str]]:
        """The preferred IDs for each container request, in order; RequestError for a bad one
        (impossible requests get ``[]``: the kubelet then chooses on its own): :meth:`checked`,
        then :meth:`prefer` for each."""
        return [self.prefer(policy, one) for one in self.checked(requests)]

    def checked(self, requests: Sequence[ContainerRequest]) -> list[CheckedRequest]:
        """Every container request checked, in order, before any is answered; RequestError for
        the first bad one (and for more than :data:`MAX_CONTAINER_REQUESTS`)."""
        total = len(requests)
        check_container_count(total, "GetPreferredAllocation")
        return [self._checked(request, number, total) for number, request in enumerate(requests)]

    def prefer(self, policy: Policy, request: CheckedRequest) -> list[str]:
        """The preferred IDs for one checked container request: one call of ``policy`` (within
        its budget)."""
        available, must_include, size = request.available, request.must_include, request.size
        try:
            if self.replicas.shared:  # replicas: counts per unit, then the policy among units
                picked = self.replicas.prefer(policy.allocate, available, must_include, size)
                return [device.id for device in picked]
            units = policy.allocate(
                [d.unit for d in available], [d.unit for d in must_include], size
            )
        except AllocationError as exc:  # the checks should make this unreachable
            raise RequestError(f"{request.where}: {exc}") from None
        by_unit = {device.unit: device for device in available}
        return [by_unit[u].id for u in sorted(units)]

    def allocate(self, requests: Sequence[Sequence[str]]) -> api_pb2.AllocateResponse:
        """The Allocate reply: each container's response for the IDs it was given, in order.
        RequestError, and nothing answered, when a request is bad, when there are more than
        :data:`MAX_CONTAINER_REQUESTS`, or when the reply would be larger than
        :data:`KUBELET_MAX_RECEIVE_BYTES`: the kubelet's gRPC client would refuse it (and the pod
        fail with a transport error that says nothing), so it is refused here, naming why."""
        total = len(requests)
        check_container_count(total, "Allocate")
        reply = api_pb2.AllocateResponse()
        size = 0
        for number, ids in enumerate(requests):
            devices = self._named(ids, _where("devices_ids", number, total))
            too_many = self.replicas.too_many(len(devices))
            if too_many is not None:
                raise RequestError(f"{_where('devices_ids', number, total)}: {too_many}")
            # Replicas back to their GPUs (MIG devices): the responder lists each once, in index
            # order (the container sees devices, not replicas).
            response = reply.container_responses.add()
            self._responder.fill(devices, response)
            size += entry_size(response.ByteSize())
            if size > KUBELET_MAX_RECEIVE_BYTES:
                raise RequestError(
                    f"the Allocate reply for {total} container request(s) would be larger than "
                    f"{KUBELET_MAX_RECEIVE_BYTES} bytes, the most the kubelet's gRPC client "
                    f"receives (it passed that at container request {number})"
                )
        return reply

    def _named(self, ids: Iterable[str], where: str) -> list[Device]:
        """The devices named by ``ids``, in unit (then replica) order; RequestError for unknown
        or repeated IDs."""
        seen: dict[str, Device] = {}
        for device_id in ids:
            device = self._by_id.get(device_id)
            if device is None:
                raise RequestError(f"{where}: unknown device {_shown_id(device_id)}")
            if device_id in seen:
                raise RequestError(f"{where}: device {_shown_id(device_id)} listed twice")
            seen[device_id] = device
        return sorted_replicas(list(seen.values()))

    def _checked(self, request: ContainerRequest, number: int, total: int) -> CheckedRequest:
        available = self._named(request.available, _where("available_deviceIDs", number, total))
        must_include = self._named(
            request.must_include, _where("must_include_deviceIDs", number, total)
        )
        offered = {device.id for device in available}
        for device in must_include:
            if device.id not in offered:
                where = _where("must_include_deviceIDs", number, total)
                raise RequestError(f"{where}: device {device.id} is not in available_deviceIDs")
        size = request.size
        if size < 0:
            raise RequestError(f"{_where('allocation_size', number, total)}: {size} is negative")
        return CheckedRequest(available, must_include, size, _where("request", number, total))


@dataclass(frozen=True)
class CheckedRequest:
    """A container request whose IDs are known devices and whose size is not negative;
    ``where``: which request it is, for an error."""

    available: list[Device]
    must_include: list[Device]
    size: int
    where: str


def _shown_id(device_id: str) -> str:
    return shortened(device_id, MAX_SHOWN_ID)


def _where(field: str, number: int, total: int) -> str:
    """Where a bad value is: the field, and which container when there are several."""
    return field if total <= 1 else f"container request {number}: {field}"
