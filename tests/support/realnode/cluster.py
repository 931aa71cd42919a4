"""A one-node cluster on loopback, started from binaries and stopped by pid (see the package).

Each component runs in its own session with its output in ``<state>/logs/<name>.log``; its
command line is kept, so that :meth:`Cluster.stop` and :meth:`Cluster.start` can take one down
(an API outage, a kubelet restart) and bring it back the same. :meth:`Cluster.down` stops
everything, unmounts what the kubelet, containerd and the chart mounted, and removes the state
and the host directories the run created.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

NODE = "127.0.0.1"
"""The node's name and InternalIP (the kubelet refuses --node-ip=127.0.0.1, not the name)."""
API_PORT = 443
PORTS = (API_PORT, 2379, 2380, 10248, 10250, 10257, 10259)
BINARIES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubectl",
    "etcd",
)
PROGRAMS = ("containerd", "runc", "ctr", "openssl", "findmnt")
HOST_DIRS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/etc/kubernetes",
    "/run/nvidia",
)
"""Host directories a run may create (kept when they existed before it)."""
CNI_BIN = "/usr/lib/cni"


class Failed(Exception):
    """A step failed; the message says what was seen."""


def missing_tools(bin_dir: Path) -> list[str]:
    """What this machine lacks for a run (empty: nothing)."""
    out = [str(bin_dir / name) for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]
    out += [name for name in PROGRAMS if shutil.which(name) is None]
    if not os.path.exists(os.path.join(CNI_BIN, "loopback")):
        out.append(f"{CNI_BIN}/loopback (the CNI plugins)")
    if os.geteuid() != 0:
        out.append("root")
    return out


