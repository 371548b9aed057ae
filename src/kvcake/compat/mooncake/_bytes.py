"""Reads straight into a fresh ``bytes`` object: Mooncake's ``get`` returns ``bytes`` and kvcake's
client reads into a caller buffer, so the shim allocates the ``bytes`` uninitialised (as C
extensions do with ``PyBytes_FromStringAndSize(NULL, n)``) and lets the client fill it, instead
of reading into a bytearray and copying (a 1 MB value's copy costs ~100 us here). The object is
written only before it is returned, i.e. before anyone can see or hash it."""

from __future__ import annotations

import ctypes
import sys

_new = ctypes.pythonapi.PyBytes_FromStringAndSize
_new.restype = ctypes.py_object
_new.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_view = ctypes.pythonapi.PyMemoryView_FromMemory
_view.restype = ctypes.py_object
_view.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
_WRITE = 0x200  # PyBUF_WRITE
_DATA = sys.getsizeof(b"") - 1  # offset of ob_sval in a bytes object (CPython)
SMALL = 64 * 1024  # below this a copy is cheaper than the two ctypes calls


def new_bytes(n: int) -> tuple[bytes, memoryview]:
    """An ``n``-byte ``bytes`` (n >= 2: never a cached singleton) and a writable view of it."""
    if n < 2:
        raise ValueError("new_bytes needs n >= 2")
    out = _new(None, n)
    return out, _view(id(out) + _DATA, n, _WRITE)
