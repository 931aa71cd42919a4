"""``nvplugin serve`` as PID 1 of its container (as the chart runs it): an init above the server.

PID 1 inherits every orphan of its PID namespace and must reap it: the MPS control daemon, for
one, daemonizes -- its server is re-parented to PID 1 -- and each one that ends would stay a
zombie under a server that only waits for the children it started. So when ``serve`` finds it is
PID 1 it forks first thing: the child serves, and the parent stays behind as a minimal init that
does nothing else -- it forwards the signals a container gets (the kubelet's SIGTERM, a config
manager's SIGHUP) to the child, reaps every process that ends under it, and when the child ends
exits with the child's status, which ends the container as the server's own exit would have.

The server, a child of its container's init now, stops its MPS daemons at SIGTERM rather than
leave them to be killed with the namespace (:func:`nvplugin.plugin.mps.daemons_outlive_us`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from types import FrameType
from typing import NoReturn

FORWARDED: tuple[signal.Signals, ...] = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
"""What the init passes on to the server: every signal a container's main process is sent."""


def serve_below_init(pid: int | None = None) -> None:
    """As PID 1 (``pid``: this process's, unless given), fork: return in the child, which goes
    on to serve; the parent never returns (see the module docstring). Elsewhere, return at
    once."""
    if (os.getpid() if pid is None else pid) != 1:
        return
    # Blocked across the fork: a signal arriving meanwhile waits in the parent for its
    # forwarding handler, instead of meeting the recorder the child inherits.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return
    _init(child, previous)


def _init(child: int, mask: set[int | signal.Signals]) -> NoReturn:
    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    while True:
        try:
            pid, status = os.wait()  # any child, the server or an orphan: reaped
        except ChildProcessError:  # none left (cannot happen before the server ends)
            os._exit(1)
        if pid == child:
            os._exit(exit_status(status))


def exit_status(status: int) -> int:
    """A shell's exit status for a child's wait status: its exit code, or 128 + the signal
    that ended it."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code
