"""Checksums of a network read taken as its bytes arrive (and of a network write's value as it
is sent), while they are still in the cache.

A separate pass after a large TCP read sums bytes the kernel wrote long enough ago to have left
the cache (5.9 GB/s measured against ~30 GB/s hot: docs/benchmarks.md, "Integrity cost").
:class:`LandingSums` is the read's ``landed`` listener (``kvcake.transfer.types.Landed``): it
feeds each chunk's XXH3 state with the pieces the transport reports, in order, and finishes a
chunk's sum when its last byte arrives.

Why the verdict equals a separate pass's: a chunk's early sum counts only if one in-order run
of reports covered it from its first byte to its last and nothing landed in it afterwards (a
retried slice lands its bytes again: that voids the sum, or restarts it at the chunk's first
byte). Every other chunk, and every chunk whose early sum does not match, is summed again
after the read from the bytes as they finally are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import xxhash

from kvcake.core import integrity
from kvcake.store.errors import ChecksumMismatch
from kvcake.transfer.types import Landed

# Pieces are hashed in runs of at least this many bytes (fewer Python calls; still in L2).
RUN = 256 * 1024


class LandingSums:
    """Sums of ``out``, the value's bytes from ``off`` (chunk aligned; ``out`` ends on a chunk
    boundary or at the value's end). Thread safe: several lanes may report at once."""

    def __init__(self, key: str, off: int, out: memoryview):
        self._out = out
        self._first = off // integrity.CHUNK
        count = integrity.chunk_count(out.nbytes)
        self._seeds = integrity.chunk_seeds(key, self._first, count)
        self._hashers: list[xxhash.xxh3_64 | None] = [None] * count
        self._pos = [0] * count  # where a chunk's in-order run goes on (out offsets)
        self._hashed = [0] * count  # how far that run is hashed
        self._sums: list[int | None] = [None] * count
        self._lock = threading.Lock()

    def landed(self, start: int, end: int) -> None:
        """Bytes ``[start, end)`` of ``out`` have just arrived (``transfer.types.Landed``)."""
        chunk = integrity.CHUNK
        with self._lock:
            while start < end:
                i = start // chunk
                stop = min(end, (i + 1) * chunk, self._out.nbytes)
                self._advance(i, start, stop)
                start = stop

    def _advance(self, i: int, start: int, stop: int) -> None:
        chunk_start = i * integrity.CHUNK
        self._sums[i] = None  # a landing voids an earlier sum
        if start == chunk_start:  # a run (re)starts at the chunk's first byte
            self._hashers[i] = xxhash.xxh3_64(seed=self._seeds[i])
            self._hashed[i] = chunk_start
        elif self._hashers[i] is None or self._pos[i] != start:
            self._hashers[i] = None  # out of order: summed after the read
            return
        self._pos[i] = stop
        chunk_end = min(chunk_start + integrity.CHUNK, self._out.nbytes)
        if stop - self._hashed[i] < RUN and stop != chunk_end:
            return
        hasher = self._hashers[i]
        assert hasher is not None
        hasher.update(self._out[self._hashed[i] : stop])
        self._hashed[i] = stop
        if stop == chunk_end:
            self._sums[i] = hasher.intdigest()
            self._hashers[i] = None

    def final(self) -> list[int]:
        """Every chunk's sum: the early one, or taken now from the bytes as they are (a write's
        source, which does not change under it)."""
        return [
            early
            if early is not None
            else xxhash.xxh3_64_intdigest(self._chunk(i), seed=self._seeds[i])
            for i, early in enumerate(self._sums)
        ]

    def _chunk(self, i: int) -> memoryview:
        return self._out[i * integrity.CHUNK : (i + 1) * integrity.CHUNK]

    def bad(self, sums: Sequence[int]) -> list[int]:
        """After the read: the value's chunk indexes in ``out`` that fail ``sums`` (a chunk
        without a matching early sum is summed now, from its final bytes)."""
        bad = []
        for i, early in enumerate(self._sums):
            index = self._first + i
            if index >= len(sums):
                bad.append(index)
                continue
            if early == sums[index]:
                continue
            if xxhash.xxh3_64_intdigest(self._chunk(i), seed=self._seeds[i]) != sums[index]:
                bad.append(index)
        return bad


def fetch_landing(
    key: str,
    sums: Sequence[int],
    size: int,
    off: int,
    out: memoryview,
    read: Callable[[int, memoryview, Landed], None],
) -> None:
    """``verify.fetch_verified`` for a network read that reports its progress: ``read(off,
    out, landed)`` fills ``out``, and each chunk is summed as it arrives."""
    landing = LandingSums(key, off, out)
    read(off, out, landing.landed)
    bad = landing.bad(sums)
    if bad or len(sums) != integrity.chunk_count(size):
        raise ChecksumMismatch(f"{key!r}: chunks {bad[:4] or 'all'} fail their checksums")
