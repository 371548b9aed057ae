"""Buffers for bytes that a read is about to overwrite."""

from __future__ import annotations

import ctypes

_NEW_BYTEARRAY = ctypes.pythonapi.PyByteArray_FromStringAndSize
_NEW_BYTEARRAY.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_NEW_BYTEARRAY.restype = ctypes.py_object


def uninitialized_bytearray(size: int) -> bytearray:
    """A bytearray whose contents are NOT zeroed (CPython's documented
    ``PyByteArray_FromStringAndSize(NULL, n)``): the read that follows overwrites every byte,
    and skipping the zero-fill saves a full pass over multi-MB values."""
    if size < 65536:
        return bytearray(size)
    out: bytearray = _NEW_BYTEARRAY(None, size)
    return out
