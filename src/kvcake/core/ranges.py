"""Where the parts of one value go: a table of (offset in the value, length, destination
address), the form a batched read hands to one C scatter (``core.native.scatter_sum_many``).

A load of 56 blocks into 30 KV planes is 1,680 ranges; as Python pairs of (offset, memoryview)
each one costs a view, a bounds check, an address lookup and a sort step per read, which
measured as long as the copy itself (docs/benchmarks.md, "Pool loads"). A table is three
numpy arrays built in a few vector operations (:meth:`RangeTable.strided_rows` for KV planes)
and checked once, when it is built.

Invariants (checked by the constructors): offsets are >= 0; every destination is writable
memory of ``keep`` (the table holds it alive); ``disjoint`` says whether the ranges, sorted by
offset, never share a byte of the value (the C scatter needs it; readers that do not fall back
to Python copies of :meth:`views`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcake.core import native

U64 = npt.NDArray[np.uint64]


class RangeError(ValueError):
    """A range table that cannot be built: a negative offset or a read-only destination."""


class _Shape:
    """What a table's offsets and lengths alone decide, computed once (numpy calls cost
    microseconds each: 56 tables a load, every read asking several of these), and shared by
    every row of a strided layout (one KV block per row: the same offsets and lengths)."""

    __slots__ = (
        "dense",
        "disjoint",
        "end",
        "lengths",
        "nbytes",
        "offsets",
        "order",
        "start",
        "tiled",
    )

    def __init__(self, offsets: U64, lengths: U64):
        self.order: npt.NDArray[np.intp] | None = None  # the sort applied to the addresses
        if not np.all(offsets[:-1] <= offsets[1:]):
            self.order = np.argsort(offsets, kind="stable")
            offsets, lengths = offsets[self.order], lengths[self.order]
        self.offsets, self.lengths = offsets, lengths
        ends = offsets + lengths
        self.disjoint = bool(np.all(offsets[1:] >= np.maximum.accumulate(ends)[:-1]))
        self.nbytes = int(lengths.sum())
        live = lengths > 0
        self.dense = bool(live.all())  # no empty range (the readers then skip their masks)
        lo, hi = (offsets, ends) if self.dense else (offsets[live], ends[live])
        # start/end: the first byte and one past the last byte any range asks for (0: none)
        self.start = int(lo[0]) if len(lo) else 0
        self.end = int(ends.max()) if len(ends) else 0
        # tiled: the non-empty ranges cover [start, end) with no gap or overlap
        self.tiled = bool(len(lo)) and bool(np.array_equal(lo[1:], hi[:-1]))


class RangeTable:
    """One value's destinations, sorted by offset. Built by :meth:`of_pairs`,
    :meth:`strided` or :meth:`strided_rows`, never by hand: the addresses must belong to
    ``keep``."""

    __slots__ = (
        "_pairs",
        "addrs",
        "dense",
        "disjoint",
        "end",
        "keep",
        "lengths",
        "nbytes",
        "offsets",
        "start",
        "tiled",
    )

    def __init__(
        self, offsets: U64, lengths: U64, addrs: U64, keep: object, pairs: list[Any] | None
    ):
        shape = _Shape(offsets, lengths)
        self._set(shape, addrs if shape.order is None else addrs[shape.order], keep, pairs)

    def _set(self, shape: _Shape, addrs: U64, keep: object, pairs: list[Any] | None) -> None:
        """``addrs``: already in ``shape``'s (sorted) order."""
        self.offsets, self.lengths, self.addrs = shape.offsets, shape.lengths, addrs
        self.keep = keep
        self._pairs = pairs
        self.dense, self.disjoint, self.nbytes = shape.dense, shape.disjoint, shape.nbytes
        self.start, self.end, self.tiled = shape.start, shape.end, shape.tiled

    @classmethod
    def of_pairs(cls, pairs: Sequence[tuple[int, memoryview]]) -> RangeTable:
        """From (offset, 1-D writable byte view) pairs (the general API's form)."""
        if any(off < 0 for off, _ in pairs):
            raise RangeError("a range starts before the value")
        if any(v.readonly for _, v in pairs):
            raise RangeError("a destination buffer is read-only")
        n = len(pairs)
        offs = np.fromiter((off for off, _ in pairs), np.uint64, n)
        lens = np.fromiter((v.nbytes for _, v in pairs), np.uint64, n)
        addrs = np.fromiter((native.address(v) for _, v in pairs), np.uint64, n)
        return cls(offs, lens, addrs, pairs, list(pairs))

    @classmethod
    def strided(
        cls, bases: U64, strides: U64, offsets: U64, lengths: U64, row: int, keep: object
    ) -> RangeTable:
        """Row ``row`` of several planes: plane i's part is ``lengths[i]`` bytes at
        ``bases[i] + row * strides[i]``, going to ``offsets[i]`` of the value. The caller
        vouches that every plane (held by ``keep``) is writable and has that row."""
        return cls.strided_rows(bases, strides, offsets, lengths, [row], keep)[0]

    @classmethod
    def strided_rows(
        cls,
        bases: U64,
        strides: U64,
        offsets: U64,
        lengths: U64,
        rows: Sequence[int],
        keep: object,
    ) -> list[RangeTable]:
        """:meth:`strided` for each of ``rows``, the shape computed once and the addresses
        in one vector operation (one contiguous row of it per table)."""
        shape = _Shape(offsets, lengths)
        pick = shape.order if shape.order is not None else slice(None)
        b, s = bases[pick], strides[pick]
        addrs = b[None, :] + np.asarray(rows, dtype=np.uint64)[:, None] * s[None, :]
        out = []
        for i in range(len(rows)):
            t = cls.__new__(cls)
            t._set(shape, addrs[i], keep, None)
            out.append(t)
        return out

    def views(self) -> list[tuple[int, memoryview]]:
        """(offset, writable byte view) pairs, for the read paths that copy in Python."""
        if self._pairs is not None:
            return self._pairs
        return [
            (int(o), memoryview((ctypes.c_char * int(n)).from_address(int(a))).cast("B"))
            for o, n, a in zip(self.offsets, self.lengths, self.addrs, strict=True)
        ]
