"""NFD's pod fingerprint, computed as the podfingerprint package computes it: its published
compatibility vectors (testdata/compat-*.sign) come out, whatever the order of the pods."""

from __future__ import annotations

import random

from nvplugin.nrt.fingerprint import fingerprint, xxh64

TINY = [("production", n) for n in ("jaeger-dpgjk", "nginx-rt684", "envoy-g9m22")]
SMALL = [
    ("analytics", "controller-69dkj"),
    ("kube-public", "subscriber-tq6v7"),
    ("kube-public", "transformer-hfbng"),
    ("kube-public", "validator-c6pn5"),
    ("kube-system", "proxy-wszrd"),
    ("middleware", "processor-jkrl4"),
    ("network", "gateway-vsll5"),
    ("network", "importer-kzdfr"),
    ("network", "importer-q5vt9"),
    ("staging", "prometheus-bwgbn"),
]


def test_xxh64_reference_values() -> None:
    assert xxh64(b"") == 0xEF46DB3751D8E999
    assert xxh64(b"a") == 0xD24EC4F1A98C6E5B
    assert xxh64(b"abc") == 0x44BC2CF5AD770999


def test_the_podfingerprint_compatibility_vectors() -> None:
    assert fingerprint(TINY) == "pfp0v001607b76a0e9d3aeb4"
    assert fingerprint(SMALL) == "pfp0v001567144e4a561bb5a"


def test_order_does_not_matter_and_membership_does() -> None:
    shuffled = list(SMALL)
    random.Random(7).shuffle(shuffled)
    assert fingerprint(shuffled) == fingerprint(SMALL)
    assert fingerprint(SMALL[1:]) != fingerprint(SMALL)
    # namespace and name are not interchangeable
    assert fingerprint([("a", "b")]) != fingerprint([("b", "a")])
