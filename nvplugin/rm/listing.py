"""What the kubelet receives in ListAndWatch, and how much of it it can receive.

:class:`Listing` builds a resource's device list for a health map (each device with its ID, the
health of the GPU it follows and its NUMA node) from fragments serialized once at start.

The kubelet reads the plugin's ListAndWatch stream with gRPC's default client limits: a message
over 4 MiB is refused by the kubelet's side, the stream breaks, and the node advertises nothing --
with nothing logged by the plugin. Time-slicing multiplies the devices in that one message (16
GPUs x 5000 replicas is about 5 MB), so the replicas a node can advertise are bounded, and the
bound is computed for the node from the exact encoding of its devices: ID lengths, NUMA
information, the longer health value. :func:`check_listing` refuses a plan over it, naming the
limit and the largest replica count that fits.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nvplugin.api import HEALTHY, UNHEALTHY
from nvplugin.api.v1beta1 import api_pb2
from nvplugin.errors import InputError
from nvplugin.node.model import Gpu
from nvplugin.rm.devices import REPLICA_SEPARATOR, Device

KUBELET_MAX_RECEIVE_BYTES = 4 * 1024 * 1024
"""gRPC's default maximum received message size, which the kubelet's device-manager client keeps."""


def device_message(device: Device, healthy: bool) -> api_pb2.Device:
    """The ListAndWatch entry for one advertised device: its ID, health and its GPU's NUMA node
    (replicas share their GPU's)."""
    message = api_pb2.Device(ID=device.id, health=HEALTHY if healthy else UNHEALTHY)
    if device.numa_node is not None:
        message.topology.nodes.add(ID=device.numa_node)
    return message


@dataclass(frozen=True)
class _Run:
    """Consecutive advertised devices of one GPU (a GPU and its replicas, or its MIG devices),
    serialized as a ListAndWatchResponse fragment for either state: ``encoded[healthy]``."""

    gpu: int
    encoded: tuple[bytes, bytes]  # [False] Unhealthy, [True] Healthy


class Listing:
    """A resource's ListAndWatch list for any health map, from each GPU's devices serialized once
    per state (a serialized message is the concatenation of its devices): parsing 8000 devices
    takes a few milliseconds, building them field by field several times that."""

    def __init__(self, devices: Sequence[Device]) -> None:
        runs = []
        for index, group in itertools.groupby(devices, key=lambda device: device.gpu.index):
            members = list(group)
            runs.append(_Run(index, (_encoded(members, False), _encoded(members, True))))
        self._runs = tuple(runs)

    def message(self, health: Mapping[int, bool]) -> api_pb2.ListAndWatchResponse:
        """The list with each device as healthy as ``health`` says its GPU is."""
        data = b"".join(run.encoded[health[run.gpu]] for run in self._runs)
        return api_pb2.ListAndWatchResponse.FromString(data)


def _encoded(devices: Sequence[Device], healthy: bool) -> bytes:
    listed = [device_message(device, healthy) for device in devices]
    return api_pb2.ListAndWatchResponse(devices=listed).SerializeToString()


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def entry_size(size: int) -> int:
    """Bytes a message of ``size`` bytes adds to its parent as one entry of a repeated field
    (a field number below 16): its tag, its length, itself."""
    return 1 + _varint_size(size) + size


def _entry_size(gpu: Gpu, id_length: int) -> int:
    """Bytes one device of ``gpu`` with an ID of ``id_length`` characters adds to the message,
    at its largest (Unhealthy)."""
    size = device_message(Device("x" * id_length, gpu), healthy=False).ByteSize()
    return entry_size(size)


def listing_size(units: Sequence[Gpu] | Sequence[Device], replicas: int) -> int:
    """The largest ListAndWatch message for ``units`` (GPUs, or a resource's unreplicated
    devices: its MIG devices) served with ``replicas`` devices each (1: not shared, IDs are
    UUIDs), exactly as encoded."""
    total = 0
    for unit in units:
        gpu, base = (unit.gpu, unit.id) if isinstance(unit, Device) else (unit, unit.uuid)
        if replicas <= 1:
            total += _entry_size(gpu, len(base.encode()))
            continue
        prefix = len(base.encode()) + len(REPLICA_SEPARATOR)
        low = 0
        while low < replicas:  # replica numbers grouped by their digit count
            digits = len(str(low))
            high = min(replicas, 10**digits)
            total += (high - low) * _entry_size(gpu, prefix + digits)
            low = high
    return total


def max_replicas(
    units: Sequence[Gpu] | Sequence[Device], limit: int = KUBELET_MAX_RECEIVE_BYTES
) -> int:
    """The most replicas per GPU (MIG device) whose listing fits in ``limit`` bytes."""
    low, high = 1, 1
    while listing_size(units, high) <= limit:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if listing_size(units, middle) <= limit:
            low = middle
        else:
            high = middle
    return low


def check_listing(
    name: str,
    units: Sequence[Gpu] | Sequence[Device],
    replicas: int,
    key: str,
    limit: int = KUBELET_MAX_RECEIVE_BYTES,
) -> None:
    """InputError naming ``key`` (the config key that set ``replicas``) when resource ``name``'s
    listing would not fit in ``limit`` bytes."""
    size = listing_size(units, replicas)
    if size <= limit:
        return
    fit = max_replicas(units, limit)
    what = "MIG device(s)" if any(isinstance(u, Device) and u.mig for u in units) else "GPU(s)"
    raise InputError(
        f'config key "{key}": {replicas} replicas of the {len(units)} {what} of {name} make a '
        f"ListAndWatch message of {size} bytes, over the {limit} bytes the kubelet's gRPC client "
        f"receives (its default limit); at most {fit} replicas fit on this node"
    )
