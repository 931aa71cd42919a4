"""NFD's pod fingerprint (the ``podfingerprint`` package, format ``pfp0v001``): what a
NodeResourceTopology's ``nodeTopologyPodsFingerprint`` attribute says, so that the NRT scheduler
plugin's reserve cache can tell when the node's pods are the ones it expects and resync.

The algorithm, as the package defines it: each pod (namespace, name) hashes to XXH64(name, seed =
XXH64(namespace, seed 0)); the hashes are sorted, each written as 8 little-endian bytes, and the
whole hashed again with XXH64 (seed 0); the sign is ``pfp0`` + ``v001`` + that sum's 8 bytes,
big-endian, in hex. NFD's topology-updater fingerprints every pod the kubelet's podresources
``List`` returns (the method ``all``, the default the scheduler plugin assumes).

XXH64 is written here (a few lines over Python integers) rather than taken from a package: the
fingerprint of a node's pods is a few dozen short strings, once per change.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

PREFIX = "pfp0"
VERSION = "v001"
ATTRIBUTE = "nodeTopologyPodsFingerprint"
"""The NRT attribute name the podfingerprint package recommends and NFD writes."""

_MASK = (1 << 64) - 1
_P1 = 11400714785074694791
_P2 = 14029467366897019727
_P3 = 1609587929392839161
_P4 = 9650029242287828579
_P5 = 2870177450012600261


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (64 - bits))) & _MASK


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _MASK
    return (_rotl(acc, 31) * _P1) & _MASK


def _merge(acc: int, value: int) -> int:
    acc ^= _round(0, value)
    return (acc * _P1 + _P4) & _MASK


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data`` (the 64-bit xxHash)."""
    length = len(data)
    offset = 0
    if length >= 32:
        v1 = (seed + _P1 + _P2) & _MASK
        v2 = (seed + _P2) & _MASK
        v3 = seed & _MASK
        v4 = (seed - _P1) & _MASK
        while offset + 32 <= length:
            a, b, c, d = struct.unpack_from("<4Q", data, offset)
            v1, v2, v3, v4 = _round(v1, a), _round(v2, b), _round(v3, c), _round(v4, d)
            offset += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _MASK
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _MASK
    h = (h + length) & _MASK
    while offset + 8 <= length:
        (lane,) = struct.unpack_from("<Q", data, offset)
        h ^= _round(0, lane)
        h = (_rotl(h, 27) * _P1 + _P4) & _MASK
        offset += 8
    if offset + 4 <= length:
        (word,) = struct.unpack_from("<I", data, offset)
        h ^= (word * _P1) & _MASK
        h = (_rotl(h, 23) * _P2 + _P3) & _MASK
        offset += 4
    for byte in data[offset:]:
        h ^= (byte * _P5) & _MASK
        h = (_rotl(h, 11) * _P1) & _MASK
    h ^= h >> 33
    h = (h * _P2) & _MASK
    h ^= h >> 29
    h = (h * _P3) & _MASK
    h ^= h >> 32
    return h


def pod_hash(namespace: str, name: str) -> int:
    return xxh64(name.encode(), xxh64(namespace.encode()))


def fingerprint(pods: Iterable[tuple[str, str]]) -> str:
    """The sign of a set of pods given as (namespace, name); their order does not matter."""
    hashes = sorted(pod_hash(namespace, name) for namespace, name in pods)
    total = xxh64(b"".join(struct.pack("<Q", h) for h in hashes))
    return PREFIX + VERSION + total.to_bytes(8, "big").hex()
