"""The ``nvplugin`` command. Each command is a thin shell over the library; imports are lazy so
that a short command starts fast."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from nvplugin import __version__

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(func: F) -> F:
    """Turn :class:`nvplugin.errors.NvpluginError` into a one-line message and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from nvplugin.errors import NvpluginError

        try:
            return func(*args, **kwargs)
        except NvpluginError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nvplugin")
def main() -> None:
    """Kubernetes device plugin for NVIDIA GPUs, with simulated nodes and a fake kubelet."""


# Commands. Each section below is owned by one part of the package; keep each command a thin
# shell over its library module (imports inside the function, so start-up stays fast).

# --- node: devices, topo ---

# --- allocator: preferred ---

# --- plugin: serve ---

# --- chart/probe: probe ---

# --- kubelet: admit, demo ---
