"""Whether this process may use the kubelet's device-plugin directory, checked before serving.

The kubelet makes its device-plugin directory root's (mode 0755 on kubelet 1.32) and serves
``kubelet.sock`` in it root's (0755). A plugin must create its socket in that directory (write
permission on it) and connect to ``kubelet.sock`` (write permission on the socket), so it runs
as root -- NVIDIA's image and nvplugin's both do by default. Run as another user (a pod's
``runAsUser``), it could do neither; gRPC then says only "Failed to bind", or the registration
retries forever. This says which user it is, what it cannot do and what to change, and the
plugin exits 2: it is the deployment that is wrong, and restarting will not fix it.
"""

from __future__ import annotations

import os
import pwd
import stat

from nvplugin.errors import InputError


def check_device_plugin_access(directory: str, kubelet_socket: str) -> None:
    """InputError when this process may not create its socket in ``directory`` or connect to
    ``kubelet_socket`` (one that exists); a missing directory is left to the serving code."""
    for path, what, needs, kind in (
        (directory, "create its socket in", os.W_OK | os.X_OK, stat.S_ISDIR),
        (kubelet_socket, "connect to", os.W_OK, stat.S_ISSOCK),
    ):
        try:
            info = os.stat(path)
        except OSError:
            continue
        if not kind(info.st_mode) or os.access(path, needs, effective_ids=True):
            continue  # not a directory (a socket): the serving code says what it is
        uid = os.geteuid()
        owner = f"owned by {_user(info.st_uid)} with mode {info.st_mode & 0o7777:04o}"
        if uid == 0:
            fix = (
                "this root lacks the capability to write what its mode does not let it "
                "(CAP_DAC_OVERRIDE): make it root's and writable by its owner, as the kubelet "
                "does"
            )
        else:
            fix = (
                "the kubelet's device-plugin directory and kubelet.sock are root's: run the "
                "plugin as root (the image's default user; the chart's securityContext.runAsUser: "
                f"0), or give {_user(uid)} write access to them"
            )
        raise InputError(
            f"the plugin runs as {_user(uid)}, which may not {what} {path} ({owner}); {fix}"
        )


def _user(uid: int) -> str:
    """``uid 10001`` or ``uid 0 (root)``."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"
