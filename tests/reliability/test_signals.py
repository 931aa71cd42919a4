"""Signals and faults that must never stop a running plugin: a SIGHUP whose config fails in any
way, signals in the first moments after start, and a log pipe that is gone.

Each runs a real ``nvplugin serve`` against the fake kubelet; nothing waits a fixed time: every
step waits for an event (a log line, the kubelet's view, an inotify event, the process's exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from asyncinotify import Inotify, Mask

from nvplugin import yamlinput
from nvplugin.admit.process import plugin_environment
from nvplugin.config import Config, load_config
from nvplugin.fakekubelet.devicemanager import DeviceManager
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.plugin import daemon as daemon_module
from nvplugin.plugin.daemon import Daemon
from tests.support.harness import GPU, SOCKET, caught_signals
from tests.support.hostile import ALIAS_BOMB
from tests.support.reliability.scenarios import uuids
from tests.support.serve import Serve, kubelet_with, new_dir, remove_dir
from tests.support.waiting import WAIT_S

NODE = "workstation-4gpu"


def _run(body: Callable[[], object], timeout: float = 90) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))  # type: ignore[arg-type]


# --- item 1: a reload that fails in any way keeps the running config ----------------------------


def _write(data: bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_bytes(data)

    return write


def _make_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _make_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    "huge-integer": (
        _write(b"version: v1\nnvplugin: {health: {enabled: " + b"1" * 5000 + b"}}"),
        "digits",
    ),
    "non-utf8": (_write(b"version: v1\nnvplugin: {log: {level: \xff}}\n"), "byte 0xff"),
    "deep-nesting": (_write(b"version: v1\nnvplugin: " + b"[" * 5000 + b"]" * 5000), "nested"),
    "alias-bomb": (_write(("version: v1\n" + ALIAS_BOMB).encode()), "aliases"),
    "too-big": (_write(b"version: v1\n#" + b"x" * yamlinput.MAX_BYTES), "larger than"),
    "unknown-key": (_write(b"version: v1\nresource_nam: x/y\n"), "unknown key"),
    "a-directory": (_make_dir, "is a directory"),
    "a-fifo": (_make_fifo, "not a regular file"),
    "deleted": (lambda path: path.unlink(), "config file"),
}


async def _wait_count(serve: Serve, event: str, count: int, timeout: float = 20) -> None:
    """Wait until the log has ``count`` lines ``event``."""
    async with asyncio.timeout(timeout):
        while len(serve.events(event)) < count:
            if serve.process.poll() is not None:
                raise AssertionError(f"serve exited {serve.process.returncode}:\n{serve.text()}")
            await asyncio.sleep(0.02)


def _still_serving(m: DeviceManager, every: frozenset[str]) -> bool:
    return m.is_registered(GPU) and m.healthy_devices(GPU) == every


def test_a_sighup_whose_config_fails_in_any_way_keeps_the_plugin_serving() -> None:
    async def body() -> None:
        directory, config_dir = new_dir(), new_dir()
        config = Path(config_dir) / "config.yaml"
        config.write_text("version: v1\n")
        every = frozenset(uuids(NODE))
        try:
            plugin_args = ("--simulate", NODE, "--config", str(config))
            async with kubelet_with(directory, *plugin_args) as (kubelet, serve):
                dm = kubelet.devices
                obs = kubelet.observer
                await kubelet.wait_registered(GPU, timeout=20)
                await obs.wait_for(lambda m: _still_serving(m, every), 10, "4 healthy GPUs")
                endpoint = dm.primary(GPU)
                failed = "config reload failed; keeping the running config"
                for number, (name, (breaks, fragment)) in enumerate(BROKEN.items()):
                    if config.is_dir():
                        config.rmdir()
                    elif config.exists() or config.is_fifo():
                        config.unlink()
                    config.write_text("version: v1\n")
                    breaks(config)
                    serve.send(signal.SIGHUP)
                    await _wait_count(serve, failed, number + 1)
                    error = serve.events(failed)[number]["error"]
                    assert str(config) in error and fragment in error, (name, error)
                    assert len(error) < 1000, (name, "an error must not render the input")
                    assert serve.process.poll() is None, name
                    assert _still_serving(dm, every), name
                    assert dm.primary(GPU) is endpoint, (name, "the stream ended")
                # Still able to reload: a good config is applied (in place, still registered).
                if config.is_dir():
                    config.rmdir()
                elif config.exists() or config.is_fifo():
                    config.unlink()
                config.write_text("version: v1\nnvplugin: {log: {level: debug}}\n")
                serve.send(signal.SIGHUP)
                await serve.wait_log("config applied in place; still registered", 20)
                assert len(obs.registrations) == 1 and dm.primary(GPU) is endpoint
                assert "Traceback" not in serve.text()
        finally:
            remove_dir(directory)
            remove_dir(config_dir)

    _run(body)


class _Reloads:
    """The daemon's ``reload``: raises each of ``failures`` in turn, then returns ``good``."""

    def __init__(self, failures: list[BaseException], good: Config) -> None:
        self.failures = list(failures)
        self.good = good
        self.calls = 0

    def __call__(self) -> Config:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.good


