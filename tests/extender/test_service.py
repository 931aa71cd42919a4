"""The extender's HTTP endpoints over a real TCP socket, as kube-scheduler calls them: the
protocol's field names, filter with the kubelet's reasons, prioritize 0..10, reservations from
bindings, and bad requests answered without ending the service."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Callable
from typing import Any

from nvplugin.extender.service import Extender, start_http
from nvplugin.extender.view import View
from tests.support.nrtgen import nrt_object

GPU = "nvidia.com/gpu"


def node(name: str, free: tuple[int, int], fingerprint: str = "fp0") -> dict[str, Any]:
    return nrt_object(
        name,
        {
            0: {GPU: (4, 4, free[0]), "cpu": (16, 15, 15)},
            1: {GPU: (4, 4, free[1]), "cpu": (16, 16, 16)},
        },
        policy="single-numa-node",
        cpu_policy="static",
        fingerprint=fingerprint,
        best_groups={GPU: "1:0:1,2:250:1,3:600:1"},
    )


def pod(gpus: int, uid: str = "uid-1") -> dict[str, Any]:
    # As the scheduler sends it: no apiVersion/kind (its cache strips TypeMeta).
    limits = {GPU: str(gpus), "cpu": "2", "memory": "1Gi"}
    return {
        "metadata": {"name": "train", "namespace": "ml", "uid": uid},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


def with_service(check: Callable[[Extender, int], None]) -> None:
    async def main() -> None:
        extender = Extender(View())
        for name, free in (("a", (1, 3)), ("b", (2, 2)), ("c", (0, 1))):
            extender.apply_nrt("ADDED", (node(name, free),))
        server = await start_http(extender, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            await asyncio.to_thread(check, extender, port)
        finally:
            server.close()
            await server.wait_closed()
            extender.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def post(conn: http.client.HTTPConnection, path: str, body: object) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json"})
    response = conn.getresponse()
    raw = response.read()
    if response.getheader("Content-Type") == "application/json":
        return response.status, json.loads(raw)
    return response.status, raw.decode()


def test_filter_passes_only_nodes_whose_kubelet_admits_the_pod() -> None:
    def check(extender: Extender, port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        args = {"Pod": pod(3), "NodeNames": ["a", "b", "c", "unknown"]}
        status, result = post(conn, "/filter", args)
        assert status == 200
        assert result["NodeNames"] == ["a", "unknown"]  # b: 2+2, c: too few anywhere
        why = (
            "nvplugin: the kubelet would reject the pod: TopologyAffinityError: "
            "Resources cannot be allocated with Topology locality"
        )
        assert result["FailedNodes"] == {"b": why, "c": why}
        assert list(result["FailedAndUnresolvableNodes"]) == []
        # Same connection (keep-alive), prioritize: a's pod fits one NUMA node of two.
        status, scores = post(conn, "/prioritize", {"pod": pod(3), "nodenames": ["a"]})
        assert status == 200 and scores[0]["Host"] == "a" and 0 < scores[0]["Score"] <= 10

    with_service(check)


def test_more_than_the_node_has_is_unresolvable() -> None:
    def check(extender: Extender, port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        _, result = post(conn, "/filter", {"Pod": pod(9), "NodeNames": ["a"]})
        assert result["NodeNames"] == []
        assert "a" in result["FailedAndUnresolvableNodes"]

    with_service(check)


def test_a_bound_pod_is_reserved_until_the_nrt_shows_it() -> None:
    def check(extender: Extender, port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        _, first = post(conn, "/filter", {"Pod": pod(3, "p1"), "NodeNames": ["a"]})
        assert first["NodeNames"] == ["a"]
        bound = pod(3, "p1")
        bound["spec"]["nodeName"] = "a"
        extender.apply_pod("MODIFIED", (bound,))
        assert len(extender.view.reservations("a")) == 1
        # The NRT has not caught up: a second 3-GPU pod no longer fits a.
        _, second = post(conn, "/filter", {"Pod": pod(3, "p2"), "NodeNames": ["a"]})
        assert second["NodeNames"] == []
        # The NRT shows the pod (new fingerprint): the reservation goes, its counts stay.
        extender.apply_nrt("MODIFIED", (node("a", (1, 0), "fp1"),))
        assert extender.view.reservations("a") == ()
        extender.apply_nrt("MODIFIED", (node("a", (1, 3), "fp2"),))
        _, third = post(conn, "/filter", {"Pod": pod(3, "p3"), "NodeNames": ["a"]})
        assert third["NodeNames"] == ["a"]

    with_service(check)


def test_bad_requests_get_an_answer_and_the_service_keeps_serving() -> None:
    def check(extender: Extender, port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        status, result = post(conn, "/filter", b"{not json")
        assert status == 200 and "not JSON" in result["Error"]
        status, text = post(conn, "/prioritize", {"Pod": {"metadata": {}}, "NodeNames": []})
        assert status == 400 and "metadata.name" in text
        status, _ = post(conn, "/nothing", {})
        assert status == 404
        conn2 = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        status, result = post(conn2, "/filter", {"Pod": pod(1), "NodeNames": ["a"]})
        assert status == 200 and result["NodeNames"] == ["a"]

    with_service(check)
