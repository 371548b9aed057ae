"""store/landing.py: sums taken from a read's progress reports agree with a separate pass over
the final bytes, however the reports come (in order, in pieces, out of order, retried)."""

from __future__ import annotations

import random

from kvcake.core.integrity import CHUNK, checksums
from kvcake.store.landing import RUN, LandingSums

SIZE = 3 * CHUNK + 4321  # four chunks, the last one short


def data(seed: int, n: int = SIZE) -> bytearray:
    return bytearray(random.Random(seed).randbytes(n))


def land(sums: LandingSums, out: bytearray, src: bytes, a: int, b: int) -> None:
    """What a transport does: the bytes arrive, then the report."""
    out[a:b] = src[a:b]
    sums.landed(a, b)


def pieces(n: int, rng: random.Random) -> list[tuple[int, int]]:
    out, at = [], 0
    while at < n:
        step = rng.choice([1, 4096, 65536, RUN - 1, RUN, 3 * RUN + 17])
        out.append((at, min(n, at + step)))
        at = out[-1][1]
    return out


def test_in_order_pieces_of_any_size_sum_every_chunk_early() -> None:
    src, rng = data(1), random.Random(1)
    for _ in range(5):
        out = bytearray(SIZE)
        sums = LandingSums("k", 0, memoryview(out))
        for a, b in pieces(SIZE, rng):
            land(sums, out, src, a, b)
        assert all(s is not None for s in sums._sums)  # no chunk left for the final pass
        assert sums.bad(checksums("k", src)) == []
        assert sums.bad(checksums("j", src)) == [0, 1, 2, 3]


def test_out_of_order_pieces_are_summed_after_the_read() -> None:
    src = data(2)
    out = bytearray(SIZE)
    sums = LandingSums("k", 0, memoryview(out))
    for a, b in reversed(pieces(SIZE, random.Random(2))):
        land(sums, out, src, a, b)
    assert sums.bad(checksums("k", src)) == []


def test_bytes_changed_by_a_later_landing_are_judged_as_they_end() -> None:
    good, other = data(3), data(4)
    out = bytearray(SIZE)
    sums = LandingSums("k", 0, memoryview(out))
    land(sums, out, good, 0, SIZE)
    # A retried slice lands other bytes mid-chunk 1 (a stale peer answering twice): the
    # early sum of chunk 1 no longer counts.
    land(sums, out, other, CHUNK + 10, CHUNK + 20)
    assert sums.bad(checksums("k", good)) == [1]
    # ... and a retry from the chunk's first byte that lands the right bytes restores it.
    land(sums, out, good, CHUNK, 2 * CHUNK)
    assert sums.bad(checksums("k", good)) == []


def test_a_retry_restarting_a_chunk_makes_an_early_mismatch_a_pass() -> None:
    good, bad = data(5), data(6)
    out = bytearray(SIZE)
    sums = LandingSums("k", 0, memoryview(out))
    land(sums, out, bad, 0, CHUNK)  # the first attempt delivered wrong bytes
    land(sums, out, good, 0, SIZE)  # the retry the right ones
    assert sums.bad(checksums("k", good)) == []


def test_a_read_from_a_later_chunk_and_short_sum_lists() -> None:
    src = data(7)
    off = 2 * CHUNK
    out = bytearray(SIZE - off)
    sums = LandingSums("k", off, memoryview(out))
    land(sums, out, src[off:], 0, len(out))
    want = checksums("k", src)
    assert sums.bad(want) == []
    assert sums.bad(want[:3]) == [3]  # a missing sum never verifies


def test_a_writes_sums_come_early_or_from_the_bytes_as_they_are() -> None:
    src = bytes(data(8))
    sums = LandingSums("w", 0, memoryview(src))
    sums.landed(0, CHUNK)  # chunk 0 told in one run; chunk 1 from its middle; 2, 3 never
    sums.landed(CHUNK + 5, 2 * CHUNK)
    assert sums._sums[0] is not None and sums._sums[1] is None
    assert sums.final() == checksums("w", src)
