"""The start-up check of the kubelet's directory: what a plugin run as a non-root user is told
(the end-to-end test runs the real command as whatever user the tests run as)."""

from __future__ import annotations

import os
import socket as sock
import tempfile

import pytest

from nvplugin.errors import InputError
from nvplugin.plugin import diraccess


def test_a_non_root_user_is_told_who_it_is_and_to_run_as_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = tempfile.mkdtemp()
    try:
        os.chmod(directory, 0o755)
        monkeypatch.setattr(diraccess.os, "geteuid", lambda: 10001)
        monkeypatch.setattr(diraccess.os, "access", lambda path, mode, effective_ids: False)
        with pytest.raises(InputError) as caught:
            diraccess.check_device_plugin_access(directory, os.path.join(directory, "kubelet.sock"))
        assert caught.value.exit_code == 2
        message = str(caught.value)
        assert message.startswith(
            f"the plugin runs as uid 10001, which may not create its socket in {directory} "
            f"(owned by uid {os.stat(directory).st_uid}"
        )
        assert "with mode 0755" in message
        assert "run the plugin as root (the image's default user; the chart's " in message
        assert "securityContext.runAsUser: 0)" in message
    finally:
        os.rmdir(directory)


def test_a_kubelet_socket_it_may_not_connect_to(monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tempfile.mkdtemp()
    socket = os.path.join(directory, "kubelet.sock")
    try:
        listener = sock.socket(sock.AF_UNIX, sock.SOCK_STREAM)
        listener.bind(socket)
        monkeypatch.setattr(diraccess.os, "geteuid", lambda: 10001)
        monkeypatch.setattr(
            diraccess.os, "access", lambda path, mode, effective_ids: path == directory
        )
        with pytest.raises(InputError, match=f"which may not connect to {socket}"):
            diraccess.check_device_plugin_access(directory, socket)
    finally:
        listener.close()
        os.unlink(socket)
        os.rmdir(directory)


def test_a_directory_this_user_may_use_passes() -> None:
    directory = tempfile.mkdtemp()
    try:
        diraccess.check_device_plugin_access(directory, os.path.join(directory, "kubelet.sock"))
        diraccess.check_device_plugin_access(os.path.join(directory, "missing"), "/nonexistent")
    finally:
        os.rmdir(directory)
