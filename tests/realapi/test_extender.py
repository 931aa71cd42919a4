"""The scheduler extender end to end: the real kube-scheduler with ``nvplugin
scheduler-extender`` configured as its extender, against the real API, 50 API-only nodes with
NodeResourceTopology objects of varied free shapes (single-numa-node and restricted), and a
stream of GPU + CPU pods. Every pod the scheduler binds would be admitted by its node; the same
stream on the same kind of nodes without the extender binds some that would be rejected.

"Would be admitted" replays each node's bound pods, in binding order, through the fake
kubelet's admission over that node's NRT free state (the extender's judge, which
tests/extender/test_verdicts.py holds equal to ``nvplugin admit``)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from nvplugin.extender.nrt import parse_nrt
from nvplugin.extender.protocol import parse_args
from nvplugin.extender.view import View
from tests.support.nrtgen import nrt_object
from tests.support.realapi import RealAPI, RealScheduler, free_port
from tests.support.waiting import WAIT_S

GPU = "nvidia.com/gpu"
NODES = 50
PODS = 45
CRD = Path(__file__).resolve().parents[1] / "fixtures" / "nrt" / "noderesourcetopologies.yaml"


def node_nrts(prefix: str) -> list[dict[str, Any]]:
    """50 nodes: 2 or 4 NUMA nodes, 4 or 2 GPUs each, some free, some CPUs free."""
    rng = random.Random(34)
    out = []
    for i in range(NODES):
        numa, gpus = rng.choice(((2, 4), (4, 2)))
        zones = {
            n: {
                GPU: (gpus, gpus, rng.randint(0, gpus)),
                "cpu": (16, 16 - (n == 0), rng.choice((2, 6, 15))),
            }
            for n in range(numa)
        }
        policy = ("single-numa-node", "restricted")[i % 2]
        out.append(nrt_object(f"{prefix}-{i:02d}", zones, policy=policy, cpu_policy="static"))
    return out


def pod(name: str, scheduler: str, selector: dict[str, str], rng: random.Random) -> dict[str, Any]:
    limits = {GPU: str(rng.choice((1, 2, 2, 3, 4))), "cpu": str(rng.choice((2, 4))),
              "memory": "1Gi"}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": selector,
            "automountServiceAccountToken": False,
            "containers": [{"name": "cuda", "image": "cuda:test", "resources": {"limits": limits}}],
        },
    }


def add_nodes(real_api: RealAPI, nrts: list[dict[str, Any]], selector: dict[str, str]) -> None:
    for nrt in nrts:
        name = nrt["metadata"]["name"]
        free = sum(
            int(r["available"]) for z in nrt["zones"] for r in z["resources"] if r["name"] == GPU
        )
        # The Node advertises the GPUs its NRT shows free: the scheduler's count fit alone
        # already keeps pods off nodes without enough; what remains is topology.
        real_api.add_node(
            name,
            labels=selector,
            capacity={"cpu": "64", "memory": "256Gi", "pods": "110", GPU: str(free)},
        )
        real_api.request("POST", "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies", nrt)


def run_stream(
    real_api: RealAPI, namespace: str, scheduler: str, selector: dict[str, str],
    extender_port: int | None, log: Any,
) -> list[dict[str, Any]]:  # fmt: skip
    """Create the pods one by one, each once the one before is bound or unschedulable (and,
    with the extender, reserved there); the pods as finally stored."""
    rng = random.Random(35)
    base = f"/api/v1/namespaces/{namespace}/pods"
    out = []
    for i in range(PODS):
        created = real_api.request(
            "POST", base, pod(f"{scheduler}-{i:02d}", scheduler, selector, rng)
        )
        path = f"{base}/{created['metadata']['name']}"
        deadline = time.monotonic() + WAIT_S
        while True:
            stored = real_api.request("GET", path)
            if stored["spec"].get("nodeName"):
                break
            conditions = stored["status"].get("conditions") or []
            if any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions):
                break
            assert time.monotonic() < deadline, log()
            time.sleep(0.05)
        if extender_port is not None and stored["spec"].get("nodeName"):
            uid = stored["metadata"]["uid"]
            while not any(uid in held for held in reservations(extender_port).values()):
                assert time.monotonic() < deadline, log()
                time.sleep(0.02)
        out.append(stored)
    return out


def reservations(port: int) -> dict[str, list[str]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/reservations", timeout=10) as r:
        held: dict[str, list[str]] = json.loads(r.read())
    return held


def replay(nrts: list[dict[str, Any]], pods: list[dict[str, Any]]) -> tuple[int, int]:
    """(admitted, rejected) of the bound pods, each node's kubelet admitting its pods in
    binding order from the NRT's free state."""
    view = View()
    for nrt in nrts:
        view.set_nrt(parse_nrt(nrt))
    admitted = rejected = 0
    for stored in pods:
        node = stored["spec"].get("nodeName")
        if not node:
            continue
        args = parse_args(json.dumps({"Pod": stored, "NodeNames": [node]}).encode())
        passed, _ = view.filter(args.pod, [node])
        if passed:
            view.bound(args.pod.uid, node)  # it holds its devices and CPUs from now on
            admitted += 1
        else:
            rejected += 1
    return admitted, rejected


