"""Logging set-up (structlog): JSON lines for machines, a console rendering for people.

The daemon runs in a pod whose logs are collected line by line, so the default is one JSON
object per line on stderr. On a terminal, or with ``--log-format console``, lines are rendered
for reading. Exceptions are rendered as plain tracebacks without local variables: locals can hold
device IDs, config values or request contents, and a log line is no place for them.

``configure`` can be called again (SIGHUP reloads the level and format): loggers are not cached
on first use, so every logger picks the new set-up up.

Logging never fails the caller: a line that cannot be written (the log collector's pipe is gone:
EPIPE; a closed stream) is dropped. Every part of the daemon logs -- RPC handlers, the signal
handler, the health thread, the registrar -- and an exception from a log call would stop exactly
the work it describes.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import structlog

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def resolve_format(log_format: str | None, stream: TextIO) -> str:
    """``json`` or ``console``: the configured one, else console on a TTY and JSON otherwise."""
    if log_format is not None:
        return log_format
    isatty = getattr(stream, "isatty", None)
    return "console" if isatty is not None and isatty() else "json"


def _name_logger(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """``_logger`` (set by :func:`get_logger`) -> ``logger``."""
    if "_logger" in event:
        event["logger"] = event.pop("_logger")
    return event


def _event_first(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Put ``timestamp``, ``level``, ``event`` and ``logger`` first: lines read left to right."""
    head = {k: event[k] for k in ("timestamp", "level", "event", "logger") if k in event}
    return {**head, **{k: v for k, v in event.items() if k not in head}}


class LineSink:
    """Where rendered lines go: one write per line, and a line that cannot be written is dropped
    (counted in ``dropped``), never raised to the code that logged it.

    A stream with a file descriptor (stderr in a pod) is written with ``os.write``, unbuffered:
    nothing is left in a buffer that a later flush would fail on (at exit, Python turns a failed
    flush of stderr into exit status 120), and one failed line costs one failed system call.
    Other streams (tests' StringIO) get ``write`` and ``flush``.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.dropped = 0
        self._lock = threading.Lock()
        try:
            self._fd: int | None = stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
            self._fd = None

    def write(self, line: str) -> None:
        with self._lock:
            try:
                if self._fd is None:
                    self.stream.write(line + "\n")
                    self.stream.flush()
                    return
                data = (line + "\n").encode("utf-8", "backslashreplace")
                while data:
                    data = data[os.write(self._fd, data) :]
            except (OSError, ValueError):  # EPIPE, EAGAIN, EBADF; ValueError: stream closed
                self.dropped += 1


class _SinkLogger:
    """structlog's wrapped logger: every level goes to the sink as one line."""

    def __init__(self, sink: LineSink) -> None:
        self._sink = sink

    def msg(self, message: str) -> None:
        self._sink.write(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def configure(log_format: str | None, level: str, stream: TextIO | None = None) -> str:
    """Set structlog up for the whole process; returns the format chosen (``json``/``console``)."""
    out = stream if stream is not None else sys.stderr
    chosen = resolve_format(log_format, out)
    renderer: structlog.typing.Processor
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _name_logger,
    ]
    if chosen == "console":
        renderer = structlog.dev.ConsoleRenderer(
            colors=bool(getattr(out, "isatty", lambda: False)()),
            exception_formatter=structlog.dev.plain_traceback,
        )
    else:
        processors.append(structlog.processors.format_exc_info)
        processors.append(_event_first)
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
    processors.append(renderer)
    sink = LineSink(out)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=lambda *args: _SinkLogger(sink),
        cache_logger_on_first_use=False,
    )
    return chosen


def get_logger(name: str, **context: object) -> structlog.typing.FilteringBoundLogger:
    """A logger whose lines carry ``logger=<name>`` and ``context``.

    It stays lazy (resolved on each call), so it follows a later :func:`configure`; do not
    ``bind`` it for long-lived use, pass the context here instead.
    """
    # structlog.get_logger(logger=...) clashes with wrap_logger's own parameter: carry the name
    # as _logger and let _name_logger rename it.
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(_logger=name, **context)
    return logger


REPEAT_INTERVAL_S = 10.0
"""How often a :class:`RateLimited` line may repeat."""


class RateLimited:
    """One log line that can repeat without bound (every request out of time, every failed
    accept while the process is out of file descriptors), written at most once per
    ``interval_s``: the first at once, later ones with ``repeated``, how many were left out
    since the last one written. Thread-safe."""

    def __init__(
        self,
        logger: structlog.typing.FilteringBoundLogger,
        level: str,
        interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = getattr(logger, level)
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._left_out = 0

    def log(self, event: str, **fields: Any) -> bool:
        """Write ``event`` now unless one was written less than the interval ago (then count
        it); True when written."""
        with self._lock:
            now = self._clock()
            if now - self._last < self._interval_s:
                self._left_out += 1
                return False
            self._last = now
            left_out, self._left_out = self._left_out, 0
        if left_out:
            fields["repeated"] = left_out
        self._log(event, **fields)
        return True


MAX_LOOP_ERROR_KINDS = 32
"""Distinct event-loop error messages that are each rate-limited on their own; the rest share
one limit."""


class LoopErrors:
    """The event loop's exception handler (``loop.set_exception_handler``): what asyncio cannot
    hand to anyone -- an accept that failed because the process is out of file descriptors, a
    callback's exception -- logged as one structured error per kind of message, at most once per
    :data:`REPEAT_INTERVAL_S` each (:class:`RateLimited`).

    asyncio's own handler writes a traceback for every one: out of file descriptors, an accept
    loop failed hundreds of times a second, and 120 000 lines in seconds buried the log (and
    filled the node's disk) while they said one thing.
    """

    def __init__(self, logger: structlog.typing.FilteringBoundLogger) -> None:
        self._log = logger
        self._limits: dict[str, RateLimited] = {}
        self._others = RateLimited(logger, "error")

    def __call__(self, loop: object, context: dict[str, Any]) -> None:
        message = str(context.get("message") or "unhandled exception in the event loop")
        limit = self._limits.get(message)
        if limit is None:
            if len(self._limits) < MAX_LOOP_ERROR_KINDS:
                limit = self._limits[message] = RateLimited(self._log, "error")
            else:
                limit = self._others
        exc = context.get("exception")
        error = f"{type(exc).__name__}: {exc}" if exc is not None else None
        limit.log("event loop error", message=message[:500], error=error and error[:500])
