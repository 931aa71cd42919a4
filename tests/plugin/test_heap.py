"""Handing start-up's freed heap back to the OS: glibc's malloc_trim where there is one, a no-op
(False) elsewhere, never an error."""

from __future__ import annotations

import ctypes

import pytest

from nvplugin.plugin import heap


def test_trims_with_this_c_library() -> None:
    # Freed memory of a few MiB of small blocks: what start-up leaves in an arena.
    blocks = [bytearray(4096) for _ in range(2048)]
    del blocks
    assert heap.release_freed_heap() in (True, False)


def test_a_c_library_without_malloc_trim_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoTrim:
        def __init__(self, name: object) -> None:
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoTrim)
    assert heap.release_freed_heap() is False
