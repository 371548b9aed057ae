"""A read's ``landed`` reports (``transfer.types.Landed``): each names bytes that have arrived,
in order within a slice, and together they cover the read -- also when a path dies midway and
slices are read again (then the retried bytes are reported again). The store sums each chunk
from these reports while it is in the cache (store/landing.py)."""

from __future__ import annotations

import threading

import pytest

from kvcake.core.integrity import CHUNK, checksums
from kvcake.store.landing import LandingSums

from .conftest import EngineFactory, pattern
from .test_failover import kill_after
from .test_tcp_paths import NICS, cfg


class Recorder:
    """Checks, at each report, that the reported bytes are already the source's."""

    def __init__(self, out: bytearray, want: bytearray):
        self.out, self.want = memoryview(out), memoryview(want)
        self.reports: list[tuple[int, int]] = []
        self.early: list[tuple[int, int]] = []  # reported before their bytes were there
        self._lock = threading.Lock()

    def landed(self, a: int, b: int) -> None:
        with self._lock:
            self.reports.append((a, b))
            if self.out[a:b] != self.want[a:b]:
                self.early.append((a, b))

    def covered(self) -> bool:
        seen = bytearray(len(self.out))
        for a, b in self.reports:
            assert 0 <= a < b <= len(self.out), (a, b)
            seen[a:b] = b"\x01" * (b - a)
        return all(seen)


@pytest.mark.parametrize("size", [4096, CHUNK, 5 * CHUNK + 777])
def test_reports_cover_a_read_with_bytes_that_arrived(
    make_engine: EngineFactory, size: int
) -> None:
    a = make_engine(protocol="tcp")
    b = make_engine()
    src = pattern(size, seed=size)
    b.register_memory("b", src)
    out = bytearray(size)
    rec = Recorder(out, src)
    a.read_into("b", 0, out, rec.landed)
    assert out == src
    assert rec.covered() and not rec.early
    if size <= CHUNK:  # one slice: one in-order run
        assert [r[0] for r in rec.reports] == sorted(r[0] for r in rec.reports)


def test_a_path_killed_midway_reports_the_retried_bytes_again(
    make_engine: EngineFactory,
) -> None:
    size = 8 * CHUNK + 123
    a = make_engine(protocol="tcp", config=cfg(streams=3, window=2))
    b = make_engine(listen_hosts=NICS)
    src = pattern(size, seed=7)
    b.register_memory("b", src)
    fired = kill_after(a, b.server, b.addresses[1], 5)
    out = bytearray(size)
    rec = Recorder(out, src)
    sums = LandingSums("k", 0, memoryview(out))

    def both(x: int, y: int) -> None:
        rec.landed(x, y)
        sums.landed(x, y)

    a.read_into("b", 0, out, both)
    assert fired.is_set()
    assert out == src
    assert rec.covered() and not rec.early
    assert sums.bad(checksums("k", src)) == []
    assert sums.bad(checksums("other", src)) == list(range(9))  # the sums mean something


@pytest.mark.parametrize("size", [4096, CHUNK, 5 * CHUNK + 777])
def test_a_write_tells_of_each_piece_once_it_is_sent(make_engine: EngineFactory, size: int) -> None:
    a = make_engine(protocol="tcp")
    b = make_engine()
    dst = bytearray(size)
    b.register_memory("b", dst)
    src = pattern(size, seed=size + 1)
    told: list[tuple[int, int]] = []
    sums = LandingSums("w", 0, memoryview(src))

    def both(x: int, y: int) -> None:
        told.append((x, y))
        sums.landed(x, y)

    a.write("b", 0, src, both)
    assert dst == src
    seen = bytearray(size)
    for x, y in told:
        seen[x:y] = b"\x01" * (y - x)
    assert all(seen)
    assert None not in sums._sums  # every chunk was summed as it went out, not afterwards
    assert sums.final() == checksums("w", src)


def test_write_many_writes_every_item_in_one_batch_and_fails_bad_ones_alone(
    make_engine: EngineFactory,
) -> None:
    # Slices of one chunk (the default): each chunk is summed whole on whichever lane sends it
    a = make_engine(protocol="tcp", config=cfg(slice_size=CHUNK, lane_bytes=CHUNK, streams=3))
    b = make_engine()
    one, two = bytearray(4 * CHUNK), bytearray(CHUNK)
    b.register_memory("one", one)
    b.register_memory("two", two)
    srcs = [pattern(3 * CHUNK + 5, seed=3), bytes(pattern(CHUNK - 9, seed=4)), b"x" * 10, b"y"]
    sums = LandingSums("m", 0, memoryview(srcs[0]))
    res = a.write_many(
        [
            ("one", 7, srcs[0], sums.landed),
            ("two", 9, srcs[1], None),  # read-only bytes may be written
            ("two", CHUNK - 5, srcs[2], None),  # runs past the segment's end
            ("nowhere", 0, srcs[3], None),
        ]
    )
    assert [r.ok for r in res.results] == [True, True, False, False]
    assert res.results[2].error_type == "OutOfRange"
    assert one[7 : 7 + len(srcs[0])] == srcs[0] and two[9:] == srcs[1]
    assert two[:9] == bytes(9)  # nothing of the refused item landed before its range
    assert None not in sums._sums  # summed as it went out
    assert sums.final() == checksums("m", srcs[0])


def test_read_many_reads_every_item_in_one_batch_and_fails_bad_ones_alone(
    make_engine: EngineFactory,
) -> None:
    a = make_engine(protocol="tcp")
    b = make_engine()
    one, two = pattern(3 * CHUNK + 5, seed=1), pattern(CHUNK, seed=2)
    b.register_memory("one", one)
    b.register_memory("two", two)
    outs = [bytearray(3 * CHUNK), bytearray(CHUNK - 9), bytearray(10), bytearray(4)]
    rec = Recorder(outs[0], one[5:])
    res = a.read_many(
        [
            ("one", 5, outs[0], rec.landed),
            ("two", 9, outs[1], None),
            ("two", CHUNK - 5, outs[2], None),  # runs past the segment's end
            ("nowhere", 0, outs[3], None),
        ]
    )
    assert [r.ok for r in res.results] == [True, True, False, False]
    assert res.results[2].error_type == "OutOfRange"
    assert outs[0] == one[5:] and outs[1] == two[9:]
    assert rec.covered() and not rec.early
