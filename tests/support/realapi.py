"""A real Kubernetes API for tests: etcd, kube-apiserver and kube-scheduler started from
``$KUBEBUILDER_ASSETS`` (envtest's variable and layout), on 127.0.0.1 with free ports.

tests/support/kubeapi.py is the project's own reading of the API, good for faults; this is the
API itself, so a field it refuses, a CRD schema that does not validate or RBAC its authorizer
denies fails a test. One :class:`RealAPI` serves a whole pytest session (tests/conftest.py's
``real_api`` fixture): TLS with a CA made here, the RBAC authorizer on, an admin token, and
service account tokens minted through TokenRequest so the plugin runs with exactly the RBAC a
test applies. No controller runs unless asked (:meth:`RealAPI.garbage_collector`): no
``default`` ServiceAccount appears by itself (:meth:`RealAPI.namespace` makes it), Nodes are API
objects only.

Everything lives in one temporary directory (under the test run's directory) and every process
is stopped by :meth:`RealAPI.stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from lightkube import AsyncClient

from nvplugin.kube import ApiAccess
from nvplugin.kube.client import open_client

ASSETS_ENV = "KUBEBUILDER_ASSETS"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")
CONTROLLER_MANAGER = "kube-controller-manager"
"""Optional beside them (envtest's layout has none; the Makefile adds it when it can): runs the
garbage collector for :meth:`RealAPI.garbage_collector`."""
START_S = 60.0
"""Longest wait for a component to answer (generous: only reached when something is broken)."""
STOP_S = 15.0
"""Longest wait for a component to exit after SIGTERM before it is killed."""
OUTAGE_GRACE_S = 2.0
"""How long :meth:`RealAPI.outage` lets kube-apiserver drain before killing it."""
REQUEST_S = 30.0
FIELD_MANAGER = "tests"
ADMIN_USER = "realapi-admin"
UNSCHEDULED = "realapi-unscheduled"
"""The scheduler name :meth:`RealAPI.add_pod` gives a Pod by default: no scheduler serves it, so
the kube-schedulers other tests start leave such a Pod (an API object only) alone."""
SERVICE_CIDR = "10.96.0.0/16"

Json = dict[str, Any]


def cluster_rbac(objects: Iterable[Json]) -> list[Json]:
    """The chart's ServiceAccount, ClusterRole and ClusterRoleBinding among ``objects``."""
    return [
        o for o in objects if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]


@contextlib.asynccontextmanager
async def client_of(kubeconfig: Path) -> AsyncIterator[AsyncClient]:
    """nvplugin's own API client (:mod:`nvplugin.kube.client`) through ``kubeconfig``."""
    client = await asyncio.to_thread(open_client, ApiAccess(kubeconfig=str(kubeconfig)))
    try:
        yield client
    finally:
        await client.close()


class RealAPIError(Exception):
    """A non-2xx answer: ``status`` (the HTTP code) and ``body`` (the decoded Status object, or
    the text when it is not JSON)."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:500]
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status
        self.body = body


class AssetsMissing(Exception):
    """``$KUBEBUILDER_ASSETS`` is unset or lacks a binary: the tier cannot start."""


def assets_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The directory ``$KUBEBUILDER_ASSETS`` names, holding every binary; else
    :class:`AssetsMissing` saying what is missing."""
    value = env.get(ASSETS_ENV, "")
    if not value:
        raise AssetsMissing(f"{ASSETS_ENV} is not set")
    root = Path(value)
    missing = [b for b in BINARIES if not os.access(root / b, os.X_OK)]
    if missing:
        raise AssetsMissing(f"{ASSETS_ENV}={value} has no executable {', '.join(missing)}")
    return root


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certificates(where: Path) -> None:
    """A CA (``ca.crt``), a server certificate it signs for 127.0.0.1/localhost (``server.crt``,
    ``server.key``) and the service account signing key (``sa.key``, ``sa.pub``)."""
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{where}/ca.key")
    _openssl(
        "req", "-x509", "-new", "-key", f"{where}/ca.key", "-out", f"{where}/ca.crt",
        "-days", "2", "-subj", "/CN=nvplugin-test-ca",
    )  # fmt: skip
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{where}/server.key")
    _openssl(
        "req", "-new", "-key", f"{where}/server.key", "-out", f"{where}/server.csr",
        "-subj", "/CN=kube-apiserver",
    )  # fmt: skip
    (where / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    )
    _openssl(
        "x509", "-req", "-in", f"{where}/server.csr", "-CA", f"{where}/ca.crt",
        "-CAkey", f"{where}/ca.key", "-CAcreateserial", "-out", f"{where}/server.crt",
        "-days", "2", "-extfile", f"{where}/server.ext",
    )  # fmt: skip
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{where}/sa.ec")
    _openssl("pkcs8", "-topk8", "-nocrypt", "-in", f"{where}/sa.ec", "-out", f"{where}/sa.key")
    _openssl("ec", "-in", f"{where}/sa.key", "-pubout", "-out", f"{where}/sa.pub")


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str, user: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "real", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": user}}],
        "current-context": "real",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class _Process:
    """One component: its command, its log file, the running process."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Killed with this process if it dies without stopping it (a test run killed): the
        # signal comes when the starting *thread* ends, so only from the main thread.
        dies_with_us = threading.current_thread() is threading.main_thread()
        argv = self.argv
        if dies_with_us:
            argv = [sys.executable, "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = STOP_S) -> None:
        """SIGTERM; SIGKILL after ``grace_s``."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_S)

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def failure(self, what: str) -> RuntimeError:
        code = self.proc.poll() if self.proc is not None else None
        state = f"exited with {code}" if code is not None else "still running"
        return RuntimeError(
            f"{self.name} {what} ({state}); its log {self.log} ends:\n{self.tail()}"
        )


_DIE_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)  # the parent went before the signal was set
os.execvp(sys.argv[2], sys.argv[2:])
"""
"""Run before a component's own program, in its process: SIGKILL when the parent goes. Not a
``preexec_fn``: that makes subprocess fork() and run Python in the child, where grpcio's fork
handlers restart its poller on descriptors the child then closes (kube-controller-manager
died of SIGABRT that way, "epoll_wait error: Bad file descriptor", once in a CI run)."""


def _wait_healthy(component: _Process, url: str, context: ssl.SSLContext, headers: Json) -> None:
    deadline = time.monotonic() + START_S
    while True:
        if component.proc is None or component.proc.poll() is not None:
            raise component.failure("did not start")
        try:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=5, context=context) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise component.failure(f"did not answer {url} within {START_S:g} s")
        time.sleep(0.1)


def _insecure() -> ssl.SSLContext:
    """For a component's own health endpoint: it serves a self-signed certificate it made."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _documents(objs_or_yaml: Json | Iterable[Json] | str) -> list[Json]:
    if isinstance(objs_or_yaml, str):
        return [d for d in yaml.safe_load_all(objs_or_yaml) if d]
    if isinstance(objs_or_yaml, dict):
        return [objs_or_yaml]
    return [d for d in objs_or_yaml if d]


