"""Where labels go: NFD's feature-file format, and the feature file written atomically.

Node Feature Discovery's ``local`` source reads every file in its ``features.d`` directory
(``/etc/kubernetes/node-feature-discovery/features.d/``) as ``key=value`` lines and labels the
node with them; it skips files whose names start with ``.``. So the file is written as a hidden
temporary file in the same directory, flushed, and renamed over the old one: NFD sees the old
labels or the new ones, never half a file. It is removed when the plugin stops, as GPU Feature
Discovery removes its file, so a node without the plugin loses its GPU labels.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Mapping

from nvplugin.errors import NvpluginError

FILE_MODE = 0o644
"""The feature file's mode (NFD's worker reads it as another user in some deployments)."""


def feature_text(labels: Mapping[str, str]) -> str:
    """``key=value`` lines in key order (what ``nvplugin labels`` prints, and the file holds)."""
    return "".join(f"{key}={labels[key]}\n" for key in sorted(labels))


def write_atomically(path: str, text: str) -> bool:
    """Replace ``path`` with ``text`` (see the module docstring); False when it already held
    exactly that. NvpluginError naming the file when it cannot be written (a missing directory,
    a read-only mount); nothing is left behind then."""
    if _holds(path, text):
        return False
    directory, name = os.path.split(path)
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory or ".")
    except OSError as exc:
        raise NvpluginError(
            f"cannot write the feature file {path}: {exc.strerror or exc}"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fchmod(out.fileno(), FILE_MODE)
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise NvpluginError(
            f"cannot write the feature file {path}: {exc.strerror or exc}"
        ) from None
    return True


def _holds(path: str, text: str) -> bool:
    """Whether ``path`` is a regular file holding exactly ``text``. Anything else there (a FIFO,
    a device, a link) is never opened for what it holds -- a FIFO would block the read until a
    writer came -- and is replaced by the rename like any stale file."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        # O_NONBLOCK and O_NOFOLLOW: something swapped in after the lstat cannot block or
        # redirect the read either; it fails the check on the descriptor.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        want = text.encode("utf-8")
        return os.read(fd, len(want) + 1) == want
    except OSError:
        return False
    finally:
        os.close(fd)


def remove(path: str) -> bool:
    """Remove the feature file; False when there was none. NvpluginError when it cannot be."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise NvpluginError(
            f"cannot remove the feature file {path}: {exc.strerror or exc}"
        ) from None
    return True


def _failure(what: str, path: str, exc: OSError) -> NvpluginError:
    return NvpluginError(f"cannot {what} the feature file {path}: {exc.strerror or exc}")
