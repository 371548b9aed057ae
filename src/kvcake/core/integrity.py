"""Checksums bound to a key: the one definition every writer computes and every reader verifies.

An object's bytes are cut into fixed chunks of :data:`CHUNK` bytes (the last one may be shorter);
chunk ``i`` of key ``k`` is summed with XXH3-64 seeded by ``chunk_seed(key_seed(k), i)``. The
seed binds a sum to its key and to its chunk's place in the object, so another key's bytes, or
this key's chunks in another order, never verify -- which is what turns "the master answered
from stale state" or "a replica range was reused" into a detected miss instead of a wrong answer.

Whoever writes an object (the store client, the vLLM connector, the Mooncake shim) computes the
sums once; copies, moves, offloads and promotions carry them and never recompute them (that
would launder a corruption into a "valid" object). A reader verifies every chunk its read
covers before it reports success.

Why XXH3-64: ~8 GB/s on one core of this machine with the GIL released (docs/store.md,
"Integrity"), 64 bits so an accidental match is 2**-64 per chunk; not a MAC -- integrity
against bugs and stale state, not against an attacker who can write the pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from kvcake.core import native

CHUNK = 1 << 20  # bytes per checksum; fixed: it is part of the on-disk and wire format
# From here up a copy-and-sum goes through kvcake.core.native (when built): below it the
# ctypes call costs more than the sums it saves (docs/store.md, "Integrity").
NATIVE_MIN = 256 * 1024
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # spreads consecutive chunk indexes over the seed space

Checksums = list[int]  # one unsigned 64-bit sum per chunk, in chunk order


def key_seed(key: str) -> int:
    return xxhash.xxh3_64_intdigest(key.encode())


def chunk_seed(seed: int, index: int) -> int:
    return (seed + (index + 1) * _GOLDEN) & _MASK


def chunk_seeds(key: str, first: int, count: int) -> list[int]:
    """The seeds of chunks ``first .. first + count - 1`` of ``key`` (for a native call)."""
    seed = key_seed(key)
    return [chunk_seed(seed, first + i) for i in range(count)]


def chunk_count(size: int) -> int:
    return (size + CHUNK - 1) // CHUNK


def chunk_span(size: int, index: int) -> tuple[int, int]:
    """``[start, end)`` of chunk ``index`` in an object of ``size`` bytes."""
    start = index * CHUNK
    return start, min(size, start + CHUNK)


def covering(size: int, offset: int, length: int) -> range:
    """Indexes of the chunks that ``[offset, offset + length)`` touches."""
    if length <= 0:
        return range(0)
    return range(offset // CHUNK, (min(size, offset + length) - 1) // CHUNK + 1)


def one_sum(key: str, view: memoryview | bytes | bytearray) -> int:
    """The sum of chunk 0 of ``key``: a whole value of at most one chunk (the hot path of small
    values: ``chunk_seed(key_seed(key), 0)`` without its two calls)."""
    seed = (xxhash.xxh3_64_intdigest(key.encode()) + _GOLDEN) & _MASK
    return xxhash.xxh3_64_intdigest(view, seed=seed)


def whole_ok(key: str, view: memoryview | bytes | bytearray, sums: Sequence[int]) -> bool:
    """Whether ``view``, the whole bytes of a value of at most one chunk, matches ``sums``: the
    small-value hot path of every reader (one digest, no list built)."""
    if not len(view):
        return not sums
    return len(sums) == 1 and one_sum(key, view) == sums[0]


def whole_ok_many(
    keys: Sequence[str],
    views: Sequence[memoryview | bytes | bytearray],
    sums: Sequence[Sequence[int]],
) -> list[bool]:
    """:func:`whole_ok` of each (key, value, sums): a batch's values, checked in one pass
    without a Python call per value (a batch of small values' hot path)."""
    h = xxhash.xxh3_64_intdigest
    return [
        len(s) == 1 and h(v, seed=(h(k.encode()) + _GOLDEN) & _MASK) == s[0] if len(v) else not s
        for k, v, s in zip(keys, views, sums, strict=True)
    ]


def checksums(key: str, value: memoryview | bytes | bytearray) -> Checksums:
    """The sums of a whole value (a 1-D byte view or bytes)."""
    view = memoryview(value).cast("B") if not isinstance(value, memoryview) else value
    if view.nbytes <= CHUNK:  # one chunk (most values): one call, no chunk loop
        return [one_sum(key, view)] if view.nbytes else []
    seed = key_seed(key)
    return [
        xxhash.xxh3_64_intdigest(view[a:b], seed=chunk_seed(seed, i))
        for i, (a, b) in enumerate(
            chunk_span(view.nbytes, i) for i in range(chunk_count(view.nbytes))
        )
    ]


def well_formed(size: int, sums: Sequence[int]) -> bool:
    """Whether ``sums`` has one unsigned 64-bit value per chunk of a ``size``-byte object."""
    if len(sums) == 1:  # one chunk (most values): no call, no scan -- a put's hot path
        return 0 < size <= CHUNK and 0 <= sums[0] <= _MASK
    if len(sums) != chunk_count(size):
        return False
    return not sums or (min(sums) >= 0 and max(sums) <= _MASK)  # (no generator: a put's hot path)


def bad_chunks(
    key: str, size: int, sums: Sequence[int], pieces: Sequence[tuple[int, memoryview]]
) -> list[int]:
    """Verify the chunks that ``pieces`` cover (``(offset in the value, bytes)``, in ascending
    order, not overlapping; a chunk may span several pieces); returns the indexes that do not
    match. A chunk only partly covered counts as bad: a reader must hand over every byte of each
    chunk it wants verified (:func:`covering` says which)."""
    seed = key_seed(key)
    bad: set[int] = set()
    index, pos = -1, -1  # the chunk being summed and its next expected byte
    hasher: xxhash.xxh3_64 | None = None
    for off, view in pieces:
        while view.nbytes:
            chunk = off // CHUNK
            start, stop = chunk_span(size, chunk)
            if hasher is not None and (chunk != index or off != pos):
                bad.add(index)  # a gap inside the chunk being summed
                hasher = None
            if hasher is None and off != start:
                bad.add(chunk)  # starts mid-chunk: cannot be verified
                skip = min(view.nbytes, stop - off)
                off, view = off + skip, view[skip:]
                continue
            if hasher is None:
                index, pos, hasher = chunk, off, xxhash.xxh3_64(seed=chunk_seed(seed, chunk))
            take = min(view.nbytes, stop - off)
            hasher.update(view[:take])
            off, pos, view = off + take, pos + take, view[take:]
            if pos == stop:
                if chunk >= len(sums) or hasher.intdigest() != sums[chunk]:
                    bad.add(chunk)
                hasher = None
    if hasher is not None:
        bad.add(index)
    return sorted(bad)


def verify_whole(key: str, sums: Sequence[int], value: memoryview) -> list[int]:
    """Bad chunk indexes of a whole value (empty = it verifies)."""
    if len(sums) != chunk_count(value.nbytes):
        return list(range(max(1, chunk_count(value.nbytes))))
    return bad_chunks(key, value.nbytes, sums, [(0, value)])


def copy_verified(
    key: str, sums: Sequence[int], size: int, offset: int, dst: memoryview, src: memoryview
) -> list[int]:
    """Copy ``src`` (the value's bytes from ``offset``, chunk aligned at both ends or the
    value's end) into ``dst`` one chunk at a time, summing each chunk while it is still in the
    cache; returns the bad chunk indexes. The copy and the check are one pass over memory."""
    n = src.nbytes
    # A one-chunk value: copied, then summed in dst while it is in L2 (4 MiB here), which
    # measured faster than the C loop's 4 KiB pieces for values that fit.
    if offset == 0 and n == size <= CHUNK:
        part = dst[:n]
        part[:] = src
        return [] if whole_ok(key, part, sums) else [0]
    seed = key_seed(key)
    if (
        native.AVAILABLE
        and n >= NATIVE_MIN
        and offset % CHUNK == 0
        and (n % CHUNK == 0 or offset + n == size)
    ):
        first = offset // CHUNK
        indexes = range(first, first + chunk_count(n))
        seeds = chunk_seeds(key, first, len(indexes))
        # not streamed: the reader uses what it read; summed in dst as handed over
        got = native.copy_sum(dst[:n], src, CHUNK, seeds)
        return [i for i, g in zip(indexes, got, strict=True) if i >= len(sums) or g != sums[i]]
    bad: list[int] = []
    done = 0
    while done < n:
        index = (offset + done) // CHUNK
        start, stop = chunk_span(size, index)
        take = min(stop - (offset + done), n - done)
        part = dst[done : done + take]
        part[:] = src[done : done + take]
        if start != offset + done or take != stop - start:
            bad.append(index)  # a partial chunk cannot be verified on its own
        elif (
            index >= len(sums)
            or xxhash.xxh3_64_intdigest(part, seed=chunk_seed(seed, index)) != sums[index]
        ):
            bad.append(index)
        done += take
    return bad