def wait_until(what: str, check: Callable[[], bool], timeout: float, step: float = 0.2) -> None:
    """Poll ``check`` until it holds; :class:`Failed` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (Failed, OSError, subprocess.SubprocessError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(step)


class Cluster:
    """The cluster whose state lives in ``state`` (see the module docstring)."""

    def __init__(self, bin_dir: Path, state: Path, images: list[Path]) -> None:
        self.bin = bin_dir
        self.state = state
        self.run_dir = Path("/run/nvplugin-e2e")
        self.pki = state / "pki"
        self.logs = state / "logs"
        self.images = images
        self.admin_kubeconfig = state / "admin.kubeconfig"
        self._commands: dict[str, list[str]] = {}
        self._pids: dict[str, int] = {}
        self._preexisting: set[str] = set()

    # --- kubectl ---------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            [str(self.bin / "kubectl"), "--kubeconfig", str(self.admin_kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and done.returncode != 0:
            raise Failed(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    # --- up and down -----------------------------------------------------------------------

    def up(self) -> None:
        for port in PORTS:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    raise Failed(f"port {port} is in use: another cluster is running here")
        shutil.rmtree(self.state, ignore_errors=True)  # a failed run's logs included
        for sub in ("pki", "logs", "etcd", "cni", "containerd"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._preexisting = {d for d in HOST_DIRS if os.path.exists(d)}
        if "/run/nvidia" not in self._preexisting:
            # MPS's shared memory propagates only from a shared mount (README, MPS section).
            os.makedirs("/run/nvidia")
            self._run("mount", "--bind", "/run/nvidia", "/run/nvidia")
            self._run("mount", "--make-rshared", "/run/nvidia")
        self._make_pki()
        self._start_etcd()
        self._start_apiserver()
        self._start_controllers()
        self._start_containerd()
        self._start_kubelet()

    def down(self, keep_logs: bool = False) -> None:
        """Stop everything, unmount, remove the state (see the module docstring); with
        ``keep_logs``, the logs stay in ``<state>/logs``."""
        self.stop("kubelet")
        sock = self.run_dir / "containerd.sock"
        if sock.exists():
            ctr = ["ctr", "--address", str(sock), "-n", "k8s.io"]
            tasks = self._out(*ctr, "tasks", "ls", "-q").split()
            for task in tasks:
                self._out(*ctr, "tasks", "kill", "-s", "SIGTERM", task)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and "RUNNING" in self._out(*ctr, "tasks", "ls"):
                time.sleep(0.2)
            for task in tasks:
                self._out(*ctr, "tasks", "kill", "-s", "SIGKILL", task)
            time.sleep(0.5)
            for task in tasks:
                self._out(*ctr, "tasks", "rm", "-f", task)
            for container in self._out(*ctr, "containers", "ls", "-q").split():
                self._out(*ctr, "containers", "rm", container)
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver"):
            self.stop(name)
        self.stop("containerd")
        self.stop("etcd")
        for pid in self._out("pgrep", "-f", f"-address {sock}").split():
            os.kill(int(pid), signal.SIGKILL)
        roots = ["/var/lib/kubelet", str(self.run_dir), str(self.state)]
        if "/run/nvidia" not in self._preexisting:
            roots.append("/run/nvidia")
        mounts = self._out("findmnt", "-rn", "-o", "TARGET").split()
        for mount in sorted(mounts, reverse=True):
            inside = any(mount == r or mount.startswith(r + "/") for r in roots)
            if inside and subprocess.run(["umount", mount], capture_output=True).returncode:
                subprocess.run(["umount", "-l", mount], capture_output=True)
        for directory in HOST_DIRS:
            if directory in self._preexisting:
                continue
            shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        for entry in self.state.iterdir() if self.state.is_dir() else ():
            if keep_logs and entry == self.logs:
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()

    def start(self, name: str) -> None:
        """Start ``name`` again with the command line it was first started with."""
        self._spawn(name, self._commands[name])

    def stop(self, name: str) -> None:
        """SIGTERM ``name``, SIGKILL after 30 s; nothing when it is not running."""
        pid = self._pids.pop(name, None)
        if pid is None:
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return
            except ChildProcessError:
                return
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

    # --- the parts -------------------------------------------------------------------------

    def _make_pki(self) -> None:
        p = self.pki
        self._run(
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", f"{p}/ca.key", "-out", f"{p}/ca.crt", "-subj", "/CN=nvplugin-e2e-ca",
        )  # fmt: skip
        names = {
            "apiserver": (
                "/CN=kube-apiserver",
                "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
                "DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1",
            ),
            "apiserver-kubelet-client": ("/O=system:masters/CN=kube-apiserver-kubelet-client", ""),
            "admin": ("/O=system:masters/CN=nvplugin-e2e-admin", ""),
            "controller-manager": ("/CN=system:kube-controller-manager", ""),
            "scheduler": ("/CN=system:kube-scheduler", ""),
            "kubelet": (f"/O=system:nodes/CN=system:node:{NODE}", ""),
            "kubelet-serving": (f"/CN={NODE}", "IP:127.0.0.1,DNS:localhost"),
        }
        for name, (subject, names_alt) in names.items():
            ext = p / f"{name}.ext"
            lines = [
                "basicConstraints=CA:FALSE",
                "keyUsage=critical,digitalSignature,keyEncipherment",
                "extendedKeyUsage=clientAuth,serverAuth",
            ]
            if names_alt:
                lines.append(f"subjectAltName={names_alt}")
            ext.write_text("\n".join(lines) + "\n")
            self._run(
                "openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes",
                "-keyout", f"{p}/{name}.key", "-out", f"{p}/{name}.csr", "-subj", subject,
            )  # fmt: skip
            self._run(
                "openssl", "x509", "-req", "-in", f"{p}/{name}.csr", "-CA", f"{p}/ca.crt",
                "-CAkey", f"{p}/ca.key", "-CAcreateserial", "-days", "2", "-extfile", str(ext),
                "-out", f"{p}/{name}.crt",
            )  # fmt: skip
        self._run("openssl", "genrsa", "-out", f"{p}/sa.key", "2048")
        self._run("openssl", "rsa", "-in", f"{p}/sa.key", "-pubout", "-out", f"{p}/sa.pub")
        for name in ("admin", "controller-manager", "scheduler", "kubelet"):
            self._kubeconfig(name)

    def _kubeconfig(self, name: str) -> None:
        text = f"""\
            apiVersion: v1
            kind: Config
            clusters:
            - name: e2e
              cluster: {{server: "https://127.0.0.1:{API_PORT}", certificate-authority: "{self.pki}/ca.crt"}}
            users:
            - name: {name}
              user: {{client-certificate: "{self.pki}/{name}.crt", client-key: "{self.pki}/{name}.key"}}
            contexts:
            - name: {name}
              context: {{cluster: e2e, user: {name}}}
            current-context: {name}
            """  # noqa: E501
        (self.state / f"{name}.kubeconfig").write_text(textwrap.dedent(text))

    def _start_etcd(self) -> None:
        self._spawn(
            "etcd",
            [
                str(self.bin / "etcd"), "--name", "e2e", "--data-dir", str(self.state / "etcd"),
                "--listen-client-urls", "http://127.0.0.1:2379",
                "--advertise-client-urls", "http://127.0.0.1:2379",
                "--listen-peer-urls", "http://127.0.0.1:2380",
                "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                "--initial-cluster", "e2e=http://127.0.0.1:2380",
                # etcd 3.4 lacks RequestWatchProgress: progress notifications keep the API
                # server's watch caches of idle resources current.
                "--experimental-watch-progress-notify-interval=5s",
            ],
        )  # fmt: skip
        wait_until("etcd", lambda: self._curl("http://127.0.0.1:2379/health"), 30)

    def _start_apiserver(self) -> None:
        p = self.pki
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin / "kube-apiserver"),
                "--etcd-servers=http://127.0.0.1:2379",
                "--bind-address=127.0.0.1", f"--secure-port={API_PORT}",
                "--advertise-address=127.0.0.1",
                "--service-cluster-ip-range=127.0.0.0/24", "--endpoint-reconciler-type=none",
                "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--client-ca-file={p}/ca.crt",
                f"--tls-cert-file={p}/apiserver.crt", f"--tls-private-key-file={p}/apiserver.key",
                f"--kubelet-client-certificate={p}/apiserver-kubelet-client.crt",
                f"--kubelet-client-key={p}/apiserver-kubelet-client.key",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={p}/sa.pub",
                f"--service-account-signing-key-file={p}/sa.key",
                "--profiling=false", "--v=1",
            ],
        )  # fmt: skip
        self.wait_api(90)

    def api_ready(self) -> bool:
        p = self.pki
        return self._curl(
            f"https://127.0.0.1:{API_PORT}/readyz",
            "--cacert", f"{p}/ca.crt", "--cert", f"{p}/admin.crt", "--key", f"{p}/admin.key",
        )  # fmt: skip

    def wait_api(self, timeout: float) -> None:
        wait_until("kube-apiserver /readyz", self.api_ready, timeout)

    def _start_controllers(self) -> None:
        p, s = self.pki, self.state
        cm = f"{s}/controller-manager.kubeconfig"
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"), f"--kubeconfig={cm}",
                f"--authentication-kubeconfig={cm}", f"--authorization-kubeconfig={cm}",
                "--bind-address=127.0.0.1", "--secure-port=10257", "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={p}/sa.key", f"--root-ca-file={p}/ca.crt",
                f"--cluster-signing-cert-file={p}/ca.crt",
                f"--cluster-signing-key-file={p}/ca.key", "--v=1",
            ],
        )  # fmt: skip
        sched = f"{s}/scheduler.kubeconfig"
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin / "kube-scheduler"), f"--kubeconfig={sched}",
                f"--authentication-kubeconfig={sched}", f"--authorization-kubeconfig={sched}",
                "--bind-address=127.0.0.1", "--secure-port=10259", "--leader-elect=false",
                "--v=1",
            ],
        )  # fmt: skip

    def _start_containerd(self) -> None:
        s, run = self.state, self.run_dir
        (s / "cni" / "10-e2e-lo.conflist").write_text(
            '{"cniVersion": "0.4.0", "name": "e2e-lo", "plugins": [{"type": "loopback"}]}\n'
        )
        config = f"""\
            version = 2
            root = "{s}/containerd"
            state = "{run}/containerd"
            disabled_plugins = ["io.containerd.snapshotter.v1.aufs",
              "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
              "io.containerd.snapshotter.v1.devmapper"]
            [grpc]
              address = "{run}/containerd.sock"
            [plugins."io.containerd.internal.v1.opt"]
              path = "{s}/containerd-opt"
            [plugins."io.containerd.grpc.v1.cri"]
              sandbox_image = "localhost/pause:e2e"
              restrict_oom_score_adj = true
              stream_server_address = "127.0.0.1"
              stream_server_port = "0"
              [plugins."io.containerd.grpc.v1.cri".containerd]
                snapshotter = "overlayfs"
                default_runtime_name = "runc"
                [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
                  runtime_type = "io.containerd.runc.v2"
                  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
                    SystemdCgroup = false
              [plugins."io.containerd.grpc.v1.cri".cni]
                bin_dir = "{CNI_BIN}"
                conf_dir = "{s}/cni"
            """
        (s / "containerd.toml").write_text(textwrap.dedent(config))
        self._spawn("containerd", ["containerd", "--config", str(s / "containerd.toml")])
        ctr = ["ctr", "--address", str(run / "containerd.sock"), "-n", "k8s.io"]
        wait_until("containerd", lambda: self._ok(*ctr, "version"), 30)
        for image in self.images:
            self._run(*ctr, "images", "import", str(image))

    def _start_kubelet(self) -> None:
        s, p = self.state, self.pki
        config = f"""\
            apiVersion: kubelet.config.k8s.io/v1beta1
            kind: KubeletConfiguration
            address: 127.0.0.1
            port: 10250
            readOnlyPort: 0
            healthzBindAddress: 127.0.0.1
            healthzPort: 10248
            authentication:
              anonymous: {{enabled: false}}
              webhook: {{enabled: true}}
              x509: {{clientCAFile: "{p}/ca.crt"}}
            authorization: {{mode: Webhook}}
            tlsCertFile: "{p}/kubelet-serving.crt"
            tlsPrivateKeyFile: "{p}/kubelet-serving.key"
            containerRuntimeEndpoint: "unix://{self.run_dir}/containerd.sock"
            cgroupDriver: cgroupfs
            failCgroupV1: false
            failSwapOn: false
            clusterDomain: cluster.local
            resolvConf: /etc/resolv.conf
            serializeImagePulls: false
            evictionHard: {{memory.available: "100Mi", nodefs.available: "5%", imagefs.available: "5%"}}
            imageGCHighThresholdPercent: 95
            imageGCLowThresholdPercent: 90
            """  # noqa: E501
        (s / "kubelet-config.yaml").write_text(textwrap.dedent(config))
        self._spawn(
            "kubelet",
            [
                str(self.bin / "kubelet"), f"--config={s}/kubelet-config.yaml",
                f"--kubeconfig={s}/kubelet.kubeconfig", f"--hostname-override={NODE}", "--v=2",
            ],
        )  # fmt: skip
        wait_until("the node Ready", self.node_ready, 120, step=1)

    def node_ready(self) -> bool:
        node = self.get("node", NODE)
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]
        )

    # --- processes -------------------------------------------------------------------------

    def _spawn(self, name: str, command: list[str]) -> None:
        self._commands[name] = command
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (the child holds it)
        try:
            child = subprocess.Popen(
                command, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )
        finally:
            log.close()
        self._pids[name] = child.pid

    def _run(self, *command: str) -> None:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise Failed(f"{' '.join(command)}: {done.stderr.strip()[-2000:]}")

    def _out(self, *command: str) -> str:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        return done.stdout

    def _ok(self, *command: str) -> bool:
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0

    def _curl(self, url: str, *args: str) -> bool:
        return self._ok("curl", "-sf", "-m", "2", *args, url)
