"""RangeTable: one value's destinations as arrays, checked when built (core/ranges.py), and
the native scatter reading them (core.native.scatter_sum_many)."""

from __future__ import annotations

import numpy as np
import pytest

from kvcake.core import integrity, native
from kvcake.core.ranges import RangeError, RangeTable


def test_pairs_are_sorted_and_their_overlap_is_noticed() -> None:
    a, b = bytearray(10), bytearray(5)
    t = RangeTable.of_pairs([(100, memoryview(a)), (3, memoryview(b))])
    assert list(t.offsets) == [3, 100] and list(t.lengths) == [5, 10]
    assert t.disjoint and t.nbytes == 15 and (t.start, t.end) == (3, 110)
    over = RangeTable.of_pairs([(0, memoryview(a)), (9, memoryview(b))])
    assert not over.disjoint  # byte 9 asked for twice: readers copy it in Python
    touching = RangeTable.of_pairs([(0, memoryview(a)), (10, memoryview(b))])
    assert touching.disjoint


def test_tiled_means_one_span_without_gaps_or_overlaps() -> None:
    """A TCP load lands straight in its ranges only when they tile a span (store/netreads.py)."""
    a, b, e = memoryview(bytearray(10)), memoryview(bytearray(5)), memoryview(bytearray(0))
    assert RangeTable.of_pairs([(10, b), (0, a)]).tiled  # order does not matter
    assert RangeTable.of_pairs([(0, a), (10, e), (10, b)]).tiled  # empty ranges do not count
    assert not RangeTable.of_pairs([(0, a), (11, b)]).tiled  # a gap
    assert not RangeTable.of_pairs([(0, a), (9, b)]).tiled  # an overlap
    assert not RangeTable.of_pairs([(0, e)]).tiled and not RangeTable.of_pairs([]).tiled


def test_bad_pairs_raise() -> None:
    with pytest.raises(RangeError):
        RangeTable.of_pairs([(-1, memoryview(bytearray(4)))])
    with pytest.raises(RangeError):
        RangeTable.of_pairs([(0, memoryview(b"read-only"))])


def test_strided_rows_name_the_same_bytes_as_views() -> None:
    planes = np.zeros((3, 6, 40), np.uint8)  # 3 planes, 6 rows of 40 bytes
    bases = np.array([planes[i].ctypes.data for i in range(3)], np.uint64)
    strides = np.full(3, 40, np.uint64)
    offs = np.array([0, 40, 80], np.uint64)
    lens = np.full(3, 40, np.uint64)
    t = RangeTable.strided(bases, strides, offs, lens, 4, planes)
    for i, (off, view) in enumerate(t.views()):
        view[:] = bytes([i + 1]) * 40
        assert off == 40 * i
    assert (planes[:, 4] == np.array([[1], [2], [3]])).all()
    assert not planes[:, :4].any() and not planes[:, 5].any()


def test_strided_rows_share_one_shape_and_sort_each_rows_addresses() -> None:
    planes = np.zeros((3, 6, 40), np.uint8)
    bases = np.array([planes[i].ctypes.data for i in range(3)], np.uint64)
    strides = np.full(3, 40, np.uint64)
    offs = np.array([80, 0, 40], np.uint64)  # plane 0 holds the value's last third
    lens = np.full(3, 40, np.uint64)
    rows = RangeTable.strided_rows(bases, strides, offs, lens, [1, 4], planes)
    for row, t in zip((1, 4), rows, strict=True):
        single = RangeTable.strided(bases, strides, offs, lens, row, planes)
        assert t.offsets.tolist() == [0, 40, 80] and t.tiled and t.disjoint and t.nbytes == 120
        assert t.addrs.tolist() == single.addrs.tolist()
        assert t.addrs.flags["C_CONTIGUOUS"]
        for off, view in t.views():
            view[:] = bytes([row * 10 + int(off) // 40]) * 40
    assert planes[0, 1, 0] == 12 and planes[1, 4, 0] == 40 and planes[2, 4, 0] == 41


@pytest.mark.skipif(not native.AVAILABLE, reason="kvcake.core.native is not built")
def test_native_scatter_of_a_table_copies_and_sums_what_it_hands_over() -> None:
    rng = np.random.default_rng(1)
    value = rng.integers(0, 256, 3 * integrity.CHUNK, dtype=np.uint8).tobytes()
    outs = [bytearray(1000), bytearray(5000), bytearray(integrity.CHUNK)]
    pairs = [(2 * integrity.CHUNK, outs[2]), (7, outs[0]), (integrity.CHUNK - 10, outs[1])]
    t = RangeTable.of_pairs([(o, memoryview(b)) for o, b in pairs])
    seeds = integrity.chunk_seeds("k", 1, 2)
    # src is the value from chunk 1 on: offsets shift by one chunk; the range at 7 is outside
    tail = memoryview(value)[integrity.CHUNK :]
    with pytest.raises(ValueError):
        native.scatter_sum_many([(tail, t, seeds)], integrity.CHUNK, shift=[integrity.CHUNK])
    whole = integrity.chunk_seeds("k", 0, 3)
    done, sums = native.scatter_sum_many([(memoryview(value), t, whole)], integrity.CHUNK)
    assert done == 1 and sums[0] == integrity.checksums("k", value)
    for off, b in pairs:
        assert bytes(b) == value[off : off + len(b)]
