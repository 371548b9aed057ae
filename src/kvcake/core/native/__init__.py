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
from typing import Protocol

import numpy as np
import numpy.typing as npt

from kvcake.core.native import halves

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
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
    )
    fn.restype = ctypes.c_int
    fn = lib.kvc_scatter_sum_many
    fn.argtypes = (
        (ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        + (ctypes.c_void_p,) * 8
        + (ctypes.c_int,)
    )
    fn.restype = ctypes.c_long
    fn = lib.kvc_copy_list
    fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = None
    return lib


_LIB = _load()
AVAILABLE = _LIB is not None
# copysum.c's flags. STREAM: the destination is written with non-temporal stores (a large copy
# into memory the copier will not read back: ~2x memcpy into cold memory, docs/store.md,
# "Integrity"); BOUNCE: each summed piece is summed in an L1 buffer it then leaves from, so the
# sums are of the bytes handed over even if the source changes meanwhile (a peer's segment).
STREAM, BOUNCE = 1, 2
# From here up a copy streams (and goes through C: below it the ctypes call costs more than
# the stores it saves, and the destination is likely to be read from the cache soon).
STREAM_MIN = 256 * 1024


def address(view: memoryview) -> int:
    """The address of a 1-D byte view's first byte (read-only views through numpy; 0 for an
    empty view)."""
    if not view.nbytes:
        return 0
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])


_address = address


def copy(dst: memoryview, src: memoryview, stream: bool = True) -> None:
    """``dst[:] = src`` (same length): the plain copy the checksummed ones are measured
    against. ``stream``: through C with non-temporal stores from :data:`STREAM_MIN` bytes up
    (into memory not read back soon: a segment); else into the cache (a reader's buffer).
    From ``halves.SPLIT_MIN`` up either is split in two halves (core/native/halves.py), as the
    summing copies are."""
    n = src.nbytes
    if _LIB is None or n < (STREAM_MIN if stream else halves.SPLIT_MIN):
        dst[:] = src
        return
    if dst.nbytes != n:
        raise ValueError(f"copy of {n} bytes into {dst.nbytes}")
    flags = STREAM if stream else 0
    if n >= halves.SPLIT_MIN:
        h = n // 2 // 4096 * 4096
        first = lambda: _copy(dst[:h], src[:h], flags)  # noqa: E731
        if halves.in_halves(first, lambda: _copy(dst[h:], src[h:], flags)):
            return
    _copy(dst, src, flags)


def _copy(dst: memoryview, src: memoryview, flags: int) -> None:
    assert _LIB is not None
    n = src.nbytes
    if _LIB.kvc_copy_sum(_address(dst), _address(src), n, n, None, None, flags) != 0:
        raise ValueError("kvc_copy_sum refused its arguments")


def copy_sum(
    dst: memoryview | None,
    src: memoryview,
    chunk: int,
    seeds: Sequence[int],
    flags: int = 0,
) -> list[int]:
    """Copy ``src`` into ``dst`` (same length; None: only sum) and return the XXH3-64 sums of
    its ``chunk``-byte chunks, chunk ``i`` seeded by ``seeds[i]`` (one seed per chunk). Each
    4 KiB piece is summed right after it is copied, in L1. ``flags``: :data:`STREAM`,
    :data:`BOUNCE`. Needs :data:`AVAILABLE`."""
    assert _LIB is not None, "kvcake.core.native is not built (make native)"
    n = src.nbytes
    count = (n + chunk - 1) // chunk
    if len(seeds) != count or (dst is not None and dst.nbytes != n):
        raise ValueError(f"{len(seeds)} seeds for {count} chunks, or dst of another size")
    if n == 0:
        return []
    if n >= halves.SPLIT_MIN and count >= 2:
        h = count // 2
        both = halves.in_halves(
            lambda: _copy_sum(_part(dst, 0, h * chunk), src[: h * chunk], chunk, seeds[:h], flags),
            lambda: _copy_sum(_part(dst, h * chunk, n), src[h * chunk :], chunk, seeds[h:], flags),
        )
        if both is not None:
            return both[0] + both[1]
    return _copy_sum(dst, src, chunk, seeds, flags)


def _part(dst: memoryview | None, start: int, end: int) -> memoryview | None:
    return dst[start:end] if dst is not None else None


def _copy_sum(
    dst: memoryview | None, src: memoryview, chunk: int, seeds: Sequence[int], flags: int
) -> list[int]:
    assert _LIB is not None
    n = src.nbytes
    count = len(seeds)
    seed_arr = array.array("Q", seeds)
    out = array.array("Q", bytes(8 * count))
    dst_addr = _address(dst) if dst is not None else None
    code = _LIB.kvc_copy_sum(
        dst_addr, _address(src), n, chunk, seed_arr.buffer_info()[0], out.buffer_info()[0], flags
    )
    if code != 0:
        raise ValueError("kvc_copy_sum refused its arguments")
    return out.tolist()


class StopFlag:
    """A flag a running :func:`scatter_sum_many` reads before each chunk (an ``int`` in C memory,
    so it is seen without the GIL): set it, and the copy in progress ends within one chunk."""

    def __init__(self) -> None:
        self.value = ctypes.c_int(0)

    def set(self) -> None:
        self.value.value = 1


