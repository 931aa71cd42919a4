"""The built-in simulated nodes: node files shipped in ``nvplugin/nodefile/nodes/``, named by their
file name (``dgx-a100``), that ``--simulate`` takes."""

from __future__ import annotations

from importlib import resources


def builtin_names() -> list[str]:
    """Names of the built-in nodes (``nvplugin/nodefile/nodes/<name>.yaml``), sorted."""
    folder = resources.files("nvplugin.nodefile") / "nodes"
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    )
