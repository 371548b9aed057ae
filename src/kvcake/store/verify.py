"""Checking bytes against an object's checksums on the store's read and copy paths, and what a
failure does: a counter by path, a log line naming the key and the replica, and a report to the
master that drops exactly that replica (``ReplicaBad``). The checksum itself is defined once,
in :mod:`kvcake.core.integrity`.

Fetching for verification: a chunk is the unit of verification, so a read that covers part of
a chunk fetches the whole chunk (into a scratch buffer) and verifies it before any byte of it
is handed over. Copies out of memory this process maps (its own segments, a same-host peer's
mapping) are verified chunk by chunk while the chunk is still in the cache (``copy_verified``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

import xxhash
from prometheus_client import Counter

from kvcake.core import integrity, native
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.core.ranges import RangeTable
from kvcake.store import protocol as P
from kvcake.store.errors import ChecksumMismatch, TransferFailed
from kvcake.store.readguard import ReadGuard, commit_under

log = logging.getLogger(__name__)

# Paths: own (this process's segment), shm (a same-host peer's mapping), tcp (a remote peer),
# disk (a node's SSD tier), file (the shared file tier), offload (a node's memory copy
# offloaded to disk). Registered in the process's default registry; a storage node also
# exposes it on its own /metrics.
FAILURES = Counter(
    "kvcake_store_integrity_failures",
    "replica reads and tier copies whose bytes failed the object's checksums",
    ["path"],
)

ReadFn = Callable[[int, memoryview], None]  # (offset in the value, out) -> fill out
PIECE = 256 * 1024  # without kvcake.core.native, a put is summed in pieces this big, while hot


def integrity_failed(path: str, key: str, segment: str, offset: int) -> None:
    FAILURES.labels(path).inc()
    log.warning(
        "integrity: %r failed its checksums on replica %s@%d (path %s)", key, segment, offset, path
    )


def report_bad(
    conn: object, client: str, key: str, segment: str, offset: int, sums: Sequence[int]
) -> None:
    """Ask the master to drop that one replica (best effort: a reader that cannot reach it
    still refuses the bytes; the next reader reports again)."""
    with contextlib.suppress(StoreError):
        conn.call(P.ReplicaBad(client, key, segment, offset, list(sums)))  # type: ignore[attr-defined]


def spans(size: int, ranges: Sequence[tuple[int, memoryview]]) -> list[tuple[int, int]]:
    """The chunk-aligned ``[start, end)`` spans of the value that cover ``ranges``, merged."""
    out: list[tuple[int, int]] = []
    for off, view in sorted(ranges, key=lambda r: r[0]):
        idx = integrity.covering(size, off, view.nbytes)
        if not idx:
            continue
        start = integrity.chunk_span(size, idx[0])[0]
        end = integrity.chunk_span(size, idx[-1])[1]
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def scatter(ranges: Sequence[tuple[int, memoryview]], at: int, buf: memoryview) -> None:
    """Copy the value's bytes ``[at, at + len(buf))``, held in ``buf``, into the parts of
    ``ranges`` (``(offset in the value, out)``) they overlap."""
    end = at + buf.nbytes
    for off, out in ranges:
        a, b = max(off, at), min(off + out.nbytes, end)
        if a < b:
            out[a - off : b - off] = buf[a - at : b - at]


def fetch_verified(
    key: str, sums: Sequence[int], size: int, off: int, out: memoryview, read: ReadFn
) -> None:
    """Fill ``out`` with the value's bytes from ``off`` (chunk aligned at both ends or the
    value's end) through one ``read`` (a network or disk read), then verify them.
    ChecksumMismatch names the bad chunks. Memory this process maps is read with
    :func:`copy_from_view` instead, which sums while it copies."""
    read(off, out)
    if out.nbytes == size <= integrity.CHUNK:  # a one-chunk value (the small-value hot path)
        if integrity.whole_ok(key, out, sums):
            return
        bad = [0]
    else:
        bad = _bad_aligned(integrity.key_seed(key), sums, off, out)
    if bad or len(sums) != integrity.chunk_count(size):
        raise ChecksumMismatch(f"{key!r}: chunks {bad[:4] or 'all'} fail their checksums")


def write_summing(key: str, value: memoryview, dst: memoryview) -> list[int]:
    """Copy ``value`` into ``dst`` (memory this process maps: its own segment, a same-host
    peer's) and return its checksums (core/integrity.py), each piece summed right after its
    copy, while it is in the cache: a put's one computation of its sums, fused with its copy."""
    n = value.nbytes
    if n <= integrity.CHUNK:  # one chunk: streamed, then summed while the copy left it in L2
        native.copy(dst[:n], value)
        return integrity.checksums(key, value)
    if native.AVAILABLE:
        seeds = integrity.chunk_seeds(key, 0, integrity.chunk_count(n))
        return native.copy_sum(dst[:n], value, integrity.CHUNK, seeds, native.STREAM)
    seed = integrity.key_seed(key)
    sums = []
    for start in range(0, n, integrity.CHUNK):
        hasher = xxhash.xxh3_64(seed=integrity.chunk_seed(seed, start // integrity.CHUNK))
        end = min(start + integrity.CHUNK, n)
        for at in range(start, end, PIECE):
            piece = dst[at : min(at + PIECE, end)]
            piece[:] = value[at : min(at + PIECE, end)]
            hasher.update(piece)
        sums.append(hasher.intdigest())
    return sums


def _bad_aligned(seed: int, sums: Sequence[int], off: int, view: memoryview) -> list[int]:
    """Bad chunk indexes of ``view``, the value's whole chunks from ``off`` (chunk aligned; the
    last one may end at the value's end): one digest call per chunk, no streaming state."""
    bad = []
    for done in range(0, view.nbytes, integrity.CHUNK):
        index = (off + done) // integrity.CHUNK
        part = view[done : done + integrity.CHUNK]
        digest = xxhash.xxh3_64_intdigest(part, seed=integrity.chunk_seed(seed, index))
        if index >= len(sums) or digest != sums[index]:
            bad.append(index)
    return bad


def copy_from_view(
    key: str, sums: Sequence[int], size: int, off: int, out: memoryview, src: memoryview
) -> None:
    """:func:`fetch_verified` from memory this process holds: copy and sum in one pass."""
    bad = integrity.copy_verified(key, sums, size, off, out, src)
    if bad or len(sums) != integrity.chunk_count(size):
        raise ChecksumMismatch(f"{key!r}: chunks {bad[:4] or 'all'} fail their checksums")


def disjoint(ranges: Sequence[tuple[int, memoryview]]) -> bool:
    """No two ranges ask for the same byte of the value (the native scatter sums each byte
    once, in the one buffer it lands in)."""
    end = -1
    for off, out in sorted(ranges, key=lambda r: r[0]):
        if off < end:
            return False
        end = max(end, off + out.nbytes)
    return True


def chunk_bounds(
    size: int, ranges: Sequence[tuple[int, memoryview]] | RangeTable
) -> tuple[int, int]:
    """``[lo, hi)``: from the first chunk any range touches to the end of the last."""
    if isinstance(ranges, RangeTable):
        start, end = ranges.start, ranges.end
    else:
        start = min(off for off, out in ranges if out.nbytes)
        end = max(off + out.nbytes for off, out in ranges)
    lo = start // integrity.CHUNK * integrity.CHUNK
    return lo, min(size, -(-end // integrity.CHUNK) * integrity.CHUNK)


def scatter_verified(
    key: str,
    sums: Sequence[int] | None,
    size: int,
    lo: int,
    span: memoryview,
    ranges: Sequence[tuple[int, memoryview]],
    guard: ReadGuard | None,
) -> None:
    """Copy the value's bytes ``[lo, lo + len(span))``, held in ``span`` (memory this process
    maps), straight into ``ranges`` (value offsets, disjoint) in one C call
    (``core.native.scatter_sum_many``) under the guard, whose stop flag ends it between chunks;
    then check each chunk's sum *as handed over* (a chunk no range touches is summed in
    ``span``). A mismatch raises ChecksumMismatch: this key fails, its buffers' contents are
    then undefined (as after any failed read) and the next replica rewrites them. ``sums``
    None: copy only (``client.verify`` off). A cancel raises TransferFailed."""
    first = lo // integrity.CHUNK
    seeds = integrity.chunk_seeds(key, first, integrity.chunk_count(span.nbytes))
    moved = sorted(((off - lo, out) for off, out in ranges), key=lambda r: r[0])
    with commit_under(guard):
        stop = guard.stop if guard is not None else None
        done, got = native.scatter_sum_many(
            [(span, moved, seeds)], integrity.CHUNK, stop, sums is not None
        )
    if not done:
        raise TransferFailed(f"{key!r}: read cancelled")
    if sums is None:
        return
    bad = [
        first + i for i, g in enumerate(got[0]) if first + i >= len(sums) or g != sums[first + i]
    ]
    if bad or len(sums) != integrity.chunk_count(size):
        raise ChecksumMismatch(f"{key!r}: chunks {bad[:4] or 'all'} fail their checksums")


class MappedRead(NamedTuple):
    """One value of a batched same-host range read: its bytes ``[lo, lo + len(span))`` in
    ``span`` (this process's mapping), ``check`` to call after copying out of it (raises when
    the owner died), and its ranges (value offsets, sorted, disjoint)."""

    key: str
    sums: Sequence[int]
    size: int
    lo: int
    span: memoryview
    check: Callable[[], None]
    ranges: RangeTable


def scatter_verified_many(
    reads: Sequence[MappedRead], guard: ReadGuard | None, verify: bool = True
) -> list[int | StoreError | None]:
    """:func:`scatter_verified` for a whole batch in one C call under the guard (one load's
    blocks: the per-value Python is what a load spends its time on). Per read: the bytes handed
    over; TransferFailed when a cancel stopped it; None when it must go the per-key way (a
    checksum mismatch -- the per-key read reports the replica and tries the next --, or the
    owner died)."""
    values: list[tuple[memoryview, native.Ranges, list[int]]] = []
    for r in reads:
        count = integrity.chunk_count(r.span.nbytes)
        seeds = integrity.chunk_seeds(r.key, r.lo // integrity.CHUNK, count)
        values.append((r.span, r.ranges, seeds))
    shift = [r.lo for r in reads]
    try:
        with commit_under(guard):
            stop = guard.stop if guard is not None else None
            done, sums = native.scatter_sum_many(values, integrity.CHUNK, stop, verify, shift=shift)
    except TransferFailed:
        done, sums = 0, []
    out: list[int | StoreError | None] = []
    for j, r in enumerate(reads):
        try:
            r.check()
        except KvcakeError:  # the owner died: the per-key path says so
            out.append(None)
            continue
        if j >= done:
            out.append(TransferFailed(f"{r.key!r}: read cancelled"))
            continue
        first = r.lo // integrity.CHUNK
        good = not verify or (
            len(r.sums) == integrity.chunk_count(r.size)
            and r.sums[first : first + len(sums[j])] == sums[j]
        )
        out.append(r.ranges.nbytes if good else None)
    return out
