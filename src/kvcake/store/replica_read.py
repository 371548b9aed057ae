"""Reading one key's bytes from its replicas: the best readable one first, every chunk it
covers verified before success is reported, a corrupt replica reported and the next one
tried (docs/store.md, "Integrity"). The part of a store client's read path
(:class:`~kvcake.store.reads.ReadPath`) that the batch APIs fall back to, key by key."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial

from kvcake.core import native
from kvcake.core.buffers import uninitialized_bytearray
from kvcake.core.errors import KvcakeError
from kvcake.core.integrity import CHUNK, whole_ok
from kvcake.core.ranges import RangeTable
from kvcake.store import protocol as P
from kvcake.store.disk import read_remote
from kvcake.store.errors import (
    ChecksumMismatch,
    IntegrityError,
    LeaseExpired,
    TransferFailed,
)
from kvcake.store.filewriter import read_file_ranges
from kvcake.store.landing import RUN as LANDING_MIN
from kvcake.store.landing import fetch_landing
from kvcake.store.netreads import NetRead, fetch_direct
from kvcake.store.readguard import ReadGuard, commit_under
from kvcake.store.rpc import MasterConnection
from kvcake.store.verify import (
    chunk_bounds,
    copy_from_view,
    disjoint,
    fetch_verified,
    integrity_failed,
    report_bad,
    scatter,
    scatter_verified,
    spans,
)
from kvcake.transfer.engine import TransferEngine
from kvcake.transfer.types import Landed


class ReplicaReader:
    """Reads of one key from its replicas, for a store client (its :class:`ReadPath`'s
    ``replicas``). It gets the client's master connection (to report a corrupt replica), id,
    host, own segment views (the client's dict: mounts and unmounts show here) and Transfer
    Engine, and owns nothing but two counters (approximate under threads). Bytes reach a
    caller's buffer only under its guard's ``commit()``, when one is given."""

    def __init__(
        self,
        conn: MasterConnection,
        client_id: str,
        host: str,
        segments: dict[str, memoryview],
        engine: TransferEngine,
        verify: bool = True,
    ) -> None:
        self.conn, self.id, self.host = conn, client_id, host
        self.segments, self.engine = segments, engine
        self.verify_reads = verify  # client.verify: off only for the cost benchmark
        self.disk_reads = 0  # values read from a node's disk tier over its disk service
        self.file_reads = 0  # values read from the file tier (store/filewriter.py)

    def order(self, reps: list[P.ReplicaDesc]) -> list[P.ReplicaDesc]:
        if len(reps) == 1:
            return reps

        def rank(r: P.ReplicaDesc) -> int:
            if r.tier == "disk":
                return 3
            if r.tier == "file":  # last, as Mooncake reads its DISK replicas
                return 4
            return 0 if r.segment in self.segments else 1 if r.host == self.host else 2

        return sorted(reps, key=rank)

    def read(
        self, key: str, res: P.KeyResult, out: memoryview, t0: float, lease_s: float
    ) -> P.ReplicaDesc:
        """Read ``key`` from the best readable replica; returns the replica it was read from."""
        return self.read_ranges(key, res, [(0, out[: res.size])], t0, lease_s)

    def read_ranges(
        self,
        key: str,
        res: P.KeyResult,
        ranges: Sequence[tuple[int, memoryview]],
        t0: float,
        lease_s: float,
        guard: ReadGuard | None = None,
    ) -> P.ReplicaDesc:
        """Fill each ``(offset, out)`` with ``value[offset : offset + len(out)]`` from the best
        readable replica that verifies against the object's checksums (all ranges from one
        replica); returns that replica. A replica that fails is reported (the master drops
        it) and the next one tried; IntegrityError when none verifies. With ``guard``, bytes
        reach ``out`` only inside ``guard.commit()``, and only verified ones."""
        errors, corrupt = [], []
        # A whole small value into the caller's buffer (most gets): the unverified read's own
        # call, then one digest while the bytes are in L2 (docs/store.md, "Integrity").
        small = guard is None and len(ranges) == 1 and ranges[0][0] == 0
        small = small and ranges[0][1].nbytes == res.size < LANDING_MIN
        for rep in self.order(res.replicas):
            try:
                if not self.verify_reads:
                    self._read_unverified(key, res, rep, ranges, guard)
                elif small and rep.tier == "memory" and rep.segment not in self.segments:
                    out = ranges[0][1]
                    self._read_remote_memory(rep, 0, out)
                    if not whole_ok(key, out, res.sums):
                        raise ChecksumMismatch(f"{key!r}: its one chunk fails its checksum")
                else:
                    self._read_verified(key, res, rep, ranges, guard)
            except ChecksumMismatch as exc:
                integrity_failed(self._path_of(rep), key, rep.segment, rep.offset)
                report_bad(self.conn, self.id, key, rep.segment, rep.offset, res.sums)
                corrupt.append(f"{rep.segment}@{rep.offset}: {exc}")
                continue
            except KvcakeError as exc:
                errors.append(f"{rep.segment}: {exc}")
                continue
            if time.monotonic() - t0 > lease_s:
                raise LeaseExpired(f"{key!r}: read outlived its lease; bytes may be stale")
            return rep
        if corrupt:
            raise IntegrityError(f"{key!r}: no replica verifies ({'; '.join(corrupt + errors)})")
        raise TransferFailed(f"{key!r}: no replica readable ({'; '.join(errors)})")

    def _path_of(self, rep: P.ReplicaDesc) -> str:
        """The integrity counter's ``path`` label of a read from ``rep``."""
        if rep.tier != "memory":
            return rep.tier
        if rep.segment in self.segments:
            return "own"
        return (
            "shm" if rep.host == self.host and self.engine.reads_by_mapping(rep.segment) else "tcp"
        )

    def _read_verified(
        self,
        key: str,
        res: P.KeyResult,
        rep: P.ReplicaDesc,
        ranges: Sequence[tuple[int, memoryview]],
        guard: ReadGuard | None,
    ) -> None:
        """One replica: fetch every chunk the ranges touch, verify, then hand the bytes over
        (straight into the caller's buffer for a whole-value read without a guard)."""
        size = res.size
        if rep.tier == "file":  # a shared filesystem path: read and verify it here
            read_file_ranges(rep, key, size, ranges, guard, res.sums)
            self.file_reads += 1
            return
        whole = len(ranges) == 1 and ranges[0][0] == 0 and ranges[0][1].nbytes == size
        if whole and guard is None:
            self._fetch(key, res, rep, 0, ranges[0][1])
            return
        if rep.tier == "disk":  # the disk service sends whole values: one fetch, verified
            value = memoryview(uninitialized_bytearray(size))
            self._fetch(key, res, rep, 0, value)
            with commit_under(guard):
                scatter(ranges, 0, value)
            return
        mapped = rep.segment in self.segments or self.engine.reads_by_mapping(rep.segment)
        if mapped and native.AVAILABLE and disjoint(ranges):
            self._scatter_mapped(key, res, rep, ranges, guard)
            return
        # Without the native helper, a copy in this process's memory or a mapped peer's goes
        # chunk by chunk through one scratch buffer (fetched, verified while hot, handed over
        # under the guard before the next chunk); a network read takes each span of chunks in
        # one round trip.
        for lo, hi in spans(size, ranges):
            step = CHUNK if mapped else hi - lo
            scratch = memoryview(uninitialized_bytearray(min(step, hi - lo)))
            for start in range(lo, hi, step):
                buf = scratch[: min(step, hi - start)]
                self._fetch(key, res, rep, start, buf)
                with commit_under(guard):
                    scatter(ranges, start, buf)

    def _scatter_mapped(
        self,
        key: str,
        res: P.KeyResult,
        rep: P.ReplicaDesc,
        ranges: Sequence[tuple[int, memoryview]],
        guard: ReadGuard | None,
        verify: bool = True,
    ) -> None:
        """Memory this process maps (own segment, a same-host peer), straight into the ranges
        (:func:`~kvcake.store.verify.scatter_verified`); the peer's liveness checked after."""
        lo, hi = chunk_bounds(res.size, ranges)
        span, check = self.span_of(rep, lo, hi - lo)
        try:
            scatter_verified(key, res.sums if verify else None, res.size, lo, span, ranges, guard)
        finally:
            check()  # its owner died meanwhile: OwnerGone, not a checksum verdict

    def span_of(
        self, rep: P.ReplicaDesc, off: int, n: int
    ) -> tuple[memoryview, Callable[[], None]]:
        own = self.segments.get(rep.segment)
        if own is not None:
            return own[rep.offset + off : rep.offset + off + n], lambda: None
        mapped = self._mapped_span(rep, off, n)
        if mapped is None:
            raise TransferFailed(f"segment {rep.segment!r} is no longer mapped here")
        return mapped

    def _fetch(
        self, key: str, res: P.KeyResult, rep: P.ReplicaDesc, off: int, out: memoryview
    ) -> None:
        """Bytes ``[off, off + len(out))`` of the value (chunk aligned) from ``rep``, verified."""
        size, sums = res.size, res.sums
        if rep.tier == "disk":  # the disk service sends whole values
            whole = (
                out
                if off == 0 and out.nbytes == size
                else memoryview(uninitialized_bytearray(size))
            )
            read_remote(rep.endpoint, key, whole, self.engine.auth)
            self.disk_reads += 1
            fetch_verified(key, sums, size, 0, whole, lambda o, v: None)
            if whole is not out:
                out[:] = whole[off : off + out.nbytes]
            return
        own = self.segments.get(rep.segment)
        if own is not None:
            src = own[rep.offset + off : rep.offset + off + out.nbytes]
            copy_from_view(key, sums, size, off, out, src)
            return
        if out.nbytes < LANDING_MIN:  # as read_ranges' small path: the mapping's lookup
            # here would cost more than the sums of a small value
            fetch_verified(key, sums, size, off, out, partial(self._read_remote_memory, rep))
            return
        mapped = self._mapped_span(rep, off, out.nbytes)
        if mapped is not None:  # a same-host peer: one fused copy-and-sum out of its mapping
            span, check = mapped
            try:
                copy_from_view(key, sums, size, off, out, span)
            finally:
                check()  # its owner died meanwhile: OwnerGone, not a checksum verdict
            return
        if self._direct(key, res, rep, off, out):  # summed as it lands
            return
        fetch_landing(key, sums, size, off, out, partial(self._read_remote_memory, rep))

    def _mapped_span(
        self, rep: P.ReplicaDesc, off: int, n: int
    ) -> tuple[memoryview, Callable[[], None]] | None:
        """``rep``'s bytes ``[off, off + n)`` as a view of this process's mapping of a same-host
        peer (None: not mapped here), looked up once per read however the value is cut."""
        try:
            return self.engine.mapped_span(rep.segment, rep.offset + off, n)
        except KvcakeError:  # maybe a dead predecessor's location (see _read_remote_memory)
            self.engine.registry.forget(rep.segment)
            return self.engine.mapped_span(rep.segment, rep.offset + off, n)

    def _read_unverified(
        self,
        key: str,
        res: P.KeyResult,
        rep: P.ReplicaDesc,
        ranges: Sequence[tuple[int, memoryview]],
        guard: ReadGuard | None,
    ) -> None:
        """``client.verify = False`` (the cost benchmark only): the reads without checksums."""
        own = self.segments.get(rep.segment)
        if rep.tier == "file":
            read_file_ranges(rep, key, res.size, ranges, guard, None)
            self.file_reads += 1
        elif own is not None:
            with commit_under(guard):
                for off, out in ranges:  # split like the verified copy (core/native/halves.py)
                    native.copy(out, own[rep.offset + off : rep.offset + off + out.nbytes], False)
        elif guard is None and len(ranges) == 1 and rep.tier != "disk":
            off, out = ranges[0]
            if out.nbytes < LANDING_MIN or not self._direct(key, res, rep, off, out):
                self._read_remote_memory(rep, off, out)
        elif rep.tier != "disk" and self.engine.reads_by_mapping(rep.segment):
            if native.AVAILABLE and disjoint(ranges):  # the verified read's C copy, no sums
                self._scatter_mapped(key, res, rep, ranges, guard, verify=False)
                return
            with commit_under(guard):
                for off, out in ranges:
                    self._read_remote_memory(rep, off, out)
        else:
            self._read_bounced(key, rep, res.size, ranges, guard)

    def _read_bounced(
        self,
        key: str,
        rep: P.ReplicaDesc,
        size: int,
        ranges: Sequence[tuple[int, memoryview]],
        guard: ReadGuard | None,
    ) -> None:
        """A network read without verification: into a private buffer first, so a read that
        outlives a cancel lands nowhere, then the ranges are copied out under the guard."""
        lo = 0 if rep.tier == "disk" else min(off for off, _ in ranges)
        hi = size if rep.tier == "disk" else max(off + out.nbytes for off, out in ranges)
        buf = memoryview(uninitialized_bytearray(hi - lo))
        if rep.tier == "disk":  # the disk service sends whole values
            read_remote(rep.endpoint, key, buf, self.engine.auth)
            self.disk_reads += 1
        else:
            self._read_remote_memory(rep, lo, buf)
        with commit_under(guard):
            for off, out in ranges:
                out[:] = buf[off - lo : off - lo + out.nbytes]

    def _read_remote_memory(
        self, rep: P.ReplicaDesc, off: int, out: memoryview, landed: Landed | None = None
    ) -> None:
        try:
            self.engine.read_into(rep.segment, rep.offset + off, out, landed)
        except KvcakeError:
            # The cached location may name a dead predecessor of a node restarted under the
            # same segment name: look it up afresh and try once more.
            self.engine.registry.forget(rep.segment)
            self.engine.read_into(rep.segment, rep.offset + off, out, landed)

    def span_read(
        self, key: str, res: P.KeyResult, rep: P.ReplicaDesc, off: int, out: memoryview
    ) -> NetRead:
        """Bytes ``[off, off + len(out))`` of ``rep`` into ``out`` as a network read,
        verified when this client verifies."""
        sums = res.sums if self.verify_reads else None
        table = RangeTable.of_pairs([(off, out)])
        return NetRead(key, sums, res.size, off, off + out.nbytes, rep.segment, rep.offset, table)

    def _direct(
        self, key: str, res: P.KeyResult, rep: P.ReplicaDesc, off: int, out: memoryview
    ) -> bool:
        """:meth:`_get_direct` for one read (``get``, ``get_into``). False: not done that way
        (a replica this process maps, a failed transfer, a mismatch): the caller's own path
        reads it again, and tells a corrupt replica from a failed read."""
        if rep.tier != "memory" or self.engine.reads_by_mapping(rep.segment):
            return False
        got = fetch_direct(self.engine, [self.span_read(key, res, rep, off, out)])
        return isinstance(got[0], int)
