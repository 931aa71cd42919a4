"""The compute modes MPS claims, and the records that let them be restored.

A GPU an MPS daemon serves is put in compute mode EXCLUSIVE_PROCESS through NVML; the mode it had
is recorded first in ``<root>/compute-modes/<GPU UUID>``. The record outlives the plugin: it stays
while MPS serves the GPU -- across plugin restarts, whose daemons keep running -- and whoever ends
MPS on the GPU for good (a plugin whose config no longer shares it through MPS, ``nvplugin mps
stop``) restores the recorded mode and removes the record. So the mode restored is the one before
MPS, never EXCLUSIVE_PROCESS taken from a GPU MPS had already claimed.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Protocol

from nvplugin.errors import NvpluginError
from nvplugin.log import get_logger
from nvplugin.node.model import Gpu

EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"
COMPUTE_MODES_DIR = "compute-modes"
"""``<root>/compute-modes/<GPU UUID>``: the compute mode a GPU had before MPS claimed it."""


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
        path = Path(self.directory, gpu.uuid)
        mode = None
        with contextlib.suppress(OSError):
            mode = path.read_text().strip() or None
        if mode is None:
            mode = self._nvml.compute_mode(gpu.index)
            os.makedirs(self.directory, mode=0o755, exist_ok=True)
            path.write_text(mode + "\n")
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
            with contextlib.suppress(OSError):
                mode = Path(self.directory, name).read_text().strip()
                if mode:
                    found[name] = mode
        return found

    def restore(self, gpu: Gpu, mode: str) -> bool:
        """``gpu`` back in ``mode`` and its record removed; False (logged, the record kept for
        whoever comes next) when NVML refuses."""
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
