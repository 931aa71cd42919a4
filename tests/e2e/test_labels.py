"""``nvplugin serve`` keeping the node's labels in NFD's feature file, as GPU Feature Discovery
does: a real plugin beside the fake kubelet, the file named by ``GFD_OUTPUT_FILE`` or
``--output-file``, its labels those ``nvplugin labels`` prints, changed by a reload that changes
what is served, moved and removed as the settings say, and removed at stop."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import time
from collections.abc import Callable
from pathlib import Path

from nvplugin.fakekubelet.kubelet import FakeKubelet
from tests.e2e.test_serve import run
from tests.support.labelcases import TIME_SLICED, read_fixture
from tests.support.serve import Serve, new_dir
from tests.support.waiting import WAIT_S

GPU = "nvidia.com/gpu"


def _read(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


async def _until(
    path: Path, serve: Serve, holds: Callable[[dict[str, str]], bool]
) -> dict[str, str]:
    """The file's labels once ``holds`` accepts them (the plugin writes it atomically, so a read
    sees the old labels or the new ones)."""
    deadline = time.monotonic() + WAIT_S
    labels: dict[str, str] = {}
    while time.monotonic() < deadline:
        if path.exists():
            labels = _read(path)
            if holds(labels):
                return labels
        assert serve.process.poll() is None, serve.text()
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never held what was expected: {labels}\n{serve.log_tail(20)}")


async def _until_labels(path: Path, want: dict[str, str], serve: Serve) -> dict[str, str]:
    """The file's labels once ``want`` is part of them."""
    return await _until(path, serve, lambda labels: want.items() <= labels.items())


def test_serve_writes_the_feature_file_and_a_reload_changes_it() -> None:
    async def body() -> None:
        directory = new_dir()
        features = Path(new_dir()) / "features.d"
        features.mkdir()
        output = features / "gfd"
        config = Path(new_dir()) / "config.yaml"
        config.write_text("version: v1\n")
        started = int(time.time())
        env = {"GFD_OUTPUT_FILE": str(output)}
        async with FakeKubelet(directory) as kubelet:
            serve = Serve(directory, "--simulate", "dgx-a100", "--config", str(config), env=env)
            try:
                await kubelet.wait_registered(GPU, WAIT_S)
                unshared = read_fixture("dgx-a100")
                labels = await _until_labels(output, unshared, serve)
                stamp = int(labels.pop("nvidia.com/gfd.timestamp"))
                assert labels == unshared and started <= stamp <= time.time()
                assert stat.S_IMODE(output.stat().st_mode) == 0o644
                assert os.listdir(features) == ["gfd"]  # no temporary file left

                config.write_text(TIME_SLICED)  # replicas 4: what is served changes
                serve.send(signal.SIGHUP)
                await kubelet.observer.wait_for(
                    lambda m: len(m.healthy_devices(GPU)) == 32, WAIT_S, "32 replicas"
                )
                shared = read_fixture("dgx-a100.time-sliced")
                labels = await _until_labels(output, shared, serve)
                assert int(labels.pop("nvidia.com/gfd.timestamp")) >= stamp
                assert labels == shared

                # Only the label settings change: applied in place. GFD_OUTPUT_FILE wins over
                # the file's outputFile, as every variable wins over the file.
                moved = features / "elsewhere"
                config.write_text(
                    TIME_SLICED
                    + f"flags:\n  gfd:\n    outputFile: {moved}\n    noTimestamp: true\n"
                )
                serve.send(signal.SIGHUP)
                await serve.wait_log("config applied in place; still registered")
                labels = await _until(
                    output, serve, lambda now: "nvidia.com/gfd.timestamp" not in now
                )
                assert labels == shared and not moved.exists()
            finally:
                assert serve.stop() == 0, serve.text()
            assert not output.exists()  # removed at stop: NFD drops the node's labels
            assert os.listdir(features) == []

    run(body)


