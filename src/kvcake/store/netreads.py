"""A ranges read's network keys in one go (issue 37's TCP loads).

Read one key at a time, a load of N blocks from a remote node waits N round trips, each with
the link idle while the request crosses it. Two ways, both batched:

* **direct** -- a key whose ranges tile its chunk-aligned span (a vLLM block: every plane's
  slice of it) is asked for whole and received straight into the ranges, each chunk
  summed as it lands (``TransferEngine.read_scatter``, :mod:`kvcake.transfer.scatter`): each
  byte crosses memory once. The bytes land before they are verified; a key that fails is
  read again by the per-key path, so the caller sees success only for verified bytes. The
  guard admits the bytes (none lands once ``ReadGuard.cancel`` returned).
* **scratch** -- any other key: its span goes into one ``TransferEngine.read_many`` batch, into
  a private scratch buffer summed as it lands (:mod:`.landing`), then each key is verified and
  handed over under the guard: no byte reaches the caller's buffer before its chunks verify.

A key whose transfer fails or whose sums do not match is left to the per-key path (``None``),
which looks the replica up afresh, reports a corrupt one and tries the next.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from kvcake.core import integrity, native
from kvcake.core.buffers import uninitialized_bytearray
from kvcake.core.errors import KvcakeError
from kvcake.core.ranges import RangeTable
from kvcake.store.errors import TransferFailed
from kvcake.store.landing import LandingSums
from kvcake.store.readguard import ReadGuard, commit_under
from kvcake.store.verify import scatter
from kvcake.transfer.engine import TransferEngine
from kvcake.transfer.errors import TransferError
from kvcake.transfer.scatter import Cancelled, ScatterRead

GROUP_BYTES = 64 << 20  # scratch held at once: a larger load goes in several batches


class Scratch:
    """One client's reusable scratch for batched network reads (at most ``GROUP_BYTES``):
    a fresh multi-MB buffer per load costs its page faults and the kernel's zeroing, which
    measured slower than the transfer itself. A second reader at the same time (the lock is
    taken) gets fresh memory instead of waiting."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._buf = bytearray()

    def view(self, n: int) -> memoryview:
        """``n`` bytes of the buffer (call with :attr:`lock` held)."""
        if len(self._buf) < n:
            self._buf = uninitialized_bytearray(n)
        return memoryview(self._buf)[:n]


@dataclass(frozen=True, slots=True)
class NetRead:
    """One key's ``[lo, hi)`` (chunk aligned, covering its ranges) from a remote replica at
    ``segment[offset:]``; ``sums`` None: not verified (``client.verify`` off)."""

    key: str
    sums: Sequence[int] | None
    size: int
    lo: int
    hi: int
    segment: str
    offset: int
    ranges: RangeTable


Outcome = int | TransferFailed | None


def fetch_many(
    engine: TransferEngine, reads: Sequence[NetRead], guard: ReadGuard | None, scratch: Scratch
) -> list[Outcome]:
    """Per read: the bytes handed over, TransferFailed (the guard was cancelled), or None (its
    transfer failed or its sums did not match: the caller reads that key alone). Reads whose
    ranges tile their span land straight in them (:func:`_fetch_direct`); the rest, and any
    the direct way refuses, through scratch."""
    out: list[Outcome] = [None] * len(reads)
    rest = list(range(len(reads)))
    if native.AVAILABLE:
        rest = _fetch_direct(engine, reads, guard, out)
    scratched = _fetch_scratch(engine, [reads[i] for i in rest], guard, scratch)
    for i, got in zip(rest, scratched, strict=True):
        out[i] = got
    return out


def fetch_direct(engine: TransferEngine, reads: Sequence[NetRead]) -> list[Outcome]:
    """:func:`_fetch_direct` alone, without a guard (whole values into fresh or caller
    buffers: ``get``, ``batch_get``); None for a read not done that way (not TCP, a layout it
    refuses, a failed transfer, a mismatch): the caller reads it the other way, which also
    tells a corrupt replica from a failed transfer."""
    out: list[Outcome] = [None] * len(reads)
    if native.AVAILABLE:
        _fetch_direct(engine, reads, None, out)
    return out


def _fetch_direct(
    engine: TransferEngine, reads: Sequence[NetRead], guard: ReadGuard | None, out: list[Outcome]
) -> list[int]:
    """Per segment, the reads whose ranges cover their chunk-aligned span exactly, received
    straight into those ranges and summed as they land (``TransferEngine.read_scatter``: no
    scratch, each byte crosses memory once). Verification comes after the bytes landed, so a
    read that fails it leaves its ranges holding unverified bytes: its outcome is None and the
    per-key path reads it again (or fails it); the caller never sees success for them. Returns
    the indexes left to the scratch path."""
    by_segment: dict[str, list[int]] = {}
    rest: list[int] = []
    for i, r in enumerate(reads):
        fits = r.ranges.tiled and r.ranges.start == r.lo and r.ranges.end == r.hi > r.lo
        (by_segment.setdefault(r.segment, []) if fits else rest).append(i)
    for segment, idx in by_segment.items():
        todo = [_scatter_read(reads[i]) for i in idx]
        got: Sequence[list[int] | TransferError | TransferFailed] | None
        try:
            got = engine.read_scatter(segment, todo, guard, integrity.CHUNK)
        except Cancelled:
            got = [TransferFailed("read cancelled")] * len(idx)
        except KvcakeError:  # e.g. a segment gone from the directory: the keys go the other way
            got = None
        if got is None:
            rest += idx
            continue
        for i, g in zip(idx, got, strict=True):
            out[i] = _settle(reads[i], g)
    return sorted(rest)


