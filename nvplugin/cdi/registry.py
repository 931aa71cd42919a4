"""The CDI specs a node has, as a runtime reads them, and what a fully qualified name resolves to.

Spec files are the ``.json``, ``.yaml`` and ``.yml`` regular files of each directory (links are
not followed out of it), each read bounded in size. Directories are given lowest priority
first (``/etc/cdi``, then ``/var/run/cdi``): a later directory's device replaces an earlier
one's of the same name, and two specs of one directory that name the same device make it
unresolvable (a conflict), as CDI's registry does.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from nvplugin.cdi.validate import problems

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
SPEC_SUFFIXES = (".json", ".yaml", ".yml")
MAX_SPEC_BYTES = 8 * 1024 * 1024
MAX_SPEC_FILES = 256


@dataclass(frozen=True)
class Entry:
    """One device of one spec file."""

    path: str
    device: Mapping[str, Any]
    spec: Mapping[str, Any]

    @property
    def nodes(self) -> list[str]:
        """Its device nodes' container paths."""
        edits = self.device.get("containerEdits") or {}
        return [str(n.get("path")) for n in edits.get("deviceNodes") or [] if isinstance(n, dict)]


@dataclass
class Registry:
    """Devices by fully qualified name; ``conflicts``: names two specs of one directory
    define; ``errors``: files that could not be read or are not valid specs; ``kinds``: the
    spec files of each kind."""

    devices: dict[str, Entry] = field(default_factory=dict)
    conflicts: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    kinds: dict[str, list[str]] = field(default_factory=dict)

    def resolve(self, name: str) -> Entry | None:
        return None if name in self.conflicts else self.devices.get(name)

    def names_of(self, kind: str) -> list[str]:
        """The device names of ``kind`` (without the kind)."""
        prefix = f"{kind}="
        return [n.removeprefix(prefix) for n in self.devices if n.startswith(prefix)]


def _read(path: str) -> Any:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError("not a regular file")
        data = handle.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise ValueError(f"larger than {MAX_SPEC_BYTES} bytes")
    text = data.decode()
    return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)


def load(directories: Sequence[str]) -> Registry:
    """The registry of the specs in ``directories`` (lowest priority first); a directory that
    is not there holds no spec."""
    registry = Registry()
    for directory in directories:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        here: dict[str, list[Entry]] = {}
        files = [n for n in names if n.endswith(SPEC_SUFFIXES) and not n.startswith(".")]
        for name in files[:MAX_SPEC_FILES]:
            path = os.path.join(directory, name)
            try:
                spec = _read(path)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                registry.errors.append(f"{path}: cannot read it: {exc}")
                continue
            wrong = problems(spec)
            if wrong:
                registry.errors.append(f"{path}: not a valid CDI spec: {'; '.join(wrong[:3])}")
                continue
            kind = spec["kind"]
            registry.kinds.setdefault(kind, []).append(path)
            for device in spec["devices"]:
                here.setdefault(f"{kind}={device['name']}", []).append(Entry(path, device, spec))
        for qualified, entries in here.items():  # this directory's replace earlier ones'
            registry.conflicts.pop(qualified, None)
            registry.devices.pop(qualified, None)
            if len(entries) > 1:
                registry.conflicts[qualified] = [entry.path for entry in entries]
            else:
                registry.devices[qualified] = entries[0]
    return registry
