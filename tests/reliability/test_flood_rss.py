"""The Allocate flood's RSS check (tests/support/reliability/floods.py): no failure for what the
flood's own working set does to RSS on a busy machine, a failure for a leak."""

from __future__ import annotations

from nvplugin.api.v1beta1 import api_pb2
from nvplugin.nodefile.reader import load_node
from nvplugin.rm import MAX_CONTAINER_REQUESTS
from tests.support.harness import Outcome
from tests.support.reliability.floods import check_rss, in_flight_kib

IDS = [gpu.uuid for gpu in load_node("dgx-2").gpus]
CONTAINER = api_pb2.ContainerAllocateRequest(devices_ids=IDS)
TOO_BIG = api_pb2.AllocateRequest(container_requests=[CONTAINER] * 5000)
FITS = api_pb2.AllocateRequest(container_requests=[CONTAINER] * MAX_CONTAINER_REQUESTS)
THREADS = 3  # the test scale's flood threads


def verdict(start_kib: int, end_kib: int | None) -> list[str]:
    out = Outcome("flood", "probe")
    out.rss_start_kib, out.rss_end_kib = start_kib, end_kib
    check_rss(out, in_flight_kib(THREADS, TOO_BIG, FITS), THREADS)
    return out.failures


def test_the_floods_own_working_set_is_no_leak() -> None:
    """What the flood's own requests in flight do to RSS on a busy machine passes; a bound
    relative to RSS failed it."""
    # Measured with the machine busy, no leak: a bound of 10 % of RSS failed it; three threads
    # with a 3.4 MB request each in flight hold that much.
    assert in_flight_kib(THREADS, TOO_BIG, FITS) >= 3 * 3 * TOO_BIG.ByteSize() // 1024
    assert verdict(74984, 92304) == []
    assert verdict(86312, 76180) == []  # and RSS going down


def test_a_leak_of_the_refused_requests_fails() -> None:
    """Keeping every refused request (a leak) is far more than the in-flight allowance."""
    # About 40 refused requests per thread at test scale.
    leaked = 40 * THREADS * TOO_BIG.ByteSize() // 1024
    (failure,) = verdict(75000, 75000 + leaked)
    assert failure.startswith(f"RSS grew {leaked} KiB (75000 -> {75000 + leaked} KiB)")
    assert verdict(75000, None) != []  # no reading: no verdict
