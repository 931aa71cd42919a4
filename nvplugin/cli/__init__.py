"""The ``nvplugin`` command. Each command is a thin shell over the library; imports are lazy so
that a short command starts fast. The commands live beside this module, one per part of the
package they front (``cdi``, ``extender``, ``node``, ``preferred``, ``serve``, ``migrate``,
``probe``, ``kubelet``, ``mps``, ``topology``), and register themselves on :func:`main`
(``group.py``) when imported below."""

from __future__ import annotations

import sys

from nvplugin.plugin.signals import PendingSignals

if sys.argv[1:2] in (["serve"], ["nvidia-device-plugin"]):
    # ``nvplugin serve`` (and ``nvplugin nvidia-device-plugin``, which NVIDIA's command runs)
    # handles SIGTERM, SIGINT and SIGHUP from here on, before click and the rest are imported (a
    # tenth of a second, more on a loaded node), in which SIGHUP's default action would kill it.
    # ``serve`` takes the recorder over (PendingSignals.current).
    PendingSignals.install()

# The commands, registered on main as they are imported.
from nvplugin.cli import (
    cdi,
    extender,
    kubelet,
    migrate,
    mps,
    node,
    preferred,
    probe,
    serve,
    topology,
)
from nvplugin.cli.group import NVIDIA_COMMAND, main, user_errors

__all__ = [
    "NVIDIA_COMMAND",
    "cdi",
    "extender",
    "kubelet",
    "main",
    "migrate",
    "mps",
    "node",
    "preferred",
    "probe",
    "serve",
    "topology",
    "user_errors",
]
