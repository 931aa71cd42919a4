"""``nvplugin probe``: is the plugin on this socket alive and answering?

The chart's liveness, readiness and startup probes run this inside the plugin's container. It
asks the question the kubelet asks first when a plugin registers — ``GetDevicePluginOptions`` on
the plugin socket — so "healthy" means exactly "the kubelet could talk to it now". A process that
is up but wedged (its event loop stuck) does not answer in time, and the probe fails.

A later issue moves the probe to the gRPC health service; the command line stays the same.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from nvplugin.errors import NvpluginError


@dataclass(frozen=True)
class ProbeResult:
    """What the plugin answered: its options, as the kubelet would read them."""

    socket: str
    pre_start_required: bool
    get_preferred_allocation_available: bool


def probe_socket(socket_path: str, timeout_s: float) -> ProbeResult:
    """Call ``GetDevicePluginOptions`` on ``socket_path`` and return the answer.

    Raises :class:`NvpluginError` (exit 1) with a message naming the socket when there is no
    socket, it is not a socket, nothing listens on it, or no answer comes within ``timeout_s``.
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

    from nvplugin.plugin.api.v1beta1 import api_pb2, api_pb2_grpc

    # A unix socket never goes through a proxy; make sure an http_proxy in the pod's environment
    # cannot send the probe elsewhere.
    options = [("grpc.enable_http_proxy", 0)]
    with grpc.insecure_channel(
        f"unix://{os.path.abspath(socket_path)}", options=options
    ) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:
            # Fail fast (no wait_for_ready): a stale socket with no listener is reported as
            # "connection refused" at once, not as a timeout that hides the cause.
            answer = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise NvpluginError(
                    f"plugin socket {socket_path} did not answer GetDevicePluginOptions "
                    f"within {timeout_s:g}s"
                ) from None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = code.name if code is not None else "error"
            raise NvpluginError(
                f"plugin socket {socket_path} failed GetDevicePluginOptions: {name}: {details}"
            ) from None
    return ProbeResult(
        socket=socket_path,
        pre_start_required=answer.pre_start_required,
        get_preferred_allocation_available=answer.get_preferred_allocation_available,
    )