def test_a_reload_raising_what_nobody_expected_keeps_the_plugin_serving() -> None:
    """The config reader's own bugs are failures too: whatever it raises, the plugin stays."""

    async def body() -> None:
        directory = new_dir()
        try:
            config = load_config(None, flags={"nvplugin.devicePluginDir": directory})
            good = load_config(
                None,
                flags={"nvplugin.devicePluginDir": directory, "nvplugin.log.level": "warning"},
            )
            failures: list[BaseException] = [
                RuntimeError("a bug"),
                RecursionError("maximum recursion depth exceeded"),
                MemoryError(),
                ValueError("x" * 100_000),
                UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
            ]
            reloads = _Reloads(failures, good)
            daemon = Daemon(config, simulate=NODE, reload=reloads)
            every = frozenset(uuids(NODE))
            async with FakeKubelet(directory) as kubelet:
                dm = kubelet.devices
                obs = kubelet.observer
                task = asyncio.create_task(daemon.run(handle_signals=False))
                await kubelet.wait_registered(GPU, timeout=20)
                await obs.wait_for(lambda m: _still_serving(m, every), 10, "4 healthy GPUs")
                endpoint = dm.primary(GPU)
                for _ in range(len(failures) + 1):
                    calls = reloads.calls
                    daemon.reload()
                    while reloads.calls == calls:
                        assert not task.done(), task
                        await asyncio.sleep(0.01)
                # Reloads run in order: once the good one is applied, every failure was handled.
                while daemon.config is not good:
                    assert not task.done(), task
                    await asyncio.sleep(0.01)
                assert _still_serving(dm, every)
                assert dm.primary(GPU) is endpoint and len(obs.registrations) == 1
                daemon.stop()
                assert await task == 0
        finally:
            remove_dir(directory)

    _run(body)


# --- item 2: signals in the first moments after start -------------------------------------------


@contextlib.asynccontextmanager
async def _at_daemon_import(directory: str, *args: str) -> AsyncIterator[Serve]:
    """``nvplugin serve ARGS``, given when it opens the daemon's module to import it: the start
    of the heavy part of its start-up (gRPC, the node), long before its event loop.

    It runs a private copy of the package (PYTHONPATH, and PYTHONSAFEPATH so that the working
    directory's copy does not come first), so that the inotify event is this process's and not
    another's importing the same tree.
    """
    copy = new_dir()
    try:
        package = Path(daemon_module.__file__).parents[1]
        shutil.copytree(
            package, Path(copy) / "nvplugin", ignore=shutil.ignore_patterns("__pycache__")
        )
        with Inotify() as inotify:
            inotify.add_watch(Path(copy) / "nvplugin" / "plugin", Mask.OPEN)
            serve = Serve(directory, *args, env={"PYTHONSAFEPATH": "1", "PYTHONPATH": copy})
            async with asyncio.timeout(60):
                async for event in inotify:
                    if event.name is not None and event.name.name.startswith("daemon."):
                        break
        yield serve
    finally:
        remove_dir(copy)


