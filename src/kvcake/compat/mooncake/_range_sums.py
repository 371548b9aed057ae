"""Checksums of a value a put session writes in ranges (``core.integrity``: XXH3-64 per 1 MiB
chunk seeded by the key and the chunk's index), computed by the writer as it writes.

A chunk whose bytes arrive in order (one range or consecutive ones) is summed from the caller's
buffers while they are written, so the sums describe what the caller meant to store. A chunk
written out of order, twice, or not completely is summed at the session's end from the replica
just written (the only copy of those bytes the writer has then)."""

from __future__ import annotations

from collections.abc import Callable

import xxhash

from kvcake.core import integrity

ReadBack = Callable[[int, memoryview], None]  # (offset in the value, out) -> fill out


class RangeSums:
    """Bounded by the object's chunks: one finished sum or one running hasher per chunk."""

    def __init__(self, key: str, size: int):
        self.size = size
        self._seed = integrity.key_seed(key)
        self._open: dict[int, tuple[int, xxhash.xxh3_64]] = {}  # chunk -> (next byte, hasher)
        self._done: dict[int, int] = {}
        self._redo: set[int] = set()  # summed from the replica at the end

    def feed(self, off: int, data: memoryview) -> None:
        """``data`` was written at ``off`` of the value."""
        while data.nbytes:
            i = off // integrity.CHUNK
            start, stop = integrity.chunk_span(self.size, i)
            take = min(data.nbytes, stop - off)
            self._feed_chunk(i, start, stop, off, data[:take])
            off, data = off + take, data[take:]

    def _feed_chunk(self, i: int, start: int, stop: int, off: int, part: memoryview) -> None:
        state = self._open.pop(i, None)
        if state is None and off == start and i not in self._done and i not in self._redo:
            state = (start, xxhash.xxh3_64(seed=integrity.chunk_seed(self._seed, i)))
        if state is None or state[0] != off:
            self._redo.add(i)  # out of order or rewritten: read it back at the end
            self._done.pop(i, None)
            return
        state[1].update(part)
        if off + part.nbytes == stop:
            self._done[i] = state[1].intdigest()
        else:
            self._open[i] = (off + part.nbytes, state[1])

    def sums(self, read: ReadBack) -> list[int]:
        """Every chunk's sum; the ones not summed from the writes come from ``read``."""
        out = []
        for i in range(integrity.chunk_count(self.size)):
            if i in self._done:
                out.append(self._done[i])
                continue
            start, stop = integrity.chunk_span(self.size, i)
            buf = memoryview(bytearray(stop - start))
            read(start, buf)
            out.append(xxhash.xxh3_64_intdigest(buf, seed=integrity.chunk_seed(self._seed, i)))
        return out