def test_with_the_extender_every_bound_pod_is_admitted(
    real_api: RealAPI, real_scheduler: Any
) -> None:
    real_api.install_crd(CRD)
    suffix = uuid.uuid4().hex[:6]
    with_ext, without = f"ext-{suffix}", f"plain-{suffix}"
    nrts_with, nrts_without = node_nrts(with_ext), node_nrts(without)
    add_nodes(real_api, nrts_with, {"example.com/test": with_ext})
    add_nodes(real_api, nrts_without, {"example.com/test": without})
    namespace = real_api.namespace("extender")
    port = free_port()
    log_path = real_api.root / f"extender-{suffix}.log"
    with open(log_path, "wb") as log_file:
        extender = subprocess.Popen(
            [sys.executable, "-m", "nvplugin", "scheduler-extender",
             f"--listen=127.0.0.1:{port}", "--log-level=info", "--log-format=json"],
            env=real_api.env(real_api.admin_kubeconfig),
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
    schedulers: list[RealScheduler] = []

    def log() -> str:
        return log_path.read_text()[-3000:] + "\n".join(
            real_api.logs().get(s.name, "")[-3000:] for s in schedulers
        )

    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert extender.poll() is None and time.monotonic() < deadline, log()
            time.sleep(0.1)
        config = f"""
profiles:
- schedulerName: {with_ext}
extenders:
- urlPrefix: http://127.0.0.1:{port}
  filterVerb: filter
  prioritizeVerb: prioritize
  weight: 1
  nodeCacheCapable: true
  managedResources:
  - name: {GPU}
    ignoredByScheduler: false
"""
        # Extenders serve every profile of a scheduler: the plain run gets its own scheduler.
        schedulers.append(real_scheduler(config))
        pods_with = run_stream(
            real_api, namespace, with_ext, {"example.com/test": with_ext}, port, log
        )
        schedulers.append(real_scheduler(f"profiles:\n- schedulerName: {without}\n"))
        pods_without = run_stream(
            real_api, namespace, without, {"example.com/test": without}, None, log
        )
        ok_with, bad_with = replay(nrts_with, pods_with)
        ok_without, bad_without = replay(nrts_without, pods_without)
        print(
            f"\nwith the extender: {ok_with} bound and admitted, {bad_with} bound and rejected; "
            f"without: {ok_without} bound and admitted, {bad_without} bound and rejected"
        )
        assert bad_with == 0, log()
        assert ok_with > 0
        assert bad_without > 0
    finally:
        extender.terminate()
        try:
            extender.wait(10)
        except subprocess.TimeoutExpired:
            extender.kill()
            extender.wait()
        for nrt in (*nrts_with, *nrts_without):
            name = nrt["metadata"]["name"]
            real_api.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
            real_api.delete(nrt)
