"""Keep freed multi-megabyte buffers in the process heap (glibc ``mallopt``).

By default glibc serves allocations above a (dynamic) threshold with fresh ``mmap``s and
returns freed heap tops to the kernel, so every multi-MB ``get`` touches brand-new pages: one
page fault per 4 KiB, which on a VM costs more than the copy itself (a 16 MB get spent most of
its time faulting). Raising the mmap threshold to its maximum (32 MiB on 64-bit) and the trim
threshold to 1 GiB lets freed value buffers be reused warm. Mooncake avoids the same cost with a
pre-registered client buffer. Process-wide and idempotent; a no-op off glibc. Disable with
``ClientConfig(tune_malloc=False)``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024

_done = False
_lock = threading.Lock()


def tune_malloc() -> bool:
    """Apply the settings once per process; True when glibc accepted them."""
    global _done
    with _lock:
        if _done:
            return True
        name = ctypes.util.find_library("c")
        if not name:
            return False
        try:
            libc = ctypes.CDLL(name)
            ok = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
            ok = bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and ok
        except (OSError, AttributeError):
            return False
        _done = ok
        return ok
