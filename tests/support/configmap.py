"""A ConfigMap volume as the kubelet writes it (its atomic writer), for per-node config tests.

The directory holds one timestamped directory with the files, ``..data`` linking to it, and one
link per key into ``..data``: ``a100-40gb -> ..data/a100-40gb``. An update writes a new
timestamped directory, points ``..data_tmp`` at it and renames that over ``..data`` (the one
atomic step), adds the links of new keys, removes those of deleted keys, then the old directory.
So a reader sees the old set of files or the new one, never half of each -- and a watcher sees
no write to any key's path, only the swap.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile


class ConfigMapVolume:
    """``ConfigMapVolume({"default": "...", "a100-40gb": "..."})``: written at once."""

    def __init__(self, data: dict[str, str], directory: str | None = None) -> None:
        self.path = directory or tempfile.mkdtemp()
        os.makedirs(self.path, exist_ok=True)
        self._serial = itertools.count()
        self.update(data)

    def update(self, data: dict[str, str]) -> None:
        """Replace the whole contents with ``data``, the way the kubelet does."""
        new = f"..2026_11_24_00_00_00.{next(self._serial):06d}"
        os.mkdir(os.path.join(self.path, new))
        for key, text in data.items():
            with open(os.path.join(self.path, new, key), "w") as f:
                f.write(text)
        data_link = os.path.join(self.path, "..data")
        old = os.readlink(data_link) if os.path.islink(data_link) else None
        tmp = os.path.join(self.path, "..data_tmp")
        os.symlink(new, tmp)
        os.rename(tmp, data_link)
        for key in data:
            link = os.path.join(self.path, key)
            if not os.path.islink(link):
                os.symlink(os.path.join("..data", key), link)
        for entry in os.listdir(self.path):
            if not entry.startswith("..") and entry not in data:
                os.remove(os.path.join(self.path, entry))
        if old is not None:
            shutil.rmtree(os.path.join(self.path, old))
