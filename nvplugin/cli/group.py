"""The ``nvplugin`` group itself, and how every command turns a user error into a message and
its exit code."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from nvplugin import __version__

F = TypeVar("F", bound=Callable[..., Any])

NVIDIA_COMMAND = "nvidia-device-plugin"
"""The name of NVIDIA's plugin command, which nvplugin's package installs too (it serves)."""


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
    from nvplugin.log import configure

    # Logs go to stderr, warnings and up, unless a command sets its own (serve: its config's):
    # stdout carries the command's output alone (--output json is JSON and nothing else).
    configure(None, "warning")