def test_signals_are_handled_before_the_daemon_is_imported() -> None:
    """Handled once the daemon's import starts. A handler in place then is still in place when
    the test looks, however late; a handler installed only later (by the event loop, a few
    hundred milliseconds of imports on) is not yet there when the test looks promptly."""

    async def body() -> None:
        directory, config_dir = new_dir(), new_dir()
        config = Path(config_dir) / "config.yaml"
        config.write_text("version: v1\n")
        try:
            async with _at_daemon_import(
                directory, "--simulate", NODE, "--config", str(config)
            ) as serve:
                try:
                    caught = caught_signals(serve.pid)
                    assert {signal.SIGHUP, signal.SIGTERM, signal.SIGINT} <= caught, caught
                finally:
                    serve.kill()
        finally:
            remove_dir(directory)
            remove_dir(config_dir)

    _run(body)


@contextlib.asynccontextmanager
async def _kubelet_and_early_plugin() -> AsyncIterator[tuple[FakeKubelet, Serve, str]]:
    """A fake kubelet, and a plugin given at its daemon's import (with a config file); its
    directory. Both removed after."""
    directory, config_dir = new_dir(), new_dir()
    config = Path(config_dir) / "config.yaml"
    config.write_text("version: v1\n")
    try:
        async with (
            FakeKubelet(directory) as kubelet,
            _at_daemon_import(directory, "--simulate", NODE, "--config", str(config)) as serve,
        ):
            yield kubelet, serve, directory
    finally:
        remove_dir(directory)
        remove_dir(config_dir)


def test_sighup_right_after_start_is_remembered_and_reloads_once_serving() -> None:
    async def body() -> None:
        async with _kubelet_and_early_plugin() as (kubelet, serve, _):
            try:
                serve.send(signal.SIGHUP)
                await kubelet.wait_registered(GPU, timeout=20)
                await serve.wait_log("signal", 20, lambda e: e["signal"] == "SIGHUP")
                await serve.wait_log("config reloaded", 20)
                assert serve.process.poll() is None
            finally:
                assert serve.stop() == 0
            assert "Traceback" not in serve.text()

    _run(body)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_right_after_start_exits_0_and_leaves_no_socket(sig: int) -> None:
    async def body() -> None:
        async with _kubelet_and_early_plugin() as (_, serve, directory):
            serve.send(sig)
            assert await asyncio.to_thread(serve.wait, 20) == 0, serve.text()[-2000:]
            assert not os.path.exists(os.path.join(directory, SOCKET))
            assert "Traceback" not in serve.text()

    _run(body)


# --- item 3: a broken log pipe ------------------------------------------------------------------


