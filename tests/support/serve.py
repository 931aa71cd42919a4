"""Run ``nvplugin serve`` as a real subprocess (:mod:`nvplugin.admit.process`, the helper
``nvplugin admit`` uses too) and read its JSON log lines; run other ``nvplugin`` commands."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import yaml

from nvplugin.admit.process import PluginProcess, plugin_environment
from nvplugin.fakekubelet.kubelet import FakeKubelet
from tests.support.waiting import WAIT_S

NODES_DIR = Path(__file__).resolve().parents[2] / "nvplugin" / "nodefile" / "nodes"


def node_file(directory: str, base: str, events: list[dict[str, Any]]) -> str:
    """A copy of built-in node ``base`` with scripted health ``events``; returns its path."""
    text = (NODES_DIR / f"{base}.yaml").read_text()
    text = text.replace("\nevents: []\n", "\n")
    assert "\nevents:" not in text
    scripted = yaml.safe_dump({"events": events}, default_flow_style=None, sort_keys=False)
    path = os.path.join(directory, f"{base}-events.yaml")
    Path(path).write_text(text.rstrip("\n") + "\n" + scripted)
    return path


class Serve(PluginProcess):
    """One ``nvplugin serve`` process with its stderr (the log) in a file, and its JSON log
    lines. ``env`` adds to (or overrides) the environment it inherits without ``NVPLUGIN_*``."""

    def __init__(
        self,
        directory: str,
        *args: str,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> None:
        super().__init__(directory, *args, env=plugin_environment(env), command=command)

    def lines(self) -> list[dict[str, Any]]:
        """The JSON log lines so far (other lines, e.g. an ``error:`` line, are skipped)."""
        out = []
        for line in self.text().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):  # a line being written
                    out.append(json.loads(line))
        return out

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("event") == name]

    async def wait_log(
        self, name: str, timeout: float = WAIT_S, where: Callable[[dict[str, Any]], bool] = bool
    ) -> dict[str, Any]:
        """The first log line ``name`` that ``where`` accepts, once the plugin has written it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.events(name):
                if where(line):
                    return line
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited {self.process.returncode}:\n{self.text()}")
            await asyncio.sleep(0.02)
        raise AssertionError(f"no log line {name!r} within {timeout} s:\n{self.text()}")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    async def settled_fds(self, samples: int = 5, interval: float = 0.02) -> int:
        """The fewest open fds over a few samples: connections mid-handshake come and go, a
        leaked fd stays."""
        counts = []
        for _ in range(samples):
            counts.append(self.fds())
            await asyncio.sleep(interval)
        return min(counts)

    def wait(self, timeout: float = WAIT_S) -> int:
        return super().wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = WAIT_S) -> int:
        return super().stop(sig, timeout)


@contextlib.asynccontextmanager
async def kubelet_with(
    directory: str,
    *args: str,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
) -> AsyncIterator[tuple[FakeKubelet, Serve]]:
    """The fake kubelet on ``directory`` and ``nvplugin serve ARGS`` (or ``command ARGS``)
    beside it. On the way out the plugin is stopped with SIGTERM and must exit 0 (its log is in
    the message if not); the log stays readable after the block (it lives in the run's scratch
    directory)."""
    async with FakeKubelet(directory) as kubelet:
        serve = Serve(directory, *args, env=env, command=command)
        try:
            yield kubelet, serve
        finally:
            code = serve.stop()
            assert code == 0, f"serve exited {code}:\n{serve.text()}"


async def scrape(serve: Serve) -> str:
    """The plugin's metrics page (``NVPLUGIN_METRICS_ADDRESS`` set; its port from the log)."""
    port = int((await serve.wait_log("serving metrics"))["port"])

    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as r:
            return str(r.read().decode())

    return await asyncio.to_thread(get)


def run_nvplugin(command: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``nvplugin COMMAND ARGS`` to completion, without the caller's NVPLUGIN_* settings."""
    return subprocess.run(
        [sys.executable, "-m", "nvplugin", command, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=plugin_environment(),
    )


def run_serve(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``nvplugin serve ARGS`` to completion (for the start-up failures)."""
    return run_nvplugin("serve", *args, timeout=timeout)


def admit(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``nvplugin admit ARGS`` to completion."""
    return run_nvplugin("admit", *args, timeout=timeout)


def admit_json(*args: str) -> list[dict[str, Any]]:
    """``nvplugin admit --output json ARGS``: must succeed; its parsed results."""
    done = admit("--output", "json", *args)
    assert done.returncode == 0, done.stderr
    result: list[dict[str, Any]] = json.loads(done.stdout)
    return result


def pods_file(text: str) -> str:
    """Write a pod manifest to a temporary file; its path."""
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def new_dir() -> str:
    return tempfile.mkdtemp()


def remove_dir(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)
