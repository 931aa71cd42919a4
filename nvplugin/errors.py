"""Errors a user can act on. The CLI prints their message (no traceback) and exits with
``exit_code``: 2 for bad input (node file, config, arguments), 1 for failures of the system
(no NVML, a lost GPU, a socket someone else serves)."""

from __future__ import annotations


class NvpluginError(Exception):
    """A failure with a message fit for a user; never shown with a traceback."""

    exit_code = 1


class InputError(NvpluginError):
    """Bad input: the message names the file, field (or key path) and value."""

    exit_code = 2


def describe(value: object) -> str:
    """A value as an error message shows it: ``null``, ``a mapping``, ``a list`` or its repr and
    type, e.g. ``'yes' (str)``."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{value!r} ({type(value).__name__})"


def shortened(text: str, limit: int) -> str:
    """Client-supplied text for an error message: whole when short, else its first ``limit``
    characters and its length (gRPC status messages travel in size-capped trailers)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
