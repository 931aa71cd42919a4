"""Logging set-up (structlog): JSON lines for machines, a console rendering for people.

The daemon runs in a pod whose logs are collected line by line, so the default is one JSON
object per line on stderr. On a terminal, or with ``--log-format console``, lines are rendered
for reading. Exceptions are rendered as plain tracebacks without local variables: locals can hold
device IDs, config values or request contents, and a log line is no place for them.

``configure`` can be called again (SIGHUP reloads the level and format): loggers are not cached
on first use, so every logger picks the new set-up up.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

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
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
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
