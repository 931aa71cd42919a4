"""The real kube-scheduler (tests/conftest.py's ``real_scheduler``) against the real API: it
places a Pod asking for GPUs on an API-only Node whose status advertises them, and leaves one
asking for more than any Node has pending. What the scheduler-extender tests build on."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from tests.support.realapi import RealAPI, RealScheduler
from tests.support.waiting import WAIT_S

GPU = "nvidia.com/gpu"


def _pod(name: str, scheduler: str, selector: dict[str, str], gpus: int) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": selector,
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "cuda", "image": "cuda:test", "resources": {"limits": {GPU: str(gpus)}}}
            ],
        },
    }


def test_the_scheduler_binds_by_the_gpus_a_node_advertises(
    real_api: RealAPI, real_scheduler: Callable[[str], RealScheduler]
) -> None:
    suffix = uuid.uuid4().hex[:8]
    name, node = f"sched-{suffix}", f"gpu-{suffix}"
    selector = {"example.com/test": suffix}  # this test's Node only
    real_api.add_node(
        node,
        labels=selector,
        capacity={"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "8"},
    )
    namespace = real_api.namespace("scheduler")
    scheduler = real_scheduler(f"profiles:\n- schedulerName: {name}\n")
    try:
        base = f"/api/v1/namespaces/{namespace}/pods"
        real_api.request("POST", base, _pod("fits", name, selector, 2))
        real_api.request("POST", base, _pod("too-big", name, selector, 9))
        deadline = time.monotonic() + WAIT_S
        while real_api.request("GET", f"{base}/fits")["spec"].get("nodeName") != node:
            assert time.monotonic() < deadline, real_api.logs().get(scheduler.name)
            time.sleep(0.05)
        while True:
            conditions = real_api.request("GET", f"{base}/too-big")["status"].get("conditions")
            scheduled = [c for c in conditions or [] if c["type"] == "PodScheduled"]
            if scheduled:
                break
            assert time.monotonic() < deadline, real_api.logs().get(scheduler.name)
            time.sleep(0.05)
        assert scheduled[0]["status"] == "False" and scheduled[0]["reason"] == "Unschedulable"
        assert f"Insufficient {GPU}" in scheduled[0]["message"]
        assert scheduler.running()
    finally:
        real_api.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
