"""The simulated ``nvidia-cuda-mps-control``: the MPS control daemon's stand-in on simulated nodes.

The simulated NVML (:mod:`nvplugin.sim.fakenvml`) writes this module, as a script named
``nvidia-cuda-mps-control`` run by the same interpreter, into the simulated driver root
(``usr/bin``), so a plugin serving a simulated node finds and runs it exactly as it runs the real
one. It behaves
like the real program as far as nvplugin uses it (NVIDIA's MPS documentation, "Tools and Interface
Reference"):

- ``nvidia-cuda-mps-control -d`` starts the control daemon in the background and returns; the
  daemon listens on ``control`` in ``CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``),
  writes ``nvidia-cuda-mps-control.pid`` there and its log, ``control.log``, in
  ``CUDA_MPS_LOG_DIRECTORY`` (default ``/var/log/nvidia-mps``). A second daemon on a pipe
  directory whose daemon answers is refused (exit 1). ``-f`` runs it in the foreground.
- ``nvidia-cuda-mps-control`` with no argument is the client: each line on its standard input is
  a command for the daemon, each answer is printed; it exits 1 when no daemon answers.
- The commands nvplugin sends: ``get_server_list`` (no server runs on a simulated node: nothing is
  printed), ``set_default_active_thread_percentage <pct>``,
  ``get_default_active_thread_percentage``, ``set_default_device_pinned_mem_limit <dev> <value>``
  (``<dev>`` an ordinal among the daemon's ``CUDA_VISIBLE_DEVICES``, ``<value>`` such as
  ``40960M``), ``get_default_device_pinned_mem_limit <dev>``, and ``quit``, after which the
  daemon removes its socket and pid file and exits (its clients lose their server at once; the
  real one waits for them unless told ``quit -t``). Each command is logged as the real daemon
  logs it (``[<time> Control <pid>] Cmd:<command>``).
- Clients: a CUDA program reaches MPS through the pipe directory; here
  ``nvidia-cuda-mps-control --simulated-client`` stands in for one (beyond the real program): it
  connects, is served, prints ``served by <server>`` and keeps its connection until the daemon
  ends it (it then prints ``server lost`` and exits 1) or it gets SIGTERM (exit 0). The
  simulated MPS server runs in the daemon's own process: with a client connected,
  ``get_server_list`` prints the daemon's pid, and ``get_client_list <pid>`` its clients' pids.

Its process runs this interpreter on the script, so its command line names
``nvidia-cuda-mps-control``, and its environment holds ``CUDA_MPS_PIPE_DIRECTORY``, as the real
daemon's would: tests find it in ``/proc`` the way an operator would with ``ps``. Beyond the real
one, it exits when its pipe directory disappears, so a simulation whose tree was removed cannot
leave a daemon behind.

Standard library only, and small: it starts as a new Python process for every command.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import sys
import time
from typing import NoReturn, TextIO

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
PROGRAM = "usr/bin/nvidia-cuda-mps-control"
"""Where a simulated driver root holds this program (:func:`write_program`)."""
CONTROL = "control"
PID_FILE = "nvidia-cuda-mps-control.pid"
LOG_FILE = "control.log"
SIMULATED_CLIENT = "--simulated-client"
"""The argument that makes this program an MPS client (a CUDA program's stand-in)."""
HELLO = "\0client"
"""How a simulated client opens its connection (no control command starts with a NUL)."""

MAX_COMMAND = 4096
CONNECTION_TIMEOUT_S = 2.0
"""How long the daemon waits for one client's command (a stuck client cannot hold it)."""
CLIENT_TIMEOUT_S = 10.0
WATCH_S = 1.0
"""How often the idle daemon checks that its pipe directory still exists."""

_MEMORY = re.compile(r"[0-9]+(\.[0-9]+)?[KMGT]?B?", re.IGNORECASE)


def write_program(driver_root: str) -> str:
    """Write this module as ``usr/bin/nvidia-cuda-mps-control`` under ``driver_root``; its path.
    Run by this interpreter in isolated mode without site packages: it needs only the standard
    library, and starts in a quarter of the time (one process per MPS command)."""
    path = os.path.join(driver_root, PROGRAM)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(__file__) as source, open(path, "w") as program:
        program.write(f"#!{sys.executable} -IS\n" + source.read())
    os.chmod(path, 0o755)
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pipe_dir = os.environ.get(PIPE_ENV) or DEFAULT_PIPE_DIR
    log_dir = os.environ.get(LOG_ENV) or DEFAULT_LOG_DIR
    if args in (["-d"], ["-f"]):
        return _start(pipe_dir, log_dir, background=args == ["-d"])
    if not args:
        return _client(pipe_dir, sys.stdin, sys.stdout)
    if args == [SIMULATED_CLIENT]:
        return _cuda_client(pipe_dir, sys.stdout)
    print("usage: nvidia-cuda-mps-control [-d | -f]", file=sys.stderr)
    return 1


# --- the client ----------------------------------------------------------------------------------


def _client(pipe_dir: str, commands: TextIO, out: TextIO) -> int:
    for line in commands:
        command = line.strip()
        if not command:
            continue
        try:
            answer = _ask(os.path.join(pipe_dir, CONTROL), command)
        except OSError:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        if answer:
            out.write(answer if answer.endswith("\n") else answer + "\n")
            out.flush()
    return 0


def _ask(path: str, command: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(CLIENT_TIMEOUT_S)
        conn.connect(path)
        conn.sendall(command.encode()[:MAX_COMMAND] + b"\n")
        conn.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")


def _cuda_client(pipe_dir: str, out: TextIO) -> int:
    """A CUDA program's stand-in: served by the daemon until it ends the connection."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CLIENT_TIMEOUT_S)
        conn.connect(os.path.join(pipe_dir, CONTROL))
        conn.sendall(f"{HELLO} {os.getpid()}\n".encode())
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = conn.recv(256)
            if not chunk:
                break
            answer += chunk
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    if not answer.startswith(b"server "):
        print(f"not served: {answer.decode(errors='replace').strip()}", file=sys.stderr)
        return 1
    out.write(f"served by {answer.decode().split()[1]}\n")
    out.flush()
    conn.settimeout(None)
    with contextlib.suppress(OSError):
        while conn.recv(256):
            pass
    out.write("server lost\n")
    out.flush()
    return 1


# --- the daemon ----------------------------------------------------------------------------------


def _start(pipe_dir: str, log_dir: str, *, background: bool) -> int:
    path = os.path.join(pipe_dir, CONTROL)
    try:
        os.makedirs(pipe_dir, exist_ok=True)
        os.makedirs(log_dir, exist_ok=True)
    except OSError as exc:
        print(f"cannot create the MPS directories: {exc}", file=sys.stderr)
        return 1
    with contextlib.suppress(OSError):
        _ask(path, "get_server_list")
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # stale: nobody answers on it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # before forking: the socket answers as soon as -d returns
    listener.listen(16)
    if background:
        if os.fork() > 0:
            return 0
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        _detach()
    _Daemon(listener, pipe_dir, log_dir).run()


def _detach() -> None:
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


class _Daemon:
    def __init__(self, listener: socket.socket, pipe_dir: str, log_dir: str) -> None:
        self.listener = listener
        self.pipe_dir = pipe_dir
        self.path = os.path.join(pipe_dir, CONTROL)
        self.log_path = os.path.join(log_dir, LOG_FILE)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.devices = None if visible is None else len([d for d in visible.split(",") if d])
        self.thread_percentage = 100.0
        self.memory_limits: dict[int, str] = {}
        self.clients: dict[socket.socket, int] = {}  # connection -> the client's pid

    def run(self) -> NoReturn:
        signal.signal(signal.SIGTERM, lambda *_: self.exit())
        signal.signal(signal.SIGINT, lambda *_: self.exit())
        # Written aside and renamed into place: whoever reads the pid file (a test waiting for
        # the daemon, say) finds it whole or not at all, never created but still empty.
        path = os.path.join(self.pipe_dir, PID_FILE)
        partial = f"{path}.{os.getpid()}"
        with open(partial, "w") as pid:
            pid.write(f"{os.getpid()}\n")
        os.replace(partial, path)
        self.log(f"Starting control daemon using socket {self.path}")
        self.log(f"To connect CUDA applications to this daemon, set env {PIPE_ENV}={self.pipe_dir}")
        while True:
            ready, _, _ = select.select([self.listener, *self.clients], [], [], WATCH_S)
            if not ready:
                if not os.path.isdir(self.pipe_dir):
                    self.exit()
                continue
            for ready_one in ready:
                if ready_one is self.listener:
                    self.accept()
                else:
                    self.client_spoke(ready_one)

    def accept(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.listener.accept()
            kept = False
            try:
                kept = self.serve(conn)
            finally:
                if not kept:
                    conn.close()

    def serve(self, conn: socket.socket) -> bool:
        """Answer one connection; True when it is a client's, kept open."""
        conn.settimeout(CONNECTION_TIMEOUT_S)
        self.log("Accepting connection...")
        data = b""
        while b"\n" not in data and len(data) < MAX_COMMAND:
            chunk = conn.recv(MAX_COMMAND)
            if not chunk:
                break
            data += chunk
        command = data.split(b"\n", 1)[0].decode(errors="replace").strip()
        if command.startswith(HELLO):
            return self.serve_client(conn, command[len(HELLO) :].strip())
        self.log("NEW UI")
        self.log(f"Cmd:{command}")
        answer, done = self.answer(command.split())
        if answer:
            self.log(answer)
        conn.sendall(answer.encode() + (b"\n" if answer else b""))
        self.log("UI closed")
        if done:
            conn.close()
            self.exit()
        return False

    def serve_client(self, conn: socket.socket, pid: str) -> bool:
        if not pid.isdigit():
            return False
        self.log(f"NEW CLIENT {pid} from user {os.getuid()}: Server {os.getpid()}")
        conn.sendall(f"server {os.getpid()}\n".encode())
        conn.settimeout(None)
        self.clients[conn] = int(pid)
        return True

    def client_spoke(self, conn: socket.socket) -> None:
        """A client's connection is readable: it went (a client says nothing once served)."""
        with contextlib.suppress(OSError):
            if conn.recv(256):
                return
        pid = self.clients.pop(conn)
        conn.close()
        self.log(f"Client {pid} disconnected")

    def answer(self, words: list[str]) -> tuple[str, bool]:
        """The reply to a command, and whether the daemon quits."""
        name, args = (words[0], words[1:]) if words else ("", [])
        if name == "quit" and (not args or _timeout(args)):
            return "", True
        if name == "get_server_list" and not args:
            return (str(os.getpid()) if self.clients else ""), False  # the server: ours
        if name == "get_client_list" and len(args) == 1:
            if args[0] != str(os.getpid()) or not self.clients:
                return f"Server {args[0]} not found", False
            return "\n".join(str(pid) for pid in sorted(self.clients.values())), False
        if name == "get_default_active_thread_percentage" and not args:
            return f"{self.thread_percentage:.1f}", False
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            value = _number(args[0])
            if value is None or not 0 < value <= 100:
                return f"Invalid active thread percentage {args[0]}", False
            self.thread_percentage = value
            return f"{value:.1f}", False
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            device = self.device(args[0])
            if device is None:
                return f"Invalid device {args[0]}", False
            if not _MEMORY.fullmatch(args[1]):
                return f"Invalid memory limit {args[1]}", False
            self.memory_limits[device] = args[1]
            return "", False
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            device = self.device(args[0])
            if device is None:
                return f"Invalid device {args[0]}", False
            return self.memory_limits.get(device, "0"), False
        return f"Unrecognized command {' '.join(words)}", False

    def device(self, text: str) -> int | None:
        if not text.isdigit():
            return None
        ordinal = int(text)
        return None if self.devices is not None and ordinal >= self.devices else ordinal

    def log(self, message: str) -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        with contextlib.suppress(OSError), open(self.log_path, "a") as log:
            log.write(f"[{stamp}.{int(now * 1000) % 1000:03d} Control {os.getpid()}] {message}\n")

    def exit(self) -> NoReturn:
        for conn in self.clients:  # they lose their server
            with contextlib.suppress(OSError):
                conn.close()
        self.log("Exit")
        for name in (CONTROL, PID_FILE):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.pipe_dir, name))
        os._exit(0)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _timeout(args: list[str]) -> bool:
    """``quit -t <seconds>``."""
    return len(args) == 2 and args[0] == "-t" and _number(args[1]) is not None


if __name__ == "__main__":
    sys.exit(main())
