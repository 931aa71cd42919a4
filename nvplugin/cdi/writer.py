"""The spec on disk: written atomically (a hidden file beside it, then a rename, so a runtime
reading the directory sees the old spec or the new one, never half of one), left as it is when
unchanged, and never any file but nvplugin's own: ``<vendor>-<class>.json`` of its kind.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from nvplugin.errors import NvpluginError

MAX_OWN_SPEC_BYTES = 16 * 1024 * 1024
"""The most of an existing spec file read to compare it with the new one."""


def spec_file_name(kind: str) -> str:
    """``k8s.device-plugin.nvidia.com/gpu`` -> ``k8s.device-plugin.nvidia.com-gpu.json``."""
    vendor, _, klass = kind.partition("/")
    return f"{vendor}-{klass}.json"


def spec_text(spec: Any) -> str:
    return json.dumps(spec, indent=2) + "\n"


def _current(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        return handle.read(MAX_OWN_SPEC_BYTES + 1).decode(errors="replace")


def write_spec(directory: str, kind: str, spec: Any) -> tuple[str, bool]:
    """Write ``spec`` as ``directory``/<file of ``kind``>; (its path, whether it changed).
    Raises NvpluginError naming the file when it cannot be written."""
    path = os.path.join(directory, spec_file_name(kind))
    text = spec_text(spec)
    if _current(path) == text:
        return path, False
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise NvpluginError(f"cannot write the CDI spec {path}: {exc.strerror or exc}") from None
    write_file(path, text)
    return path, True


def write_file(path: str, text: str) -> None:
    """Write ``text`` as ``path`` atomically: a hidden file beside it, then a rename."""
    directory, name = os.path.split(path)
    aside = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        _remove(aside)  # a killed writer's, of the same pid
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(aside, path)
        except BaseException:
            _remove(aside)
            raise
    except OSError as exc:
        raise NvpluginError(f"cannot write the CDI spec {path}: {exc.strerror or exc}") from None


def _remove(path: str) -> None:
    """Remove our own aside file (a regular file) if it is there."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass
