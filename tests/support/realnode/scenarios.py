"""The steps of ``make e2e-node``, in order, each timed; the first that fails ends the run.

One release of the chart, on a simulated DGX A100 (8 GPUs), taken through what a user does:
install, a GPU pod, the RBAC the chart renders, a per-node label switch and a ConfigMap edit
applied in place, NodeFeature objects, MPS on a node that never had ``/run/nvidia/mps``, a
plugin restart while the API server is down, a kubelet restart, and uninstall.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python as helm

from tests.support.realnode.cluster import NODE, Cluster, Failed, wait_until

NS = "nvplugin"
RELEASE = "nvplugin"
GPU = "nvidia.com/gpu"
LABEL = "nvidia.com/device-plugin.config"
PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
MPS_ROOT = Path("/run/nvidia/mps")
HERE = Path(__file__).resolve().parent
CHART = HERE.parents[2] / "charts" / "nvplugin"
NFD_CRD = HERE.parents[1] / "fixtures" / "nfd" / "nodefeature-crd.yaml"

PLAIN = "version: v1\n"


def sliced(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


MPS = (
    "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
)


class Run:
    """The steps against one cluster (see the module docstring)."""

    def __init__(self, cluster: Cluster) -> None:
        self.k = cluster
        self.helm = helm.Config(kubeconfig_path=str(cluster.admin_kubeconfig), namespace=NS)
        self.values: dict[str, Any] = {
            "simulate": "dgx-a100",
            "affinity": None,
            "image": {"repository": "localhost/nvplugin", "tag": "e2e", "pullPolicy": "Never"},
            "devicePlugin": {"enableHostNetwork": True},
        }
        self._log_dir = Path("/nonexistent")

    def steps(self) -> list[tuple[str, Callable[[], str]]]:
        return [
            ("install: simulated dgx-a100 registered, Node capacity 8", self.install),
            ("a GPU pod scheduled and given its GPUs' UUIDs", self.gpu_pod),
            ("per-node label switch applied in place", self.label_switch),
            ("RBAC exactly as rendered (kubectl auth can-i)", self.rbac),
            ("ConfigMap edit applied in place", self.configmap_edit),
            ("NodeFeature object published, owned by the pod", self.node_feature),
            ("MPS on a node that never had /run/nvidia/mps", self.mps),
            ("plugin restart while the API server is down", self.api_outage),
            ("kubelet restart: registered again", self.kubelet_restart),
            ("uninstall leaves nothing behind", self.uninstall),
        ]

    # --- helpers ---------------------------------------------------------------------------

    def _upgrade(self, install: bool = False) -> None:
        chart = helm.Chart.load(str(CHART))
        try:
            if install:
                self.helm.install(chart, RELEASE, self.values, namespace=NS, create_namespace=True)
            else:
                self.helm.upgrade(chart, RELEASE, self.values, namespace=NS)
        except helm.HelmError as exc:
            raise Failed(f"helm {'install' if install else 'upgrade'}: {exc}") from None

    def pod(self) -> dict[str, Any]:
        """The plugin's pod (the one not being deleted)."""
        pods = [
            p
            for p in self.k.get("pods", "-n", NS)["items"]
            if not p["metadata"].get("deletionTimestamp")
        ]
        if len(pods) != 1:
            raise Failed(f"expected one plugin pod, found {len(pods)}")
        pod: dict[str, Any] = pods[0]
        return pod

    def running(self) -> bool:
        pod = self.pod()
        statuses = pod["status"].get("containerStatuses") or []
        return bool(statuses) and all(s.get("ready") for s in statuses)

    def wait_running(self, timeout: float = 120) -> dict[str, Any]:
        try:
            wait_until("the plugin pod Ready", self.running, timeout, step=1)
        except Failed:
            raise Failed(f"the plugin pod is not Ready: {self._pod_state()}") from None
        return self.pod()

    def _pod_state(self) -> str:
        try:
            pod = self.pod()
        except Failed as exc:
            return str(exc)
        status = pod["status"]
        parts = [status.get("phase", "?")]
        for s in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
            parts.append(f"{s['name']}: {json.dumps(s.get('state'))[:300]}")
        events = self.k.kubectl(
            "get", "events", "-n", NS, "--field-selector",
            f"involvedObject.name={pod['metadata']['name']}", check=False,
        )  # fmt: skip
        return "; ".join(parts) + "\n" + events[-1500:] + "\n" + self.plugin_log()[-1500:]

    def capacity(self, resource: str = GPU) -> str | None:
        value: str | None = self.k.get("node", NODE)["status"].get("capacity", {}).get(resource)
        return value

    def wait_capacity(self, count: int, resource: str = GPU, timeout: float = 90) -> None:
        try:
            wait_until(
                f"Node capacity {resource}={count}",
                lambda: self.capacity(resource) == str(count),
                timeout,
                step=1,
            )
        except Failed:
            raise Failed(
                f"Node capacity {resource} is {self.capacity(resource)}, not {count}; "
                f"pod: {self._pod_state()}"
            ) from None

    def plugin_log(self) -> str:
        """The plugin container's log, every restart of it, from the kubelet's log directory
        (found through the API, else the last one found: the API may be down)."""
        try:
            meta = self.pod()["metadata"]
            self._log_dir = Path("/var/log/pods") / f"{NS}_{meta['name']}_{meta['uid']}"
        except Failed:
            pass
        directory = self._log_dir / "nvplugin"
        if not directory.is_dir():
            return ""
        return "".join(
            p.read_text(errors="replace")
            for p in sorted(directory.glob("*.log"), key=lambda p: int(p.stem))
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.plugin_log().splitlines():
            start = line.find("{")
            if start < 0:
                continue
            try:
                value = json.loads(line[start:])
            except ValueError:
                continue
            if isinstance(value, dict) and value.get("event") == name:
                out.append(value)
        return out

    def restarts(self) -> int:
        return sum(s.get("restartCount", 0) for s in self.pod()["status"]["containerStatuses"])

    # --- the steps -------------------------------------------------------------------------

    def install(self) -> str:
        self._upgrade(install=True)
        pod = self.wait_running()
        self.wait_capacity(8)
        return f"pod {pod['metadata']['name']} Ready, capacity {GPU}=8"

    def gpu_pod(self) -> str:
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpu-pod", "namespace": "default"},
            "spec": {
                "hostNetwork": True,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "localhost/busybox:e2e",
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "echo visible=$NVIDIA_VISIBLE_DEVICES"],
                        "resources": {"limits": {GPU: "2"}},
                    }
                ],
            },
        }
        self.k.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        try:
            wait_until(
                "the GPU pod to succeed",
                lambda: (
                    self.k.get("pod", "-n", "default", "gpu-pod")["status"]["phase"] == "Succeeded"
                ),
                90,
                step=1,
            )
            log = self.k.kubectl("logs", "-n", "default", "gpu-pod")
        finally:
            self.k.kubectl("delete", "pod", "-n", "default", "gpu-pod", "--wait=false", check=False)
        uuids = re.findall(r"GPU-[0-9a-f-]{36}", log)
        if len(uuids) != 2:
            raise Failed(f"the pod saw {log.strip()!r}, not two GPU UUIDs")
        return f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}"

    def rbac(self) -> str:
        daemonset = self.k.get("daemonsets", "-n", NS)["items"][0]
        account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
        user = f"system:serviceaccount:{NS}:{account}"
        granted: list[tuple[str, str, str]] = []
        roles = self.k.get("clusterroles", "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
        roles += self.k.get("roles", "-n", NS, "-l", f"app.kubernetes.io/instance={RELEASE}")[
            "items"
        ]
        for role in roles:
            namespace = role["metadata"].get("namespace", "")
            for rule in role.get("rules", []):
                for resource in rule.get("resources", []):
                    group = (rule.get("apiGroups") or [""])[0]
                    qualified = f"{resource}.{group}" if group else resource
                    for verb in rule["verbs"]:
                        granted.append((verb, qualified, namespace))
        if not granted:
            raise Failed("the chart rendered no Role or ClusterRole for the plugin")
        wrong = []
        for verb, resource, namespace in granted:
            if not self._can(user, verb, resource, namespace):
                wrong.append(f"denied {verb} {resource}")
        for verb, resource in (
            ("patch", "nodes"),
            ("update", "nodes"),
            ("delete", "pods"),
            ("get", "secrets"),
            ("list", "configmaps"),
            ("create", "pods"),
        ):
            if (verb, resource, "") not in granted and self._can(user, verb, resource, NS):
                wrong.append(f"allowed {verb} {resource}")
        if wrong:
            raise Failed(f"{user}: {'; '.join(wrong)}")
        return f"{len(granted)} grants as rendered, 6 denials checked"

    def _can(self, user: str, verb: str, resource: str, namespace: str) -> bool:
        args = ["auth", "can-i", verb, resource, f"--as={user}"]
        if namespace:
            args += ["-n", namespace]
        return self.k.kubectl(*args, check=False).strip() == "yes"

    def label_switch(self) -> str:
        self.values["config"] = {"map": {"default": PLAIN, "sliced": sliced(2)}}
        self._upgrade()
        self.wait_running()
        self.wait_capacity(8)
        uid, restarts = self.pod()["metadata"]["uid"], self.restarts()
        started = time.monotonic()
        self.k.kubectl("label", "node", NODE, f"{LABEL}=sliced", "--overwrite")
        self.wait_capacity(16)
        took = time.monotonic() - started
        if self.pod()["metadata"]["uid"] != uid or self.restarts() != restarts:
            raise Failed("the plugin pod was replaced or restarted for a label change")
        return f"capacity 8 -> 16 in {took:.1f} s (Node status reports every 10 s), same pod"

    def configmap_edit(self) -> str:
        uid, restarts = self.pod()["metadata"]["uid"], self.restarts()
        maps = [
            m
            for m in self.k.get("configmaps", "-n", NS)["items"]
            if "sliced" in (m.get("data") or {})
        ]
        if len(maps) != 1:
            raise Failed(f"expected one ConfigMap with the configs, found {len(maps)}")
        name = maps[0]["metadata"]["name"]
        patch = {"data": {"sliced": sliced(4)}}
        started = time.monotonic()
        self.k.kubectl(
            "patch", "configmap", "-n", NS, name, "--type=merge", "-p", json.dumps(patch)
        )
        self.wait_capacity(32, timeout=180)  # the kubelet syncs ConfigMap volumes in ~60-90 s
        took = time.monotonic() - started
        if self.pod()["metadata"]["uid"] != uid or self.restarts() != restarts:
            raise Failed("the plugin pod was replaced or restarted for a ConfigMap edit")
        self.values["config"]["map"]["sliced"] = sliced(4)  # what helm now holds
        return f"capacity 16 -> 32 in {took:.1f} s, same pod"

    def node_feature(self) -> str:
        self.k.kubectl("apply", "-f", str(NFD_CRD))
        wait_until(
            "the NodeFeature CRD Established",
            lambda: "Established"
            in self.k.kubectl(
                "get", "crd", "nodefeatures.nfd.k8s-sigs.io",
                "-o", "jsonpath={.status.conditions[*].type}",
            ),
            30,
        )  # fmt: skip
        self.values["gfd"] = {"enabled": True}
        self.values["nfd"] = {"enableNodeFeatureApi": True}
        self._upgrade()
        pod = self.wait_running()

        def published() -> bool:
            items = self.k.get("nodefeatures.nfd.k8s-sigs.io", "-n", NS)["items"]
            return any(len(i["spec"].get("labels", {})) > 10 for i in items)

        try:
            wait_until("the NodeFeature object", published, 60, step=1)
        except Failed:
            raise Failed(
                f"no NodeFeature object; plugin log: {self.plugin_log()[-1500:]}"
            ) from None
        (item,) = self.k.get("nodefeatures.nfd.k8s-sigs.io", "-n", NS)["items"]
        owners = item["metadata"].get("ownerReferences", [])
        if [(o["kind"], o["uid"]) for o in owners] != [("Pod", pod["metadata"]["uid"])]:
            raise Failed(f"the NodeFeature object is owned by {owners}, not the plugin pod")
        labels = item["spec"]["labels"]
        if labels.get("nvidia.com/gpu.replicas") != "4":
            raise Failed(f"NodeFeature labels do not show the time-slicing: {labels}")
        return f"{len(labels)} labels, owned by the pod"

    def mps(self) -> str:
        if MPS_ROOT.exists():
            raise Failed(f"{MPS_ROOT} exists before MPS was configured")
        self.values["config"]["map"]["mps"] = MPS
        self._upgrade()
        self.wait_running()
        started = time.monotonic()
        self.k.kubectl("label", "node", NODE, f"{LABEL}=mps", "--overwrite")
        self.wait_capacity(16, timeout=120)
        took = time.monotonic() - started
        if not self.events("MPS control daemon ready"):
            raise Failed("no MPS control daemon in the plugin's log")
        mounted = subprocess.run(
            ["findmnt", "-n", str(MPS_ROOT / "shm")], capture_output=True, text=True
        ).stdout
        if "tmpfs" not in mounted:
            raise Failed(f"{MPS_ROOT}/shm is not a tmpfs on the host: {mounted!r}")
        zombies = self._zombies()
        if zombies:
            raise Failed(f"zombies under the plugin: {zombies}")
        return f"16 MPS shares in {took:.1f} s; shm tmpfs on the host; no zombie"

    def _zombies(self) -> list[str]:
        """Processes ended but not reaped below the plugin container's PID 1."""
        out = []
        for pid in _pids_of("nvplugin serve"):
            for child in _descendants(pid):
                try:
                    stat = Path(f"/proc/{child}/stat").read_text()
                except OSError:
                    continue
                if stat.rsplit(")", 1)[1].split()[0] == "Z":
                    out.append(stat.split(")")[0] + ")")
        return out

    def api_outage(self) -> str:
        before = len(self.events("config selected"))
        self.k.stop("kube-apiserver")
        try:
            # The container's main process ends (its init forwards SIGTERM): the kubelet
            # restarts it, with no API server to read the label from.
            for pid in _pids_of("nvplugin serve", init_only=True):
                os.kill(pid, signal.SIGTERM)
            wait_until(
                "the restarted plugin's config choice",
                lambda: len(self.events("config selected")) > before,
                90,
                step=1,
            )
            chosen = self.events("config selected")[-1]
            if (chosen.get("config"), chosen.get("why")) != ("mps", "last-chosen"):
                raise Failed(f"restarted during the outage, it chose {chosen}")
            wait_until(
                "registered again during the outage",
                lambda: (
                    (PLUGIN_DIR / "nvplugin-gpu.sock").exists()
                    and len(self.events("registered with kubelet")) > 0
                ),
                60,
            )
        finally:
            self.k.start("kube-apiserver")
            self.k.wait_api(120)
        self.wait_running()
        self.wait_capacity(16)
        return "served the config the label last chose (mps), no wait for the API"

    def kubelet_restart(self) -> str:
        before = len(self.events("registered with kubelet"))
        self.k.stop("kubelet")
        self.k.start("kubelet")
        wait_until(
            "registered again after the kubelet restart",
            lambda: len(self.events("registered with kubelet")) > before,
            120,
            step=1,
        )
        self.wait_capacity(16)
        return "registered again"

    def uninstall(self) -> str:
        try:
            self.helm.uninstall(RELEASE, wait="watcher", timeout=120)
        except helm.HelmError as exc:
            raise Failed(f"helm uninstall: {exc}") from None
        wait_until(
            "the plugin pods gone",
            lambda: self.k.get("pods", "-n", NS)["items"] == [],
            120,
            step=1,
        )
        mine = f"app.kubernetes.io/instance={RELEASE}"
        left = [
            f"{kind}/{i['metadata']['name']}"
            for kind in ("daemonsets", "serviceaccounts", "configmaps", "roles", "rolebindings")
            for i in self.k.get(kind, "-n", NS, "-l", mine)["items"]
        ]
        left += [
            f"{kind}/{i['metadata']['name']}"
            for kind in ("clusterroles", "clusterrolebindings")
            for i in self.k.get(kind, "-l", mine)["items"]
        ]
        wait_until(
            "the NodeFeature object collected with its pod",
            lambda: self.k.get("nodefeatures.nfd.k8s-sigs.io", "-n", NS)["items"] == [],
            60,
            step=1,
        )
        sockets = sorted(p.name for p in PLUGIN_DIR.glob("nvplugin-*.sock"))
        if left or sockets:
            raise Failed(f"left behind: {left} {sockets}")
        return "no objects, sockets or NodeFeature left"


def _pids_of(text: str, init_only: bool = False) -> list[int]:
    """Host pids whose command line contains ``text`` (``init_only``: PID 1 of their
    namespace)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if text not in cmdline:
            continue
        nspid = [line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:")]
        if init_only and nspid != ["1"]:
            continue
        out.append(int(entry.name))
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += children
            todo += children
    return out