def test_output_file_flag_moves_on_reload_and_a_bad_directory_does_not_stop_serving() -> None:
    async def body() -> None:
        directory = new_dir()
        features = Path(new_dir())
        first, second = features / "first", features / "second"
        config = Path(new_dir()) / "config.yaml"
        config.write_text(f"flags:\n  gfd:\n    outputFile: {first}\n")
        async with FakeKubelet(directory) as kubelet:
            serve = Serve(directory, "--simulate", "dgx-a100-mig", "--config", str(config))
            try:
                await kubelet.wait_registered(GPU, WAIT_S)
                await _until_labels(first, read_fixture("dgx-a100-mig.none"), serve)

                config.write_text(
                    f"flags:\n  migStrategy: mixed\n  gfd:\n    outputFile: {second}\n"
                )
                serve.send(signal.SIGHUP)
                await _until_labels(second, read_fixture("dgx-a100-mig.mixed"), serve)
                assert not first.exists()

                missing = features / "no-such-dir" / "gfd"
                config.write_text(f"flags:\n  gfd:\n    outputFile: {missing}\n")
                serve.send(signal.SIGHUP)
                line = await serve.wait_log("cannot write the node's labels")
                assert str(missing) in line["error"]
                assert not second.exists()
                await kubelet.wait_registered(GPU, WAIT_S)  # still serving

                second.write_text("stale=1\n")  # not the plugin's any more: left alone
                config.write_text(f"flags:\n  gfd:\n    outputFile: {first}\n")
                serve.send(signal.SIGHUP)
                await _until_labels(first, read_fixture("dgx-a100-mig.none"), serve)
            finally:
                assert serve.stop() == 0, serve.text()
            assert not first.exists() and second.read_text() == "stale=1\n"

    run(body)


def test_a_removed_file_comes_back_after_the_sleep_interval() -> None:
    async def body() -> None:
        directory = new_dir()
        output = Path(new_dir()) / "gfd"
        args = ("--simulate", "no-numa", "--output-file", str(output), "--sleep-interval", "1s")
        async with FakeKubelet(directory) as kubelet:
            serve = Serve(directory, *args)
            try:
                await kubelet.wait_registered(GPU, WAIT_S)
                labels = await _until_labels(output, read_fixture("no-numa"), serve)
                output.unlink()
                again = await _until_labels(output, read_fixture("no-numa"), serve)
                assert again == labels  # the same labels, the same timestamp
                await serve.wait_log("rewrote the node's labels")
            finally:
                assert serve.stop() == 0, serve.text()
            assert not output.exists()

    run(body)


def test_a_fifo_at_the_output_path_never_wedges_the_daemon() -> None:
    """An attack: ``GFD_OUTPUT_FILE`` a FIFO at start, and one
    swapped in later. Nothing ever writes to it, so a read of it would wait for ever; the daemon
    must still act on SIGHUP and stop on SIGTERM, and the FIFO is replaced by the labels."""

    async def body() -> None:
        directory = new_dir()
        output = Path(new_dir()) / "gfd"
        os.mkfifo(output)
        config = Path(new_dir()) / "config.yaml"
        config.write_text("version: v1\n")
        env = {"GFD_OUTPUT_FILE": str(output)}
        async with FakeKubelet(directory) as kubelet:
            serve = Serve(directory, "--simulate", "dgx-a100", "--config", str(config), env=env)
            try:
                await kubelet.wait_registered(GPU, WAIT_S)
                await _until_labels(output, read_fixture("dgx-a100"), serve)
                assert stat.S_ISREG(output.lstat().st_mode)

                output.unlink()
                os.mkfifo(output)  # swapped in while serving
                config.write_text(TIME_SLICED)
                serve.send(signal.SIGHUP)
                await kubelet.observer.wait_for(
                    lambda m: len(m.healthy_devices(GPU)) == 32, WAIT_S, "32 replicas"
                )
                await _until_labels(output, read_fixture("dgx-a100.time-sliced"), serve)

                output.unlink()
                os.mkfifo(output)
            finally:
                assert serve.stop() == 0, serve.text()

    run(body)