class CopyList:
    """A scatter list built once (source address, destination, length per copy) and run as
    one C loop, the GIL released: the baseline a load is measured against."""

    def __init__(self, copies: Sequence[tuple[int, memoryview]], flags: int = 0):
        assert _LIB is not None, "kvcake.core.native is not built (make native)"
        self._flags = flags
        self._keep = [b for _, b in copies]  # the destinations outlive the list
        self._src = array.array("Q", [a for a, _ in copies])
        self._dst = array.array("Q", [_address(b) for _, b in copies])
        self._len = array.array("Q", [b.nbytes for _, b in copies])

    def run(self) -> None:
        assert _LIB is not None
        n = len(self._src)
        if n:
            _LIB.kvc_copy_list(
                self._src.buffer_info()[0],
                self._dst.buffer_info()[0],
                self._len.buffer_info()[0],
                n,
                self._flags,
            )


class Table(Protocol):
    """A value's destinations as arrays (``core.ranges.RangeTable``): sorted, disjoint."""

    offsets: npt.NDArray[np.uint64]
    lengths: npt.NDArray[np.uint64]
    addrs: npt.NDArray[np.uint64]
    nbytes: int
    tiled: bool
    start: int
    dense: bool  # no range is empty


Ranges = Sequence[tuple[int, memoryview]] | Table


def scatter_sum_many(
    values: Sequence[tuple[memoryview, Ranges, Sequence[int]]],
    chunk: int,
    stop: StopFlag | None = None,
    summed: bool = True,
    flags: int = 0,
    shift: Sequence[int] | None = None,
) -> tuple[int, list[list[int]]]:
    """Copy each value's ``src[off : off + len(buf)]`` into each ``(off, buf)`` of its
    ``ranges`` (offsets into ``src``, sorted, disjoint, inside it; writable buffers; a value
    whose ranges C refuses raises ValueError) in one C call, and sum each ``chunk`` of ``src``
    *as handed over* with its seed: covered bytes in their destination right after their copy,
    the rest in ``src``. ``ranges`` may be a :class:`Table` (arrays; ``shift[j]`` is then
    subtracted from value j's offsets: ``src`` starts that far into the value). Returns how
    many values were done (fewer than all when ``stop`` was set: the one at that index was cut
    short) and each done value's sums (``summed`` False: copy only, the seeds unused and the
    sums meaningless). ``flags``: :data:`STREAM` (summed pieces then always bounce: they come
    from a peer's memory)."""
    assert _LIB is not None, "kvcake.core.native is not built (make native)"
    srcs, ns, sfirst = array.array("Q"), array.array("Q"), array.array("Q")
    seeds = array.array("Q")
    dsts: list[npt.NDArray[np.uint64]] = []
    offs: list[npt.NDArray[np.uint64]] = []
    lens: list[npt.NDArray[np.uint64]] = []
    for j, (src, ranges, value_seeds) in enumerate(values):
        if len(value_seeds) != (src.nbytes + chunk - 1) // chunk:
            raise ValueError(f"{len(value_seeds)} seeds for a value of {src.nbytes} bytes")
        srcs.append(address(src))
        ns.append(src.nbytes)
        sfirst.append(len(seeds))
        seeds.extend(value_seeds)
        d, o, n = _arrays(ranges, shift[j] if shift is not None else 0)
        dsts.append(d)
        offs.append(o)
        lens.append(n)
    rfirst = np.zeros(len(values) + 1, np.uint64)
    rfirst[1:] = np.cumsum([len(d) for d in dsts])
    dst, off, ln = (np.ascontiguousarray(np.concatenate(x or [_EMPTY])) for x in (dsts, offs, lens))
    out = array.array("Q", bytes(8 * max(1, len(seeds))))
    stop_at = ctypes.addressof(stop.value) if stop is not None else None
    done = _LIB.kvc_scatter_sum_many(
        len(values),
        _ptr(srcs),
        _ptr(ns),
        chunk,
        _ptr(seeds) if summed else None,
        _ptr(out),
        _ptr(sfirst),
        dst.ctypes.data,
        off.ctypes.data,
        ln.ctypes.data,
        rfirst.ctypes.data,
        stop_at,
        flags,
    )
    if done < 0:
        raise ValueError(f"value {-1 - done}: ranges overlap or lie outside it")
    sums = out.tolist()
    ends = [*sfirst[1:], len(seeds)]
    return done, [sums[a:b] for a, b in zip(sfirst[:done], ends[:done], strict=True)]


_EMPTY = np.zeros(0, np.uint64)


def _arrays(
    ranges: Ranges, shift: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """(destination addresses, offsets into src, lengths) of one value's non-empty ranges."""
    if isinstance(ranges, Sequence):
        live = [(o, b) for o, b in ranges if b.nbytes]
        n = len(live)
        return (
            np.fromiter((address(b) for _, b in live), np.uint64, n),
            np.fromiter((o - shift for o, _ in live), np.uint64, n),
            np.fromiter((b.nbytes for _, b in live), np.uint64, n),
        )
    if ranges.dense:
        return ranges.addrs, ranges.offsets - np.uint64(shift), ranges.lengths
    keep = ranges.lengths > 0
    offsets = ranges.offsets[keep] - np.uint64(shift)
    return ranges.addrs[keep], offsets, ranges.lengths[keep]


def _ptr(a: array.array[int]) -> int | None:
    return a.buffer_info()[0] if len(a) else None
