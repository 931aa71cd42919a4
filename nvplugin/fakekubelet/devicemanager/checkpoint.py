"""The device manager's checkpoint file, ``<dir>/kubelet_internal_checkpoint``.

The kubelet writes it after every device update and every allocation, and reads it back when it
starts, so that devices held by running containers stay taken across a kubelet restart (until
their plugin registers again, the resource has capacity 0). The layout mirrors upstream's JSON::

    {"Data": {"PodDeviceEntries": [{"PodUID": ..., "ContainerName": ..., "ResourceName": ...,
                                    "DeviceIDs": {"<NUMA node>": [ids...], "-1": [...]},
                                    "AllocResp": "<base64 of the ContainerAllocateResponse>"}],
              "RegisteredDevices": {"<resource>": [healthy ids...]}},
     "Checksum": <uint>}

``DeviceIDs`` groups a container's devices by NUMA node (``-1`` = the device had no NUMA
information); ``AllocResp`` is the serialized protobuf, base64 as Go's JSON encodes ``[]byte``.

One difference from upstream, on purpose: upstream's checksum is FNV-32a over a Go ``spew`` dump
of the data structure, which cannot be reproduced outside Go. Ours is FNV-32a over the canonical
JSON of ``Data`` (sorted keys, no blanks). It serves the same purpose -- a torn or hand-edited
file is detected and ignored rather than trusted -- but a real kubelet would not accept our file,
nor we its.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from nvplugin.errors import NvpluginError

CHECKPOINT_FILE = "kubelet_internal_checkpoint"
NO_NUMA = -1
"""The NUMA key for devices without NUMA information (the kubelet's ``nodeWithoutTopology``)."""


_log = structlog.get_logger("nvplugin.fakekubelet.devicemanager")


class CheckpointError(NvpluginError):
    """The checkpoint file exists but cannot be used (corrupt, wrong checksum, wrong shape)."""


@dataclass(frozen=True)
class PodDevicesEntry:
    """One container's devices of one resource, and the plugin's Allocate answer for them."""

    pod_uid: str
    container_name: str
    resource_name: str
    device_ids: Mapping[int, tuple[str, ...]]  # NUMA node (-1 = none) -> device IDs
    alloc_resp: bytes  # serialized v1beta1.ContainerAllocateResponse

    def all_device_ids(self) -> frozenset[str]:
        return frozenset(d for ids in self.device_ids.values() for d in ids)


@dataclass(frozen=True)
class CheckpointData:
    entries: tuple[PodDevicesEntry, ...] = ()
    registered_devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def checkpoint_path(directory: str) -> str:
    return os.path.join(directory, CHECKPOINT_FILE)


def fnv32a(data: bytes) -> int:
    """FNV-1a, 32 bits (the hash upstream's checkpoint checksum uses)."""
    h = 0x811C9DC5
    for byte in data:
        h ^= byte
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def _data_json(data: CheckpointData) -> dict[str, Any]:
    entries = sorted(data.entries, key=lambda e: (e.pod_uid, e.container_name, e.resource_name))
    return {
        "PodDeviceEntries": [
            {
                "PodUID": e.pod_uid,
                "ContainerName": e.container_name,
                "ResourceName": e.resource_name,
                "DeviceIDs": {str(node): sorted(ids) for node, ids in sorted(e.device_ids.items())},
                "AllocResp": base64.b64encode(e.alloc_resp).decode("ascii"),
            }
            for e in entries
        ],
        "RegisteredDevices": {
            resource: sorted(ids) for resource, ids in sorted(data.registered_devices.items())
        },
    }


def _checksum(data_json: Mapping[str, Any]) -> int:
    return fnv32a(json.dumps(data_json, sort_keys=True, separators=(",", ":")).encode())


def encode(data: CheckpointData) -> bytes:
    """The file's bytes for ``data`` (with its checksum)."""
    body = _data_json(data)
    return json.dumps({"Data": body, "Checksum": _checksum(body)}, indent=1).encode() + b"\n"


def decode(blob: bytes, source: str = CHECKPOINT_FILE) -> CheckpointData:
    """Parse and verify a checkpoint; :class:`CheckpointError` says what is wrong."""
    try:
        doc = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{source}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("Data"), dict):
        raise CheckpointError(f"{source}: no Data object")
    body = doc["Data"]
    if doc.get("Checksum") != _checksum(body):
        raise CheckpointError(f"{source}: checksum mismatch (the file is corrupt)")
    try:
        entries = tuple(_entry(raw) for raw in body.get("PodDeviceEntries") or [])
        registered = {
            str(resource): tuple(str(i) for i in (ids or []))
            for resource, ids in (body.get("RegisteredDevices") or {}).items()
        }
    except (TypeError, ValueError, KeyError, AttributeError, binascii.Error) as exc:
        raise CheckpointError(f"{source}: malformed entry: {exc}") from None
    return CheckpointData(entries, registered)


def _entry(raw: Mapping[str, Any]) -> PodDevicesEntry:
    return PodDevicesEntry(
        pod_uid=str(raw["PodUID"]),
        container_name=str(raw["ContainerName"]),
        resource_name=str(raw["ResourceName"]),
        device_ids={
            int(node): tuple(str(i) for i in ids) for node, ids in raw["DeviceIDs"].items()
        },
        alloc_resp=base64.b64decode(raw.get("AllocResp") or "", validate=True),
    )


def write_checkpoint(directory: str, data: CheckpointData) -> None:
    """Write atomically (temp file + rename): a reader never sees half a checkpoint."""
    blob = encode(data)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{CHECKPOINT_FILE}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, checkpoint_path(directory))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_checkpoint(directory: str) -> CheckpointData | None:
    """The checkpoint in ``directory``; None when there is none. Raises CheckpointError."""
    path = checkpoint_path(directory)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return decode(blob, path)


class CheckpointFile:
    """The device manager's checkpoint in ``directory`` (None: it keeps none), read and written
    with the kubelet's manners: a write follows every device update and every allocation and
    never fails them (an error is logged); on start, a missing file means a fresh node and an
    unusable one is logged and ignored."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.writes = 0
        """Checkpoints written so far."""

    def write(self, data: CheckpointData) -> None:
        if self.directory is None:
            return
        try:
            write_checkpoint(self.directory, data)
        except OSError as exc:
            _log.error("failed to write checkpoint file", error=str(exc))
            return
        self.writes += 1

    def read(self) -> CheckpointData | None:
        """The data on start: empty for a fresh node; None when there is nothing to go by (no
        directory, or a file that cannot be used: logged), so the manager keeps what it has."""
        if self.directory is None:
            return None
        try:
            data = read_checkpoint(self.directory)
        except CheckpointError as exc:
            _log.error("continue after failing to read checkpoint file", error=str(exc))
            return None
        return data if data is not None else CheckpointData()