def test_with_its_log_pipe_broken_the_plugin_serves_reloads_and_stops_on_sigterm() -> None:
    """The log's reader is gone (EPIPE on every line): the plugin still re-registers after a
    kubelet restart, still reloads on SIGHUP, still answers, and SIGTERM still ends it (exit
    0, socket removed)."""

    async def body() -> None:
        directory, config_dir = new_dir(), new_dir()
        config = Path(config_dir) / "config.yaml"
        config.write_text("version: v1\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
        command = [sys.executable, "-m", "nvplugin", "serve", "--device-plugin-dir", directory]
        command += ["--simulate", NODE, "--config", str(config), "--log-level", "debug"]
        try:
            async with FakeKubelet(directory) as kubelet:
                dm = kubelet.devices
                obs = kubelet.observer
                process = subprocess.Popen(
                    command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
                )
                try:
                    await kubelet.wait_registered(GPU, timeout=20)
                    assert process.stdout is not None and process.stderr is not None
                    process.stdout.close()
                    process.stderr.close()  # no reader left: every log write fails with EPIPE
                    await kubelet.restart()
                    await obs.wait_for(lambda _: len(obs.registrations) == 2, 20, "re-registered")
                    chosen = await dm.get_preferred_allocation(GPU, sorted(uuids(NODE)), [], 2)
                    assert chosen is not None and len(chosen) == 2
                    config.write_text("version: v1\nnvplugin: {resourceName: example.com/gpu}\n")
                    process.send_signal(signal.SIGHUP)
                    await kubelet.wait_registered("example.com/gpu", timeout=20)
                    process.send_signal(signal.SIGTERM)
                    assert await asyncio.to_thread(process.wait, 20) == 0
                    assert os.listdir(directory) == ["kubelet.sock"] or not any(
                        name.startswith("nvplugin-") for name in os.listdir(directory)
                    )
                finally:
                    if process.poll() is None:
                        process.kill()
                        process.wait()
        finally:
            remove_dir(directory)
            remove_dir(config_dir)

    _run(body)


def test_the_log_sink_drops_lines_it_cannot_write() -> None:
    import io

    from nvplugin.log import LineSink

    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as broken:
        sink = LineSink(broken)
        for _ in range(3):
            sink.write("a line nobody reads")
        assert sink.dropped == 3
    closed = io.StringIO()
    closed.close()
    sink = LineSink(closed)
    sink.write("x")
    assert sink.dropped == 1


# --- item 3: SIGHUP from the very first moment -------------------------------------------------


def _image_entrypoint() -> list[str]:
    """The Dockerfile's ENTRYPOINT and CMD."""
    text = (Path(__file__).parents[2] / "Dockerfile").read_text().splitlines()
    (entrypoint,) = [json.loads(ln.split(None, 1)[1]) for ln in text if ln.startswith("ENTRYPOINT")]
    (cmd,) = [json.loads(ln.split(None, 1)[1]) for ln in text if ln.startswith("CMD ")]
    return [*entrypoint, *cmd]


def _exe(pid: int) -> str | None:
    """The program process ``pid`` runs now (None once it has exited)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


@pytest.mark.parametrize("how", ["nvidia-device-plugin", "the image's entrypoint"])
def test_sighup_from_the_first_moment_never_kills_a_starting_plugin(how: str) -> None:
    """SIGHUP again and again from the moment ``env`` has ignored it and run the next program --
    the interpreter's own start-up included, before any of nvplugin's code runs -- until the
    plugin has registered: it starts with SIGHUP ignored (inherited across exec), then handles
    it, and lives. (What no program can close: the instant between the exec of ``env`` itself
    and its call that ignores SIGHUP, a millisecond of a C program's start, not the interpreter's
    tenth of a second.)"""
    bin_dir = Path(sys.executable).parent
    command = [str(bin_dir / "nvidia-device-plugin")] if how.startswith("nvidia") else []
    command = command or _image_entrypoint()

    async def body() -> None:
        directory, logs = new_dir(), new_dir()
        log_path = Path(logs) / "serve.log"
        # nvplugin's own settings through its variables: NVIDIA's command has NVIDIA's flags only
        env = plugin_environment(
            {
                "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "NVPLUGIN_DEVICE_PLUGIN_DIR": directory,
                "NVPLUGIN_LOG_FORMAT": "json",
            }
        )
        args = ["--simulate", NODE]
        try:
            async with FakeKubelet(directory) as kubelet:
                with open(log_path, "wb") as log:
                    process = subprocess.Popen(
                        [*command, *args], stdout=log, stderr=subprocess.STDOUT, env=env
                    )
                try:
                    sent = 0
                    env_program = os.path.realpath("/usr/bin/env")
                    async with asyncio.timeout(WAIT_S):
                        while _exe(process.pid) == env_program:
                            await asyncio.sleep(0)  # env has not run the next program yet
                        while not kubelet.devices.is_registered(GPU):
                            if process.poll() is not None:
                                break
                            process.send_signal(signal.SIGHUP)
                            sent += 1
                            await asyncio.sleep(0.005)
                    text = log_path.read_text()
                    assert process.poll() is None, f"died after {sent} SIGHUPs:\n{text[-2000:]}"
                    process.terminate()
                    assert await asyncio.to_thread(process.wait, WAIT_S) == 0, text[-2000:]
                    assert "Traceback" not in log_path.read_text()
                finally:
                    if process.poll() is None:
                        process.kill()
                        process.wait()
        finally:
            remove_dir(directory)
            remove_dir(logs)

    _run(body)
