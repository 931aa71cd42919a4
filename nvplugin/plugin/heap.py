"""Handing the heap that start-up work freed back to the operating system.

Building the allocation policy (best-effort's count-vector arrays on a 32-GPU node) allocates
transient arrays on a worker thread and frees them before registration. glibc's allocator keeps
most of that freed memory in the thread's arena rather than returning it, so the process stays
resident by what its start-up needed at peak, not by what it keeps (docs/allocation.md has the
figures). ``malloc_trim(0)`` returns the free pages of every arena. Where the C library has no
``malloc_trim`` (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes


def release_freed_heap() -> bool:
    """Ask the C allocator to return freed heap pages to the OS: True when it returned some,
    False when it had none to return or the C library cannot be asked."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (AttributeError, OSError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
