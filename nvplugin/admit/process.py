"""``nvplugin serve`` as a child process on a device-plugin directory: start it, read its log,
stop or kill it, and say how it ended.

One helper for everything that runs the real plugin beside the fake kubelet: ``nvplugin admit``
and ``nvplugin demo`` (:mod:`nvplugin.admit.admission`), and the tests. The plugin runs as
``<this python> -m nvplugin serve --device-plugin-dir DIR --log-format json ARGS``, its stdout and
stderr (the JSON log, then an ``error:`` line if it fails) in one file. It gets this process's
environment without the ``NVPLUGIN_*`` settings -- a private plugin must not be redirected by
the caller's own (another directory, a metrics port in use) -- plus what the caller adds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

STOP_TIMEOUT_S = 30.0
"""How long :meth:`PluginProcess.stop` waits for an exit: far more than a plugin's stop takes
(its own shutdown is bounded), so that only a hung plugin is killed."""

ERROR_PREFIX = "error: "
"""How ``nvplugin`` commands print the error they exit with (the last line of the log)."""


def plugin_environment(
    add: Mapping[str, str] | None = None, drop: Collection[str] = ()
) -> dict[str, str]:
    """This process's environment without the ``NVPLUGIN_*`` settings and ``drop``, plus
    ``add``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_") and k not in drop}
    env.update(add or {})
    return env


class PluginProcess:
    """One ``nvplugin serve`` process serving ``directory`` (see module doc).

    ``log_path``: where its output goes (default: a new file in a new temporary directory, which
    outlives the process so that the log can be read after it ended). ``command``: the plugin's
    command line instead of ``nvplugin serve`` and the arguments above (a DaemonSet's command,
    say), to which ``args`` are added; it must serve ``directory`` itself.
    """

    def __init__(
        self,
        directory: str,
        *args: str,
        env: Mapping[str, str] | None = None,
        log_path: str | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self.directory = directory
        self.log_path = log_path or os.path.join(tempfile.mkdtemp(), "serve.log")
        if command is None:
            command = [sys.executable, "-m", "nvplugin", "serve", "--device-plugin-dir", directory]
            command += ["--log-format", "json"]
        command = [*command, *args]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else plugin_environment(),
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def text(self) -> str:
        """The log so far."""
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 5) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def error(self) -> str | None:
        """The error it exited with (its last line, ``error: ...``), if that is how it ended."""
        last = self.log_tail(1)
        if self.alive or not last.startswith(ERROR_PREFIX):
            return None
        return last.removeprefix(ERROR_PREFIX)

    def send(self, sig: int) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """Its exit code once it exited (raises :class:`subprocess.TimeoutExpired` if it does not
        within ``timeout``)."""
        return self.process.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Send ``sig`` (SIGTERM: the plugin removes its sockets and exits 0) if it still runs,
        and wait for the exit; its code. A plugin that does not exit in time is left running
        and :class:`subprocess.TimeoutExpired` raised: a test must see that."""
        if self.alive:
            self.send(sig)
        return self.wait(timeout)

    def terminate(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """:meth:`stop`, then SIGKILL if it did not exit in time: it is gone either way."""
        try:
            return self.stop(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.wait()

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
        self.process.wait()

    def describe_exit(self) -> str:
        code = self.process.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited {code}"
        return f"the device plugin (nvplugin serve, pid {self.pid}) {how}"
