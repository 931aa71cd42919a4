"""The compute modes MPS claims, and the records that let them be restored.

A GPU an MPS daemon serves is put in compute mode EXCLUSIVE_PROCESS through NVML; the mode it had
is recorded first in ``<root>/compute-modes/<GPU UUID>``. The record outlives the plugin: it stays
while MPS serves the GPU -- across plugin restarts, whose daemons keep running -- and whoever ends
MPS on the GPU for good (a plugin whose config no longer shares it through MPS, ``nvplugin mps
stop``) restores the recorded mode and removes the record. So the mode restored is the one before
MPS, never EXCLUSIVE_PROCESS taken from a GPU MPS had already claimed.

The MPS root is a host directory: nothing in it is trusted. A record is read only when it is a
regular file inside the directory, a few bytes, naming a compute mode; any other is logged (never
its content) and left out, so the other GPUs are restored all the same. Records are written as a
new file renamed into place (a link or FIFO there is replaced, never followed or opened), and
directories are made with explicit modes, whatever the umask.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Protocol

from nvplugin.errors import InputError, NvpluginError, show
from nvplugin.log import get_logger
from nvplugin.node.model import Gpu
from nvplugin.node.nvml import COMPUTE_MODES
from nvplugin.yamlinput import read_bytes

EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"
COMPUTE_MODES_DIR = "compute-modes"
"""``<root>/compute-modes/<GPU UUID>``: the compute mode a GPU had before MPS claimed it."""
MAX_RECORD = 64
"""Largest record read (a compute mode's name and a newline)."""
DIR_MODE = 0o755
RECORD_MODE = 0o644


def make_dirs(path: str, mode: int = DIR_MODE) -> None:
    """``path`` and its missing parents, each made with ``mode`` exactly (``os.makedirs`` gives
    the parents 0777 less the umask: 0777 under umask 000). OSError."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, mode)
            os.chmod(directory, mode)


class ComputeModes(Protocol):
    """The part of :class:`nvplugin.node.nvml.Nvml` MPS needs."""

    def compute_mode(self, index: int) -> str: ...

    def set_compute_mode(self, index: int, mode: str) -> None: ...


class ModeRecords:
    """The records under MPS root ``root`` and the GPUs' modes through ``nvml``. Blocking (NVML,
    files): run off the event loop."""

    def __init__(self, root: str, nvml: ComputeModes) -> None:
        self.directory = os.path.join(root, COMPUTE_MODES_DIR)
        self._nvml = nvml
        self._log = get_logger("nvplugin.mps")

    def claim(self, gpu: Gpu) -> str:
        """Put ``gpu`` in EXCLUSIVE_PROCESS (left alone when it is: a running daemon's GPU is not
        disturbed); the mode to restore it to: as recorded (MPS claimed it before, and it was not
        restored), else its mode now, recorded. OSError, NvpluginError."""
        mode = self._read(gpu.uuid)
        if mode is None:
            mode = self._nvml.compute_mode(gpu.index)
            make_dirs(self.directory)
            self._write(gpu.uuid, mode)
        if self._nvml.compute_mode(gpu.index) != EXCLUSIVE_PROCESS:
            self._nvml.set_compute_mode(gpu.index, EXCLUSIVE_PROCESS)
        return mode

    def recorded(self) -> dict[str, str]:
        """Every record: GPU UUID -> the mode to restore, in UUID order."""
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return {}
        found = {}
        for name in names:
            mode = self._read(name)
            if mode is not None:
                found[name] = mode
        return found

    def _read(self, name: str) -> str | None:
        """The mode the record ``name`` holds; None when there is none, or it is not a regular
        file of the directory naming a compute mode (logged, without its content)."""
        path = os.path.join(self.directory, name)
        if not os.path.lexists(path):
            return None
        try:
            data = read_bytes(
                path, f"compute-mode record {path}", MAX_RECORD, within=self.directory
            )
        except InputError as exc:
            self._log.error("compute-mode record ignored", error=str(exc))
            return None
        mode = data.decode("ascii", "replace").strip()
        if len(data) > MAX_RECORD or mode not in COMPUTE_MODES:
            self._log.error(
                "compute-mode record ignored",
                error=f"compute-mode record {path}: holds no compute mode "
                f"({', '.join(COMPUTE_MODES)})",
            )
            return None
        return mode

    def _write(self, name: str, mode: str) -> None:
        """The record ``name`` holding ``mode``: a new file renamed over whatever was there."""
        fd, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=self.directory)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(mode + "\n")
                os.fchmod(out.fileno(), RECORD_MODE)
            os.replace(temporary, os.path.join(self.directory, name))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def restore(self, gpu: Gpu, mode: str) -> bool:
        """``gpu`` back in ``mode`` and its record removed; False (logged, the record kept for
        whoever comes next) when NVML refuses."""
        if mode not in COMPUTE_MODES:  # never from a record: they are checked when read
            self._log.error("cannot restore the compute mode", gpu=gpu.index, mode=show(mode))
            return False
        try:
            if self._nvml.compute_mode(gpu.index) != mode:
                self._nvml.set_compute_mode(gpu.index, mode)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, gpu.uuid))
        except (OSError, NvpluginError) as exc:
            self._log.error("cannot restore the compute mode", gpu=gpu.index, error=str(exc))
            return False
        self._log.info("compute mode restored", gpu=gpu.index, mode=mode)
        return True
