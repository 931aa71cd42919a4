"""Errors a user can act on. The CLI prints their message (no traceback) and exits with
``exit_code``: 2 for bad input (node file, config, arguments), 1 for failures of the system
(no NVML, a lost GPU, a socket someone else serves)."""

from __future__ import annotations

MAX_MESSAGE = 2000
"""Longest message an error keeps: a last guard for values no caller thought to shorten (a log
line or a terminal should never receive a user's megabyte)."""


class NvpluginError(Exception):
    """A failure with a message fit for a user; never shown with a traceback."""

    exit_code = 1

    def __init__(self, message: str = "") -> None:
        super().__init__(shortened(message, MAX_MESSAGE))


class InputError(NvpluginError):
    """Bad input: the message names the file, field (or key path) and value."""

    exit_code = 2


def describe(value: object) -> str:
    """A value as an error message shows it: ``null``, ``a mapping``, ``a list`` or its bounded
    repr and type, e.g. ``'yes' (str)``."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{show(value)} ({type(value).__name__})"


def show(value: object, limit: int = 80) -> str:
    """``repr(value)`` for a message, never longer than about ``limit`` characters and never
    failing: Python refuses to print an int of more than 4300 digits (ValueError), and a user's
    value may be megabytes long."""
    if isinstance(value, int) and value.bit_length() > 4 * limit:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    try:
        text = repr(value)
    except Exception:  # an object whose repr fails still gets a message
        return f"a {type(value).__name__}"
    return shortened(text, limit)


def printable(text: str) -> str:
    """``text`` with every character that is not printable -- control characters (a terminal's
    escape sequences, newlines), format characters (a right-to-left override) -- written as its
    Python escape (``\\x1b``, ``\\n``, ``\\u202e``): a name a driver or a file gives us never
    moves a terminal's cursor, forges a log line or hides what follows it."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def shortened(text: str, limit: int) -> str:
    """Client-supplied text for an error message: whole when short, else its first ``limit``
    characters and its length (gRPC status messages travel in size-capped trailers)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def reason(exc: BaseException) -> str:
    """What went wrong, for a log line or a message: an :class:`NvpluginError`'s own message,
    else the exception's type and its bounded text (an exception nobody foresaw says what it is,
    and its text may hold a user's megabyte). Never raises."""
    if isinstance(exc, NvpluginError):
        return str(exc)
    try:
        text = str(exc)
    except Exception:  # an exception whose str fails still gets a reason
        text = ""
    name = type(exc).__name__
    return f"{name}: {shortened(text, 500)}" if text else name
