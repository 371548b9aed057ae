"""mooncake._fast_copy: gather a list of ndarrays into one raw buffer, as 0.3.13's C extension
does (``concat_arrays_into``, positional arguments only, the same errors and return value).

The wheel splits the copy over ``nthreads`` pthreads; here every array is one ``memmove``
(ctypes releases the GIL for it), so ``nthreads`` is accepted and has no effect."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


def concat_arrays_into(
    arrays: list[Any],
    dest_ptr: int,
    dest_size: int,
    start: int = 0,
    count: int = -1,
    nthreads: int = 1,
    /,
) -> int:
    """Copy ``arrays[start:start+count]`` back to back to ``dest_ptr``; the bytes copied.

    Out-of-range ``start``/``count`` are clamped (a negative ``count`` means "to the end");
    a non-ndarray is a ``TypeError``, a non-C-contiguous array or a total above ``dest_size``
    a ``ValueError``, and nothing is copied then."""

    if not isinstance(arrays, list):
        raise TypeError(
            f"concat_arrays_into() argument 1 must be list, not {type(arrays).__name__}"
        )
    dest_ptr, dest_size = _unsigned(dest_ptr, 2), _unsigned(dest_size, 3)
    start, count = _clamp(len(arrays), int(start), int(count))
    if count == 0:
        return 0
    chosen = arrays[start : start + count]
    for i, item in enumerate(chosen, start):
        if not isinstance(item, np.ndarray):
            raise TypeError(f"arrays[{i}] is not an ndarray")
        if not item.flags.c_contiguous:
            raise ValueError(f"arrays[{i}] is not C-contiguous")
    total = sum(int(a.nbytes) for a in chosen)
    if total > dest_size:
        raise ValueError(f"destination buffer too small: need {total} bytes, got {dest_size}")
    offset = 0
    for item in chosen:
        if item.nbytes:
            ctypes.memmove(dest_ptr + offset, item.ctypes.data, item.nbytes)
            offset += int(item.nbytes)
    return offset


def _unsigned(value: int, position: int) -> int:
    if not isinstance(value, int):
        raise TypeError(f"argument {position} must be int, not {type(value).__name__}")
    return value & 0xFFFFFFFFFFFFFFFF  # the C side parses "K": an unsigned long long


def _clamp(length: int, start: int, count: int) -> tuple[int, int]:
    start = min(max(start, 0), length)
    if count < 0 or start + count > length:
        count = length - start
    return start, count