def _scatter_read(r: NetRead) -> ScatterRead:
    first = r.lo // integrity.CHUNK
    seeds = None
    if r.sums is not None:
        seeds = integrity.chunk_seeds(r.key, first, integrity.chunk_count(r.hi - r.lo))
    return ScatterRead(r.offset, r.ranges, seeds)


def _settle(r: NetRead, got: list[int] | TransferError | TransferFailed) -> Outcome:
    if isinstance(got, TransferFailed):
        return got
    if isinstance(got, TransferError):
        return None
    if r.sums is not None:
        first = r.lo // integrity.CHUNK
        if len(r.sums) != integrity.chunk_count(r.size) or got != list(
            r.sums[first : first + len(got)]
        ):
            return None
    return r.ranges.nbytes


def _fetch_scratch(
    engine: TransferEngine, reads: Sequence[NetRead], guard: ReadGuard | None, scratch: Scratch
) -> list[Outcome]:
    out: list[Outcome] = []
    group: list[NetRead] = []
    size = 0
    for r in reads:
        if group and size + (r.hi - r.lo) > GROUP_BYTES:
            out += _fetch_group(engine, group, guard, scratch)
            group, size = [], 0
        group.append(r)
        size += r.hi - r.lo
    if group:
        out += _fetch_group(engine, group, guard, scratch)
    return out


def _fetch_group(
    engine: TransferEngine, reads: Sequence[NetRead], guard: ReadGuard | None, arena: Scratch
) -> list[Outcome]:
    total = sum(r.hi - r.lo for r in reads)
    if not arena.lock.acquire(blocking=False):
        return _fetch_into(engine, reads, guard, memoryview(uninitialized_bytearray(total)))
    try:
        return _fetch_into(engine, reads, guard, arena.view(total))
    finally:
        arena.lock.release()


def _fetch_into(
    engine: TransferEngine, reads: Sequence[NetRead], guard: ReadGuard | None, buf: memoryview
) -> list[Outcome]:
    scratch, at = [], 0
    for r in reads:
        scratch.append(buf[at : at + r.hi - r.lo])
        at += r.hi - r.lo
    sums = [
        LandingSums(r.key, r.lo, s) if r.sums is not None else None
        for r, s in zip(reads, scratch, strict=True)
    ]
    result = engine.read_many(
        [
            (r.segment, r.offset + r.lo, s, ls.landed if ls is not None else None)
            for r, s, ls in zip(reads, scratch, sums, strict=True)
        ]
    )
    good = [
        j
        for j, (r, ls, res) in enumerate(zip(reads, sums, result.results, strict=True))
        if res.ok and (ls is None or _verifies(r, ls))
    ]
    out: list[Outcome] = [None] * len(reads)  # None: the caller reads that key alone
    fast = [j for j in good if native.AVAILABLE and reads[j].ranges.disjoint]
    handed = _hand_over_native([reads[j] for j in fast], [scratch[j] for j in fast], guard)
    if handed is None:  # C refused a layout: every key the Python way (copies are idempotent)
        fast = []
    for j, got in zip(fast, handed or [], strict=False):
        out[j] = got
    for j in sorted(set(good) - set(fast)):
        r = reads[j]
        try:
            with commit_under(guard):
                scatter(r.ranges.views(), r.lo, scratch[j])
        except TransferFailed as exc:  # cancelled: nothing of it reached the caller
            out[j] = exc
            continue
        out[j] = r.ranges.nbytes
    return out


def _hand_over_native(
    reads: Sequence[NetRead], scratch: Sequence[memoryview], guard: ReadGuard | None
) -> list[Outcome] | None:
    """Verified keys from their scratch into their ranges in ONE C call (a load's 1,680
    ranges cost one call, not one Python slice copy each); the guard's stop flag ends it
    between chunks, and keys it did not reach fail as cancelled. None: C refused a layout."""
    if not reads:
        return []
    values: list[tuple[memoryview, native.Ranges, list[int]]] = [
        (s, r.ranges, _no_seeds(s)) for r, s in zip(reads, scratch, strict=True)
    ]
    shift = [r.lo for r in reads]
    try:
        with commit_under(guard):
            stop = guard.stop if guard is not None else None
            done, _ = native.scatter_sum_many(
                values, integrity.CHUNK, stop, summed=False, shift=shift
            )
    except TransferFailed:  # cancelled before it began
        done = 0
    except ValueError:
        return None
    return [
        r.ranges.nbytes if k < done else TransferFailed(f"{r.key!r}: cancelled")
        for k, r in enumerate(reads)
    ]


def _no_seeds(span: memoryview) -> list[int]:
    """Seeds for a copy-only call (unused; the call checks their count)."""
    return [0] * integrity.chunk_count(span.nbytes)


def _verifies(r: NetRead, landing: LandingSums) -> bool:
    assert r.sums is not None
    return len(r.sums) == integrity.chunk_count(r.size) and not landing.bad(r.sums)
