"""Who the plugin is in the cluster, for what it publishes through the Kubernetes API (GPU
Feature Discovery's NodeFeature object): its node, its namespace and its pod, with GFD's
variables -- ``NODE_NAME`` (``--node-name``; the downward API's ``spec.nodeName``), ``NAMESPACE``
and ``POD_NAME`` (the downward API's ``metadata.namespace`` and ``metadata.name``) -- and how to
reach the API (``KUBECONFIG`` / ``--kubeconfig``, else the service account). Read here, where the
config package reads the environment, and handed to the daemon."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from nvplugin.errors import show
from nvplugin.kube.kubeconfig import ApiAccess

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A DNS subdomain (RFC 1123), the form of every Node's, Namespace's and Pod's name."""
MAX_NAME = 253


def name_problem(variable: str, value: str) -> str | None:
    """Why ``value`` cannot be the name of a Kubernetes object (None: it can): it goes into
    request paths, so anything but a DNS subdomain is refused rather than escaped."""
    if len(value) > MAX_NAME or not _SUBDOMAIN.fullmatch(value):
        return (
            f"{variable} {show(value)} is not a Kubernetes object name (a DNS subdomain: "
            f"lower-case letters, digits, '-' and '.', at most {MAX_NAME} characters)"
        )
    return None


@dataclass(frozen=True)
class PodIdentity:
    """The plugin's node, namespace and pod (None: not given), and the API's credentials."""

    node_name: str | None = None
    namespace: str | None = None
    pod_name: str | None = None
    access: ApiAccess = field(default_factory=ApiAccess)

    def problem(self) -> str | None:
        """Why nothing can be published (None: it can be tried). A missing POD_NAME is no
        problem: the object is then published without an owner."""
        if not self.node_name:
            return "NODE_NAME is not set (the downward API's spec.nodeName)"
        if not self.namespace:
            return "NAMESPACE is not set (the downward API's metadata.namespace)"
        for variable, value in (
            ("NODE_NAME", self.node_name),
            ("NAMESPACE", self.namespace),
            ("POD_NAME", self.pod_name),
        ):
            problem = name_problem(variable, value) if value else None
            if problem is not None:
                return problem
        return self.access.problem()


def read_pod(flags: Mapping[str, object], env: Mapping[str, str]) -> PodIdentity:
    """The identity from ``serve``'s flags (``node_name``, ``kubeconfig``; None or "": not
    given) and the environment."""

    def value(key: str, variable: str) -> str | None:
        given = flags.get(key)
        if given not in (None, ""):
            return str(given)
        return env.get(variable) or None

    return PodIdentity(
        node_name=value("node_name", "NODE_NAME"),
        namespace=env.get("NAMESPACE") or None,
        pod_name=env.get("POD_NAME") or None,
        access=ApiAccess.of(value("kubeconfig", "KUBECONFIG"), env),
    )
