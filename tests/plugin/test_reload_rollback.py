"""A reload that fails keeps all of the running config: the HTTP endpoints it had already moved to
the new config's addresses go back to the previous ones, whether the in-place apply failed or the
re-serve did (and the previous config was served again). Checked with real HTTP requests to the
ports, on a daemon in process."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import urllib.error
from typing import Any

import pytest

from nvplugin.config import Config, load_config
from nvplugin.plugin.assembly import Resources
from nvplugin.plugin.daemon import Daemon
from tests.support.harness import http_get
from tests.support.waiting import WAIT_S, until

NODE = "workstation-4gpu"


def _free_ports(count: int) -> list[int]:
    """Ports nothing listens on now (the daemon binds them by number, so that going back to the
    previous address is the same port again)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _config(directory: str, metrics: str, probes: str) -> Config:
    return load_config(
        None,
        flags={
            "nvplugin.devicePluginDir": directory,
            "nvplugin.metrics.address": metrics,
            "nvplugin.healthProbes.address": probes,
        },
    )


async def _answer_on(metrics: int, probes: int) -> None:
    """Metrics on port ``metrics``, the probes on ``probes``."""
    status, text = await http_get(metrics, "/metrics", timeout=WAIT_S)
    assert status == 200 and "nvplugin_devices" in text
    status, _ = await http_get(probes, "/livez", timeout=WAIT_S)
    assert status == 200


async def _closed(port: int) -> None:
    with pytest.raises(urllib.error.URLError):
        await http_get(port, "/livez", timeout=WAIT_S)


def test_a_failed_in_place_apply_moves_the_endpoints_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the addresses change (in place): the reload binds the new ones, the apply fails, and
    metrics and probes answer on the old ports again -- the new ones closed."""

    async def body() -> None:
        directory = tempfile.mkdtemp()
        old_metrics, old_probes = _free_ports(2)
        previous = _config(directory, f"127.0.0.1:{old_metrics}", f"127.0.0.1:{old_probes}")
        new = _config(directory, "127.0.0.1:0", "127.0.0.1:0")
        daemon = Daemon(previous, reload=lambda: new, simulate=NODE)
        during: list[tuple[int, int]] = []

        async def failing_apply(self: Resources, config: Config, prior: Config) -> None:
            ports = (daemon.metrics_port, daemon.probe_port)
            assert None not in ports and ports != (old_metrics, old_probes)
            await _answer_on(*ports)  # type: ignore[arg-type]  # moved: served on the new ones
            during.append(ports)  # type: ignore[arg-type]
            raise RuntimeError("the in-place apply fails")

        monkeypatch.setattr(Resources, "apply_in_place", failing_apply)
        task = asyncio.create_task(daemon.run(handle_signals=False))
        try:
            await until(lambda: bool(daemon.services), "the resources served")
            await _answer_on(old_metrics, old_probes)
            daemon.reload()
            await until(lambda: bool(during), "the in-place apply")
            await until(
                lambda: (daemon.metrics_port, daemon.probe_port) == (old_metrics, old_probes),
                "the endpoints back on their addresses",
            )
            assert daemon.config is previous
            await _answer_on(old_metrics, old_probes)
            for port in during[0]:
                await _closed(port)
        finally:
            daemon.stop()
            assert await asyncio.wait_for(task, WAIT_S) == 0

    asyncio.run(asyncio.wait_for(body(), 2 * WAIT_S))


def test_a_failed_reserve_moves_the_endpoints_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new device-plugin directory that cannot be made (a re-serve) and new addresses: the
    reload binds the new addresses, the new config fails to serve, the previous one is served
    again -- and metrics and probes on their old ports, the new ones closed."""

    async def body() -> None:
        directory = tempfile.mkdtemp()
        blocker = os.path.join(tempfile.mkdtemp(), "a-file")
        with open(blocker, "w") as out:
            out.write("not a directory\n")
        old_metrics, old_probes = _free_ports(2)
        previous = _config(directory, f"127.0.0.1:{old_metrics}", f"127.0.0.1:{old_probes}")
        new = _config(os.path.join(blocker, "plugins"), "127.0.0.1:0", "127.0.0.1:0")
        daemon = Daemon(previous, reload=lambda: new, simulate=NODE)
        during: list[tuple[int, int]] = []
        start = Resources.start

        async def watched_start(self: Resources, config: Config, health: Any = None) -> None:
            if config is new:
                ports = (daemon.metrics_port, daemon.probe_port)
                assert None not in ports and ports != (old_metrics, old_probes)
                await _answer_on(*ports)  # type: ignore[arg-type]  # moved: on the new ones
                during.append(ports)  # type: ignore[arg-type]
            await start(self, config, health)

        monkeypatch.setattr(Resources, "start", watched_start)
        task = asyncio.create_task(daemon.run(handle_signals=False))
        try:
            await until(lambda: bool(daemon.services), "the resources served")
            served = daemon.services[0]
            daemon.reload()
            # Served again under the previous config: a new service on the old socket.
            await until(
                lambda: bool(daemon.services) and daemon.services[0] is not served,
                "the previous config served again",
            )
            assert during and daemon.config is previous
            assert (daemon.metrics_port, daemon.probe_port) == (old_metrics, old_probes)
            await _answer_on(old_metrics, old_probes)
            for port in during[0]:
                await _closed(port)
            assert os.path.exists(os.path.join(directory, "nvplugin-gpu.sock"))
        finally:
            daemon.stop()
            assert await asyncio.wait_for(task, WAIT_S) == 0

    asyncio.run(asyncio.wait_for(body(), 2 * WAIT_S))
