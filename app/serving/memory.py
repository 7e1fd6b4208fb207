"""Give memory the server has freed back to the system.

glibc keeps freed memory for reuse, and a heap fragmented by request bodies of megabytes is
not trimmed by free() alone: in the soak, refused large uploads sent chunked left the server
much larger, nearly all of it free. malloc_trim(0) hands it back, quickly when there is nothing
to give, so the server calls it every few seconds, off the event loop.
Elsewhere than glibc (macOS, musl) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def release_free_memory() -> bool:
    """True when the allocator was asked to return its free pages."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True
