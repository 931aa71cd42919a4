"""Handing start-up's freed heap back to the OS: glibc's malloc_trim where there is one, a no-op
(False) elsewhere, never an error."""

from __future__ import annotations

import ctypes
import os

import pytest

from nvplugin.plugin import heap


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _has_malloc_trim() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "malloc_trim")
    except OSError:
        return False


def test_freed_heap_goes_back_to_the_os() -> None:
    # 16 MiB of freed 4 KiB blocks (what start-up leaves in an arena) below a block still in use,
    # so that free() cannot give them back by shrinking the heap from its top: only a trim can.
    blocks = [bytearray(4096) for _ in range(4096)]
    kept = bytearray(4096)
    del blocks
    before = _resident_bytes()
    released = heap.release_freed_heap()
    after = _resident_bytes()
    assert kept is not None
    if not _has_malloc_trim():  # musl, macOS: nothing to ask, nothing returned
        assert released is False
        return
    assert released is True
    assert before - after >= 8 * 2**20, (before, after)


def test_a_c_library_without_malloc_trim_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoTrim:
        def __init__(self, name: object) -> None:
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoTrim)
    assert heap.release_freed_heap() is False
