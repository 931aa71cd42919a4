"""Signals from the first moment of ``nvplugin serve`` until its last.

The daemon's event loop handles SIGTERM, SIGINT and SIGHUP once it runs, but ``serve`` first
imports the daemon, reads its config and opens a loop: tenths of a second in which SIGHUP's
default action would kill the plugin (every GPU lost to the kubelet) and SIGTERM would end it
without removing its socket. :class:`PendingSignals` is installed first thing -- by the CLI
module's first lines when the command is ``serve``, else by ``serve`` -- and only records what
arrives; the daemon takes the record over when its handlers are in place
(SIGTERM/SIGINT: stop before serving, exit 0; SIGHUP: reload once serving), and puts the recorder
back when its loop ends, so that a signal during the last steps of the exit changes nothing.

The handler records and returns: no logging, no I/O. Python runs it between two bytecodes of the
main thread, possibly in the middle of a log write that holds the log's lock.
"""

from __future__ import annotations

import signal
from types import FrameType

HANDLED: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""The signals ``serve`` handles: SIGTERM and SIGINT stop it, SIGHUP reloads its config."""


class PendingSignals:
    """Records the :data:`HANDLED` signals while no event loop handles them."""

    def __init__(self) -> None:
        self._received: set[signal.Signals] = set()  # a set: a flood of signals stays 3 flags

    @classmethod
    def install(cls) -> PendingSignals:
        """A recorder, installed for every handled signal (main thread only)."""
        pending = cls()
        pending.hold()
        return pending

    @classmethod
    def current(cls) -> PendingSignals:
        """The recorder installed for every handled signal, or a new one installed now. (The
        signal table is where the process keeps it: no module state.)"""
        handlers = {signal.getsignal(sig) for sig in HANDLED}
        if len(handlers) == 1:
            (handler,) = handlers
            owner = getattr(handler, "__self__", None)
            if isinstance(owner, cls):
                return owner
        return cls.install()

    def hold(self) -> None:
        """(Re)install the recorder for every handled signal, replacing whatever handles them."""
        for sig in HANDLED:
            signal.signal(sig, self._record)

    def take(self) -> list[str]:
        """The names of the signals received since the last call (each once, in
        :data:`HANDLED` order), forgotten here."""
        taken, self._received = self._received, set()
        return [sig.name for sig in HANDLED if sig in taken]

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._received.add(signal.Signals(signum))
