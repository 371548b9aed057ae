"""Native helpers: ``copysum.c``, built by ``make native`` (a C compiler and Debian's
``libxxhash-dev``) into ``_copysum.so`` next to it, loaded with ctypes, which releases the GIL
for each call. Every caller keeps a pure-Python path that computes the same sums, so a missing
build costs speed (docs/store.md, "Integrity"), never correctness; ``kvcake doctor``-style
checks read :data:`AVAILABLE`, and KVCAKE_NATIVE=0 turns the helpers off (to compare)."""

from __future__ import annotations

import array
import ctypes
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

_PATH = Path(__file__).with_name("_copysum.so")


def _load() -> ctypes.CDLL | None:
    if os.environ.get("KVCAKE_NATIVE", "1") == "0" or not _PATH.exists():
        return None
    try:
        lib = ctypes.CDLL(str(_PATH))
    except OSError:
        return None
    fn = lib.kvc_copy_sum
    fn.argtypes = (
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
        ctypes.c_void_p, ctypes.c_void_p,
    )  # fmt: skip
    fn.restype = ctypes.c_int
    return lib


_LIB = _load()
AVAILABLE = _LIB is not None


def _address(view: memoryview) -> int:
    """The address of a 1-D byte view's first byte (read-only views through numpy)."""
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])


def copy_sum(
    dst: memoryview | None, src: memoryview, chunk: int, seeds: Sequence[int]
) -> list[int]:
    """Copy ``src`` into ``dst`` (same length; None: only sum) and return the XXH3-64 sums of
    its ``chunk``-byte chunks, chunk ``i`` seeded by ``seeds[i]`` (one seed per chunk). Each
    4 KiB piece is summed right after it is copied, in L1. Needs :data:`AVAILABLE`."""
    assert _LIB is not None, "kvcake.core.native is not built (make native)"
    n = src.nbytes
    count = (n + chunk - 1) // chunk
    if len(seeds) != count or (dst is not None and dst.nbytes != n):
        raise ValueError(f"{len(seeds)} seeds for {count} chunks, or dst of another size")
    if n == 0:
        return []
    seed_arr = array.array("Q", seeds)
    out = array.array("Q", bytes(8 * count))
    dst_addr = _address(dst) if dst is not None else None
    code = _LIB.kvc_copy_sum(
        dst_addr, _address(src), n, chunk, seed_arr.buffer_info()[0], out.buffer_info()[0]
    )
    if code != 0:
        raise ValueError("kvc_copy_sum refused its arguments")
    return out.tolist()
