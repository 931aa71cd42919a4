"""``nvplugin kubelet``: the fake kubelet for a ``nvplugin serve`` started by hand, both as real
processes on one directory, in either order, with the kubelet restarted in between."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

from tests.support.serve import Serve, new_dir, remove_dir
from tests.support.waiting import WAIT_S

DEVICES = "nvidia.com/gpu: 16 devices, 16 healthy (NUMA 0: 8, NUMA 1: 8)"


class Kubelet:
    """``nvplugin kubelet --device-plugin-dir DIR`` with its output lines in a queue."""

    def __init__(self, directory: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nvplugin", "kubelet", "--device-plugin-dir", directory],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, wanted: str, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while wanted not in self.seen:
            remaining = deadline - time.monotonic()
            try:
                self.seen.append(self.lines.get(timeout=max(remaining, 0.01)))
            except queue.Empty:
                raise AssertionError(
                    f"no line {wanted!r} within {timeout} s: {self.seen}"
                ) from None

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(WAIT_S)
        self.wait_line("fake kubelet stopped")
        return code


def test_kubelet_attaches_to_a_serve_started_by_hand() -> None:
    directory = new_dir()
    serve = Serve(directory, "--simulate", "dgx-2")
    kubelet = Kubelet(directory)
    try:
        kubelet.wait_line(DEVICES)
        assert "register nvidia.com/gpu from nvplugin-gpu.sock: accepted" in kubelet.seen
        # A second kubelet on the same directory would delete the first one's plugin sockets.
        second = Kubelet(directory)
        assert second.process.wait(30) == 1
        second.wait_line(
            f"error: a kubelet already serves {directory}/kubelet.sock; give "
            "nvplugin kubelet the --device-plugin-dir of your nvplugin serve instead "
            "(a second kubelet would delete its plugins' sockets)"
        )
        assert kubelet.stop() == 0
        # A kubelet started after the plugin deletes its socket; the plugin registers again.
        again = Kubelet(directory)
        again.wait_line(DEVICES)
        assert again.stop() == 0
        assert serve.stop() == 0
    finally:
        for process in (kubelet.process, serve.process):
            if process.poll() is None:
                process.kill()
                process.wait()
        remove_dir(directory)
