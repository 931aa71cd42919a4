"""How to reach the Kubernetes API, decided before any client is built: a kubeconfig file
(``KUBECONFIG`` / ``--kubeconfig``), else the in-cluster service account the kubelet mounts,
with the ``KUBERNETES_SERVICE_HOST``/``PORT`` it sets. Pure: no client library is imported."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class ApiAccess:
    """The API's credentials: ``kubeconfig`` when set, else the service account in
    ``service_account_dir`` and the service host and port (the config loader reads them from the
    environment and passes them in)."""

    kubeconfig: str | None = None
    service_host: str | None = None
    service_port: str | None = None
    service_account_dir: str = SERVICE_ACCOUNT_DIR

    @classmethod
    def of(cls, kubeconfig: str | None, env: Mapping[str, str]) -> ApiAccess:
        """``kubeconfig`` (``--kubeconfig`` / ``KUBECONFIG``) when set, else the service account
        with the ``KUBERNETES_SERVICE_HOST``/``PORT`` of ``env``."""
        return cls(
            kubeconfig=kubeconfig,
            service_host=env.get("KUBERNETES_SERVICE_HOST") or None,
            service_port=env.get("KUBERNETES_SERVICE_PORT") or None,
        )

    @property
    def token_file(self) -> str:
        return os.path.join(self.service_account_dir, "token")

    def problem(self) -> str | None:
        """Why there are no credentials to try (None: there are)."""
        if self.kubeconfig is not None:
            if not os.path.isfile(self.kubeconfig):
                return f"KUBECONFIG {self.kubeconfig} is not a file"
            return None
        if not (self.service_host and self.service_port):
            return "no KUBECONFIG, and not in a cluster (KUBERNETES_SERVICE_HOST is not set)"
        if not os.path.isfile(self.token_file):
            return f"no KUBECONFIG, and no service account token at {self.token_file}"
        return None
