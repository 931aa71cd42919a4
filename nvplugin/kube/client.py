"""The API client (lightkube's :class:`AsyncClient`) from
:class:`~nvplugin.kube.kubeconfig.ApiAccess`.

Every request is bounded: connecting, writing and waiting in the pool by ``request_s``; reading
by ``read_s``, which must outlast the quiet stretches of a watch (the API server ends a watch
cleanly after the ``timeoutSeconds`` it was asked for, so ``read_s`` only catches a server that
hangs). Callers also put their own deadline around a whole request (:data:`REQUEST_S`).

Building the client reads files (the kubeconfig, the token, the CA): call :func:`open_client`
off the event loop.
"""

from __future__ import annotations

import httpx2
from lightkube import AsyncClient, ConfigError, KubeConfig
from lightkube.config.models import Cluster, User

from nvplugin.errors import NvpluginError, reason
from nvplugin.kube.kubeconfig import ApiAccess

REQUEST_S = 10.0
"""Longest wait for one request's answer (connect, send, receive)."""
WATCH_S = 240
"""How long the API server keeps one watch open (``timeoutSeconds``) before the client resumes
it from the last resourceVersion."""
READ_S = WATCH_S + 30.0
"""Longest silence on a connection before it counts as dead."""


class ApiUnavailable(NvpluginError):
    """No client can be built from the credentials (a bad kubeconfig, an unreadable token)."""


def open_client(
    access: ApiAccess, *, request_s: float = REQUEST_S, read_s: float = READ_S
) -> AsyncClient:
    """A client for ``access`` (blocking: reads files). Raises :class:`ApiUnavailable`."""
    problem = access.problem()
    if problem is not None:
        raise ApiUnavailable(problem)
    try:
        if access.kubeconfig is not None:
            config = KubeConfig.from_file(access.kubeconfig)
        else:
            host = access.service_host or ""
            if ":" in host:
                host = f"[{host}]"
            config = KubeConfig.from_one(
                cluster=Cluster(
                    server=f"https://{host}:{access.service_port}",
                    certificate_auth=f"{access.service_account_dir}/ca.crt",
                ),
                # Re-read on a 401: the kubelet rotates the projected token.
                user=User(token_file=access.token_file),
            )
        timeout = httpx2.Timeout(request_s, read=read_s)
        # trust_env: HTTPS_PROXY / NO_PROXY apply, as they do to client-go.
        return AsyncClient(config=config, timeout=timeout)
    except (ConfigError, OSError, ValueError, KeyError, TypeError) as exc:
        where = access.kubeconfig or access.service_account_dir
        raise ApiUnavailable(f"cannot use the credentials in {where}: {reason(exc)}") from None
