"""``nvplugin probe``: is the plugin on this socket alive, and is it doing its job?

For a person or an exec probe (the chart's probes are the kubelet's httpGet on the plugin's
``/livez`` and ``/readyz``, which answer the same statuses without a process per probe). It asks
the standard gRPC health service (``grpc.health.v1.Health/Check``) on the plugin socket, which
``nvplugin serve`` reports as SERVING only while it is registered with the kubelet and (by
default) has a healthy GPU; see :mod:`nvplugin.plugin.healthservice`. Two questions, two uses:

- ready (the default): exit 0 only when SERVING. The readiness probe: a plugin the kubelet does
  not know, or whose GPUs are all Unhealthy, shows as NotReady instead of looking fine.
- live (``--live``): exit 0 on any answer, SERVING or NOT_SERVING. The liveness and startup
  probes: a wedged process (event loop stuck) does not answer in time and is restarted, but a
  plugin whose GPUs fell off the bus is not restarted in a loop for it.

A failure names the socket and the cause (no socket, nobody listening, no answer in time, the
status and the plugin's reason for it).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from nvplugin.errors import NvpluginError


@dataclass(frozen=True)
class ProbeResult:
    """What the plugin's health service answered."""

    socket: str
    service: str
    status: str  # SERVING, NOT_SERVING, ... (the grpc.health.v1 enum name)
    reason: str  # the plugin's explanation ("" when it gave none)

    @property
    def serving(self) -> bool:
        return self.status == "SERVING"


def probe_socket(
    socket_path: str, timeout_s: float, *, service: str = "", live: bool = False
) -> ProbeResult:
    """Ask the health service on ``socket_path`` about ``service`` ("" = the plugin as a whole).

    Raises :class:`NvpluginError` (exit 1) with a message naming the socket when there is no
    socket, it is not a socket, nothing listens on it, no answer comes within ``timeout_s``, the
    call fails, or -- unless ``live`` -- the status is not SERVING.
    """
    try:
        mode = os.stat(socket_path).st_mode
    except FileNotFoundError:
        raise NvpluginError(
            f"no plugin socket at {socket_path}: the plugin is not serving "
            "(not started yet, exited, or the kubelet removed the socket on restart)"
        ) from None
    except OSError as exc:
        raise NvpluginError(f"cannot stat plugin socket {socket_path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise NvpluginError(f"{socket_path} is not a unix socket")

    # Imported here: the command must start fast, and only this path needs gRPC.
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from nvplugin.plugin.healthservice import REASON_KEY

    # A unix socket never goes through a proxy; make sure an http_proxy in the pod's environment
    # cannot send the probe elsewhere.
    options = [("grpc.enable_http_proxy", 0)]
    with grpc.insecure_channel(
        f"unix://{os.path.abspath(socket_path)}", options=options
    ) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            # Fail fast (no wait_for_ready): a stale socket with no listener is reported as
            # "connection refused" at once, not as a timeout that hides the cause.
            answer, call = stub.Check.with_call(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise NvpluginError(
                    f"plugin socket {socket_path} did not answer the health check "
                    f"within {timeout_s:g}s"
                ) from None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = code.name if code is not None else "error"
            hint = (
                " (no gRPC health service on this socket: is it an nvplugin socket?)"
                if code == grpc.StatusCode.UNIMPLEMENTED
                else ""
            )
            raise NvpluginError(
                f"plugin socket {socket_path} failed the health check: {name}: {details}{hint}"
            ) from None
        reason = ""
        for key, value in call.trailing_metadata() or ():
            if key == REASON_KEY:
                reason = str(value)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    result = ProbeResult(socket=socket_path, service=service, status=status, reason=reason)
    if not live and not result.serving:
        why = f": {reason}" if reason else ""
        raise NvpluginError(f"plugin socket {socket_path} is {status}{why}")
    return result