@dataclass
class RealAPI:
    """etcd and kube-apiserver, started by :meth:`start`, stopped by :meth:`stop`."""

    assets: Path
    root: Path
    server: str = ""
    ca_file: Path = field(init=False)
    admin_kubeconfig: Path = field(init=False)
    started_s: float = 0.0
    """How long :meth:`start` took (certificates, etcd, the apiserver up to /readyz)."""
    _token: str = field(default="", repr=False)
    _etcd: _Process | None = None
    _apiserver: _Process | None = None
    _context: ssl.SSLContext | None = None
    _resources: dict[tuple[str, str], tuple[str, bool]] = field(default_factory=dict)
    _schedulers: list[RealScheduler] = field(default_factory=list)
    _controller_manager: _Process | None = None

    def __post_init__(self) -> None:
        self.ca_file = self.root / "pki" / "ca.crt"
        self.admin_kubeconfig = self.root / "admin.kubeconfig"

    @classmethod
    def start_from_env(cls) -> RealAPI:
        """Started from ``$KUBEBUILDER_ASSETS`` in a fresh temporary directory."""
        api = cls(assets_dir(), Path(tempfile.mkdtemp(prefix="realapi-")))
        try:
            api.start()
        except BaseException:
            api.stop()
            raise
        return api

    # -- the processes ---------------------------------------------------------------------

    def start(self) -> None:
        began = time.monotonic()
        pki = self.root / "pki"
        pki.mkdir(exist_ok=True)
        make_certificates(pki)
        self._token = secrets.token_hex(24)
        (self.root / "tokens.csv").write_text(
            f'{self._token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
        )
        self._context = ssl.create_default_context(cafile=str(self.ca_file))
        for attempt in range(3):  # a free port can be taken between choosing and binding it
            try:
                self._start_etcd()
                self._start_apiserver(free_port())
                break
            except RuntimeError:
                self.stop_processes()
                if attempt == 2:
                    raise
        write_kubeconfig(self.admin_kubeconfig, self.server, self.ca_file, self._token, ADMIN_USER)
        self.started_s = time.monotonic() - began

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        data = self.root / "etcd"
        shutil.rmtree(data, ignore_errors=True)
        self._etcd_url = f"http://127.0.0.1:{client}"
        self._etcd = _Process(
            "etcd",
            [
                str(self.assets / "etcd"),
                f"--data-dir={data}",
                f"--listen-client-urls={self._etcd_url}",
                f"--advertise-client-urls={self._etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            self.root / "etcd.log",
        )
        self._etcd.start()
        _wait_healthy(self._etcd, f"{self._etcd_url}/health", ssl.create_default_context(), {})

    def _start_apiserver(self, port: int) -> None:
        pki = self.root / "pki"
        self.server = f"https://127.0.0.1:{port}"
        self._apiserver = _Process(
            "kube-apiserver",
            [
                str(self.assets / "kube-apiserver"),
                f"--etcd-servers={self._etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'server.crt'}",
                f"--tls-private-key-file={pki / 'server.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={self.root / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--anonymous-auth=false",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--v=1",
            ],
            self.root / "kube-apiserver.log",
        )
        self._apiserver.start()
        _wait_healthy(self._apiserver, f"{self.server}/readyz", self._ssl(), self._auth())

    def stop_processes(self) -> None:
        for scheduler in list(self._schedulers):
            scheduler.stop()
        for component in (self._controller_manager, self._apiserver, self._etcd):
            if component is not None:
                component.stop()

    def stop(self) -> None:
        """Stops every process started here and removes the directory."""
        self.stop_processes()
        shutil.rmtree(self.root, ignore_errors=True)

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """kube-apiserver stopped for the block (etcd keeps the data); started again on the same
        port after it, once it answers /readyz. Stopped with SIGTERM, killed after
        :data:`OUTAGE_GRACE_S`: it drains open watches for longer than tests should wait."""
        assert self._apiserver is not None
        self._apiserver.stop(OUTAGE_GRACE_S)
        try:
            yield
        finally:
            port = int(self.server.rsplit(":", 1)[1])
            self._start_apiserver(port)

    @contextlib.contextmanager
    def garbage_collector(self) -> Iterator[None]:
        """kube-controller-manager running its garbage collector alone, for the block: objects
        whose owners are gone are deleted (``ownerReferences``), as in a cluster. Only for the
        block: other tests' objects may name owners that never existed.
        :class:`AssetsMissing` when ``$KUBEBUILDER_ASSETS`` has no kube-controller-manager."""
        binary = self.assets / CONTROLLER_MANAGER
        if not os.access(binary, os.X_OK):
            raise AssetsMissing(f"{ASSETS_ENV}={self.assets} has no {CONTROLLER_MANAGER}")
        port = free_port()
        self._controller_manager = _Process(
            CONTROLLER_MANAGER,
            [
                str(binary),
                f"--kubeconfig={self.admin_kubeconfig}",
                "--controllers=garbagecollector",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--authentication-kubeconfig={self.admin_kubeconfig}",
                f"--authorization-kubeconfig={self.admin_kubeconfig}",
                "--authentication-skip-lookup=true",
                f"--cert-dir={self.root / CONTROLLER_MANAGER}",
                "--v=1",
            ],
            self.root / f"{CONTROLLER_MANAGER}.log",
        )
        try:
            self._controller_manager.start()
            _wait_healthy(
                self._controller_manager, f"https://127.0.0.1:{port}/healthz", _insecure(), {}
            )
            yield
        finally:
            self._controller_manager.stop()
            self._controller_manager = None

    def logs(self) -> dict[str, str]:
        """The last lines of each component's log (for a failing test's message)."""
        found = {c.name: c.tail() for c in (self._etcd, self._apiserver) if c is not None}
        found.update({s.name: s.process.tail() for s in self._schedulers})
        return found

    # -- requests ----------------------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = ssl.create_default_context(cafile=str(self.ca_file))
        return self._context

    def _auth(self, token: str | None = None) -> Json:
        return {"Authorization": f"Bearer {token or self._token}"}

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str | None = None,
        token: str | None = None,
    ) -> Json:
        """``method path`` as admin (or as ``token``'s owner); the decoded answer.
        :class:`RealAPIError` on a non-2xx answer."""
        url = self.server + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        headers = {**self._auth(token), "Accept": "application/json"}
        data: bytes | None = None
        if body is not None:
            if isinstance(body, bytes):
                data = body
            elif isinstance(body, str):
                data = body.encode()
            else:
                data = json.dumps(body).encode()
            if content_type is None:
                content_type = (
                    "application/merge-patch+json" if method == "PATCH" else "application/json"
                )
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_S, context=self._ssl()) as r:
                text = r.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                decoded: Any = json.loads(raw)
            except ValueError:
                decoded = raw.decode(errors="replace")
            raise RealAPIError(method, path, exc.code, decoded) from None
        return json.loads(text) if text else {}

    def _resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """The plural name of ``kind`` in ``api_version`` and whether it is namespaced, by
        discovery (asked again on a miss: a CRD installed since)."""
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            for resource in self.request("GET", base).get("resources") or []:
                if "/" not in resource["name"]:
                    found = (resource["name"], bool(resource["namespaced"]))
                    self._resources[(api_version, resource["kind"])] = found
        if key not in self._resources:
            raise KeyError(f"the API serves no kind {kind} in {api_version}")
        return self._resources[key]

    def path_of(self, obj: Json, *, namespace: str | None = None) -> str:
        """The URL path of ``obj`` (by apiVersion, kind, metadata.name and namespace)."""
        api_version, kind = obj["apiVersion"], obj["kind"]
        plural, namespaced = self._resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            ns = obj.get("metadata", {}).get("namespace") or namespace or "default"
            base += f"/namespaces/{ns}"
        return f"{base}/{plural}/{obj['metadata']['name']}"

    def apply(
        self,
        objs_or_yaml: Json | Iterable[Json] | str,
        *,
        dry_run: bool = False,
        namespace: str | None = None,
    ) -> list[Json]:
        """Server-side apply (field manager ``tests``, forced) of one object, a list or YAML
        text of one or more documents, in order; the applied objects as the server returned
        them. ``dry_run``: validated and admitted, not stored."""
        params = {"fieldManager": FIELD_MANAGER, "force": "true"}
        if dry_run:
            params["dryRun"] = "All"
        return [
            self.request(
                "PATCH",
                self.path_of(obj, namespace=namespace),
                obj,
                params=params,
                content_type="application/apply-patch+yaml",
            )
            for obj in _documents(objs_or_yaml)
        ]

    def delete(self, obj: Json, *, namespace: str | None = None) -> None:
        """Deletes ``obj``; gone already is fine."""
        try:
            self.request("DELETE", self.path_of(obj, namespace=namespace))
        except RealAPIError as exc:
            if exc.status != 404:
                raise

    def install_crd(self, obj_or_path: Json | str | Path) -> Json:
        """Applies the CustomResourceDefinition (an object, a file's path, or YAML text) and
        waits until it is Established and served."""
        if isinstance(obj_or_path, str) and "\n" not in obj_or_path and os.path.isfile(obj_or_path):
            obj_or_path = Path(obj_or_path)
        if isinstance(obj_or_path, Path):
            obj_or_path = obj_or_path.read_text()
        (crd,) = _documents(obj_or_path)
        applied = self.apply(crd)[0]
        name = applied["metadata"]["name"]
        group = applied["spec"]["group"]
        kind = applied["spec"]["names"]["kind"]
        served = [v["name"] for v in applied["spec"]["versions"] if v.get("served")]
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        deadline = time.monotonic() + START_S
        while True:
            current = self.request("GET", path)
            conditions = (current.get("status") or {}).get("conditions") or []  # null at first
            established = any(
                c.get("type") == "Established" and c.get("status") == "True" for c in conditions
            )
            if established:
                try:
                    for version in served:
                        self._resources.pop((f"{group}/{version}", kind), None)
                        self._resource(f"{group}/{version}", kind)
                    return current
                except (KeyError, RealAPIError):
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not established within {START_S:g} s")
            time.sleep(0.05)

    # -- objects tests need ----------------------------------------------------------------

    def namespace(self, prefix: str) -> str:
        """A fresh namespace ``<prefix>-<random>`` with its ``default`` ServiceAccount (no
        controller-manager makes it here, and Pods need it)."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        self._create(
            f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}}
        )
        return name

    def _create(self, path: str, body: Json) -> Json:
        """POST; an object of that name already there is fine (its current state is returned)."""
        try:
            return self.request("POST", path, body)
        except RealAPIError as exc:
            if exc.status != 409:
                raise
            return self.request("GET", f"{path}/{body['metadata']['name']}")

    def token(self, namespace: str, name: str, *, expiration_s: int = 3600) -> str:
        """A token for ServiceAccount ``namespace/name`` (made if missing), by TokenRequest."""
        self._create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}}
        )
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_s},
            },
        )
        return str(answer["status"]["token"])

    def account_kubeconfig(self, namespace: str, rbac: Iterable[Json]) -> Path:
        """:meth:`service_account_kubeconfig` of the one ServiceAccount among ``rbac`` (the
        chart's objects in ``namespace``)."""
        (account,) = [o for o in rbac if o["kind"] == "ServiceAccount"]
        return self.service_account_kubeconfig(namespace, account["metadata"]["name"])

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        """A kubeconfig holding a fresh token of ServiceAccount ``namespace/name`` (made if
        missing); its rights are whatever RBAC the test applied."""
        token = self.token(namespace, name)
        path = self.root / f"{namespace}.{name}.{uuid.uuid4().hex[:6]}.kubeconfig"
        return write_kubeconfig(path, self.server, self.ca_file, token, f"{namespace}:{name}")

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
        ready: bool = True,
    ) -> Json:
        """A Node object (no kubelet behind it); capacity and allocatable set through the status
        subresource, as a kubelet would. ``ready``: its Ready condition True and the not-ready
        taint the API server puts on a new Node removed (no node controller runs here to do
        either), so that kube-scheduler places Pods on it. The Node as stored."""
        node = self.request(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels or {}},
            },
        )
        status: Json = {}
        if capacity is not None or allocatable is not None:
            status["capacity"] = dict(capacity or allocatable or {})
            status["allocatable"] = dict(allocatable or capacity or {})
        if ready:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            status["conditions"] = [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "an API-only Node of the real-API test tier",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ]
        if status:
            node = self.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": status})
        taints = (node.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != "node.kubernetes.io/not-ready"]
        if ready and kept != taints:
            node = self.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": kept}})
        return node

    def add_pod(self, namespace: str, name: str, *, spec: Mapping[str, Any] | None = None) -> Json:
        """A Pod object (nothing runs it): one container unless ``spec`` says otherwise, no
        token mounted, and scheduler :data:`UNSCHEDULED` unless ``spec`` names one. The Pod as
        stored (its ``metadata.uid`` is the server's)."""
        body: Json = {
            "schedulerName": UNSCHEDULED,
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "realapi:test"}],
            **(spec or {}),
        }
        return self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body},
        )

    def until_allowed(self, token: str, method: str, path: str) -> None:
        """Waits until ``token``'s owner may ``method path`` (a binding just applied reaches the
        authorizer's cache after a moment); :class:`RealAPIError` (403) after :data:`START_S`."""
        deadline = time.monotonic() + START_S
        while True:
            try:
                self.request(method, path, token=token)
                return
            except RealAPIError as exc:
                if exc.status != 403 or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def label_node(self, name: str, labels: Mapping[str, str | None]) -> Json:
        """Sets (a value) or removes (None) labels of Node ``name``, as ``kubectl label`` does
        (a merge patch); the Node as stored."""
        return self.request("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": labels}})

    def env(self, kubeconfig: Path | str, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a child ``nvplugin serve`` that uses ``kubeconfig``: KUBECONFIG
        set, the in-cluster variables removed, 127.0.0.1 kept off any proxy."""
        env = dict(os.environ if base is None else base)
        for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
            env.pop(name, None)
        env["KUBECONFIG"] = str(kubeconfig)
        no_proxy = [p for p in env.get("NO_PROXY", "").split(",") if p]
        env["NO_PROXY"] = ",".join([*no_proxy, "127.0.0.1", "localhost"])
        return env

    # -- the scheduler -----------------------------------------------------------------------

    def scheduler(self, config_yaml: str) -> RealScheduler:
        """kube-scheduler against this API with the KubeSchedulerConfiguration ``config_yaml``
        (its ``clientConnection.kubeconfig`` defaults to the admin's, leader election to off);
        started and healthy. Stopped by :meth:`RealScheduler.stop` or :meth:`stop`."""
        scheduler = RealScheduler(self, config_yaml)
        self._schedulers.append(scheduler)
        try:
            scheduler.start()
        except BaseException:
            scheduler.stop()
            raise
        return scheduler


class RealScheduler:
    """kube-scheduler started against a :class:`RealAPI` (see :meth:`RealAPI.scheduler`)."""

    def __init__(self, api: RealAPI, config_yaml: str) -> None:
        self.api = api
        self.name = f"kube-scheduler-{uuid.uuid4().hex[:6]}"
        config = yaml.safe_load(config_yaml) or {}
        config.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
        config.setdefault("kind", "KubeSchedulerConfiguration")
        connection = config.setdefault("clientConnection", {})
        connection.setdefault("kubeconfig", str(api.admin_kubeconfig))
        config.setdefault("leaderElection", {}).setdefault("leaderElect", False)
        self.config = config
        self.config_file = api.root / f"{self.name}.yaml"
        self.config_file.write_text(yaml.safe_dump(config))
        self.port = 0
        self.process = _Process(self.name, [], api.root / f"{self.name}.log")

    def start(self) -> None:
        for attempt in range(3):
            self.port = free_port()
            self.process.argv = [
                str(self.api.assets / "kube-scheduler"),
                f"--config={self.config_file}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--authentication-kubeconfig={self.api.admin_kubeconfig}",
                f"--authorization-kubeconfig={self.api.admin_kubeconfig}",
                "--authentication-skip-lookup=true",
                f"--cert-dir={self.api.root / self.name}",
                "--v=2",
            ]
            self.process.start()
            try:
                _wait_healthy(
                    self.process, f"https://127.0.0.1:{self.port}/readyz", _insecure(), {}
                )
                return
            except RuntimeError:
                self.process.stop()
                if attempt == 2:
                    raise

    def stop(self) -> None:
        self.process.stop()
        with contextlib.suppress(ValueError):
            self.api._schedulers.remove(self)

    def running(self) -> bool:
        return self.process.running()
