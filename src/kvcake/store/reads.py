"""The store client's read path (a mixin of :class:`~kvcake.store.client.Client`): replica
choice, leases, staged batch reads, ``get_into`` straight into caller buffers."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from kvcake.core import native
from kvcake.core.buffers import uninitialized_bytearray
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.core.integrity import CHUNK, checksums
from kvcake.core.ranges import RangeError, RangeTable
from kvcake.store import protocol as P
from kvcake.store.disk import read_remote
from kvcake.store.errors import (
    ChecksumMismatch,
    IntegrityError,
    InternalError,
    InvalidParams,
    LeaseExpired,
    TransferFailed,
    error_for,
)
from kvcake.store.filewriter import read_file_ranges
from kvcake.store.landing import RUN as LANDING_MIN
from kvcake.store.landing import fetch_landing
from kvcake.store.netreads import NetRead, Scratch, fetch_direct, fetch_many
from kvcake.store.readguard import ReadGuard, commit_under
from kvcake.store.rpc import MasterConnection
from kvcake.store.staging import Staging
from kvcake.store.verify import (
    MappedRead,
    chunk_bounds,
    copy_from_view,
    disjoint,
    fetch_verified,
    integrity_failed,
    report_bad,
    scatter,
    scatter_verified,
    scatter_verified_many,
    spans,
)
from kvcake.transfer.engine import TransferEngine
from kvcake.transfer.segments import BufferLike
from kvcake.transfer.types import Landed


def byte_view(value: Any) -> memoryview:
    """A 1-D unsigned-byte view of any C-contiguous buffer (no copy)."""
    if type(value) is memoryview and value.format == "B" and value.ndim == 1 and value.c_contiguous:
        return value  # already one (vLLM's KV rows, PagedKV.ranges): the common, hot case
    if hasattr(value, "numpy") and hasattr(value, "is_contiguous"):  # torch tensor
        if not value.is_contiguous():
            raise InvalidParams("tensor must be contiguous")
        value = value.detach().cpu().numpy()
    try:
        view = memoryview(value)
    except TypeError as exc:
        raise InvalidParams(f"{type(value).__name__} does not support the buffer protocol") from exc
    if not view.c_contiguous:
        raise InvalidParams("buffer must be C-contiguous")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _table(ranges: Sequence[tuple[int, BufferLike]] | RangeTable) -> RangeTable | str:
    """One key's ranges as a table (as given, or built from its pairs), or why not."""
    if isinstance(ranges, RangeTable):
        return ranges
    try:
        return RangeTable.of_pairs([(off, byte_view(b)) for off, b in ranges])
    except RangeError as exc:
        return str(exc)


class ReadPath:
    """A store client's read path, owned by its :class:`~kvcake.store.client.Client` (whose
    read methods are this part's). It gets the client's master connection, id, host, own
    segment views (the client's dict: mounts and unmounts show here), Transfer Engine, staging
    buffer and network scratch, and owns nothing else but two counters. Thread safe as the
    client is: no state of its own changes on a read but the counters (approximate under
    threads) and the staging buffer's and scratch's locks, which it takes without waiting."""

    def __init__(
        self,
        conn: MasterConnection,
        client_id: str,
        host: str,
        segments: dict[str, memoryview],
        engine: TransferEngine,
        staging: Staging,
        net_scratch: Scratch,
        verify: bool = True,
    ) -> None:
        self.conn, self.id, self.host = conn, client_id, host
        self.segments, self.engine, self.staging = segments, engine, staging
        self.net_scratch = net_scratch
        self.verify_reads = verify  # client.verify: off only for the cost benchmark
        self.disk_reads = 0  # values read from a node's disk tier over its disk service
        self.file_reads = 0  # values read from the file tier (store/filewriter.py)

    # --- reads ---------------------------------------------------------------------------------

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
        for rep in self.order(res.replicas):
            try:
                if self.verify_reads:
                    self._read_verified(key, res, rep, ranges, guard)
                else:
                    self._read_unverified(key, res, rep, ranges, guard)
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
        span, check = self._span_of(rep, lo, hi - lo)
        try:
            scatter_verified(key, res.sums if verify else None, res.size, lo, span, ranges, guard)
        finally:
            check()  # its owner died meanwhile: OwnerGone, not a checksum verdict

    def _span_of(
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
        mapped = self._mapped_span(rep, off, out.nbytes)
        if mapped is not None:  # a same-host peer: one fused copy-and-sum out of its mapping
            span, check = mapped
            try:
                copy_from_view(key, sums, size, off, out, span)
            finally:
                check()  # its owner died meanwhile: OwnerGone, not a checksum verdict
            return
        if out.nbytes >= LANDING_MIN:  # summed as it arrives, while in the cache
            if self._direct(key, res, rep, off, out):
                return
            fetch_landing(key, sums, size, off, out, partial(self._read_remote_memory, rep))
            return
        read = lambda o, v: self._read_remote_memory(rep, o, v)  # noqa: E731
        fetch_verified(key, sums, size, off, out, read)

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
                for off, out in ranges:
                    out[:] = own[rep.offset + off : rep.offset + off + out.nbytes]
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

    def lookup(self, keys: Sequence[str]) -> tuple[P.Reply, float, float]:
        t0 = time.monotonic()
        reply = self.conn.call(P.GetReplicas(self.id, list(keys)))
        return reply, t0, reply.lease_ms / 1000

    def get(self, key: str) -> bytearray:
        """The value of ``key`` (a new bytearray: one copy, no second copy into ``bytes``);
        raises ObjectNotFound on a miss."""
        # batch_get([key]) without its batch bookkeeping (a single value never goes staged).
        reply, t0, lease_s = self.lookup((key,))
        res = reply.results[0]
        if res.code != 0:
            raise error_for(res.code, f"{key!r}: {res.message}")
        got = self._get_one(key, res, t0, lease_s)
        if isinstance(got, StoreError):
            raise got
        return got

    def batch_get(
        self, keys: Sequence[str], sums: list[list[int]] | None = None
    ) -> list[bytearray | StoreError]:
        """``sums`` (a list, filled in): each key's checksums as the master holds them, [] for
        a miss (a relay hands them on, so its reader can check the last hop; see compat)."""
        reply, t0, lease_s = self.lookup(keys)
        if sums is not None:
            sums.extend(list(r.sums) if r.code == 0 else [] for r in reply.results)
        out: list[bytearray | StoreError | None] = []
        fast: list[tuple[int, P.ReplicaDesc]] = []  # (index, remote memory replica)
        for i, (key, res) in enumerate(zip(keys, reply.results, strict=True)):
            best = self.order(res.replicas)[0] if res.code == 0 else None
            if res.code != 0:
                out.append(error_for(res.code, f"{key!r}: {res.message}"))
            elif best is not None and self._stages(best):
                out.append(None)
                fast.append((i, best))
            else:
                out.append(self._get_one(key, res, t0, lease_s))
        if fast:
            self._get_staged(keys, reply.results, fast, out, t0, lease_s)
        return [o if o is not None else InternalError("unreachable") for o in out]

    def _stages(self, rep: P.ReplicaDesc) -> bool:
        """A batch reads ``rep`` through the staging buffer (one engine batch for the network
        reads); a copy this process maps (own, same-host peer) is read straight out instead."""
        return (
            rep.tier == "memory"
            and rep.segment not in self.segments
            and not self.engine.reads_by_mapping(rep.segment)
        )

    def _get_staged(
        self,
        keys: Sequence[str],
        results: list[P.KeyResult],
        fast: list[tuple[int, P.ReplicaDesc]],
        out: list[bytearray | StoreError | None],
        t0: float,
        lease_s: float,
    ) -> None:
        """Several remote values in one go: large ones received straight into fresh buffers
        (:meth:`_get_direct`), the rest through one engine batch into the staging buffer;
        a value either way fails is read again alone (which reports a corrupt replica)."""
        big = [j for j, (i, _) in enumerate(fast) if results[i].size >= LANDING_MIN]
        got: dict[int, bytearray] = self._get_direct(keys, results, fast, big) if big else {}
        small = [j for j in range(len(fast)) if j not in set(big)]
        sub = [fast[j] for j in small]
        sizes = [results[i].size for i, _ in sub]
        if sub and self.staging.fits(sizes) and self.staging.lock.acquire(blocking=False):
            try:
                staged = self.staging.read(
                    [(n, r.segment, r.offset) for n, (_, r) in zip(sizes, sub, strict=True)],
                    self._staged_taker(keys, results, sub),
                )
            finally:
                self.staging.lock.release()
            got.update(
                (j, v) for j, v in zip(small, staged, strict=True) if isinstance(v, bytearray)
            )
        expired = time.monotonic() - t0 > lease_s
        for j, (i, _) in enumerate(fast):
            value = got.get(j)
            if value is not None and not expired:
                out[i] = value
            elif value is not None:
                out[i] = LeaseExpired(f"{keys[i]!r}: read outlived its lease")
            else:
                out[i] = self._get_one(keys[i], results[i], t0, lease_s)

    def _get_direct(
        self,
        keys: Sequence[str],
        results: list[P.KeyResult],
        fast: list[tuple[int, P.ReplicaDesc]],
        which: list[int],
    ) -> dict[int, bytearray]:
        """``fast[j]`` for each j of ``which``, each value whole into a fresh buffer, in one
        scattered TCP read (netreads.fetch_direct: no staging copy, summed as it lands); the
        ones done (and verified, when this client verifies)."""
        bufs = {j: uninitialized_bytearray(results[fast[j][0]].size) for j in which}
        reads = [
            self._span_read(
                keys[fast[j][0]], results[fast[j][0]], fast[j][1], 0, memoryview(bufs[j])
            )
            for j in which
        ]
        got = fetch_direct(self.engine, reads)
        return {j: bufs[j] for j, g in zip(which, got, strict=True) if isinstance(g, int)}

    def _span_read(
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
        got = fetch_direct(self.engine, [self._span_read(key, res, rep, off, out)])
        return isinstance(got[0], int)

    def _staged_taker(
        self, keys: Sequence[str], results: list[P.KeyResult], fast: list[tuple[int, P.ReplicaDesc]]
    ) -> Callable[[int, memoryview], bytearray | Exception] | None:
        """Copies item ``j`` out of the staging buffer, verifying it on the way (a failure is
        retried by :meth:`_get_one`, which reports the replica)."""
        if not self.verify_reads:
            return None

        def take(j: int, view: memoryview) -> bytearray | Exception:
            i = fast[j][0]
            if view.nbytes <= CHUNK:  # one chunk: the plain path's copy, summed while hot
                out = bytearray(view)  # (1-2 us a 64 KB value less than the C loop's call)
                if checksums(keys[i], out) == list(results[i].sums):
                    return out
                return ChecksumMismatch(f"{keys[i]!r}: its one chunk fails its checksum")
            out = uninitialized_bytearray(view.nbytes)
            try:
                copy_from_view(keys[i], results[i].sums, view.nbytes, 0, memoryview(out), view)
            except ChecksumMismatch as exc:
                return exc
            return out

        return take

    def _get_one(
        self, key: str, res: P.KeyResult, t0: float, lease_s: float
    ) -> bytearray | StoreError:
        buf = uninitialized_bytearray(res.size)
        try:
            self.read(key, res, memoryview(buf), t0, lease_s)
        except StoreError as exc:
            return exc
        return buf

    def get_into(self, key: str, buffer: BufferLike) -> int:
        """Read ``key`` into ``buffer``; returns its size. InvalidParams if the buffer is too
        small, ObjectNotFound on a miss."""
        got = self.batch_get_into([key], [buffer])[0]
        if isinstance(got, StoreError):
            raise got
        return got

    def batch_get_into(
        self,
        keys: Sequence[str],
        buffers: Sequence[BufferLike],
        sources: list[P.ReplicaDesc | None] | None = None,
        sums: list[list[int]] | None = None,
    ) -> list[int | StoreError]:
        """Read each key into its buffer: its size, or the error. With ``sources`` (a list, filled
        in): the replica each key was read from (segment, tier), None where it failed; with
        ``sums``: as for :meth:`batch_get`."""
        if len(keys) != len(buffers):
            raise InvalidParams(f"{len(keys)} keys but {len(buffers)} buffers")
        views = [byte_view(b) for b in buffers]
        reply, t0, lease_s = self.lookup(keys)
        if sums is not None:
            sums.extend(list(r.sums) if r.code == 0 else [] for r in reply.results)
        out: list[int | StoreError] = []
        for key, view, res in zip(keys, views, reply.results, strict=True):
            if res.code != 0:
                out.append(error_for(res.code, f"{key!r}: {res.message}"))
            elif view.readonly or view.nbytes < res.size:
                out.append(
                    InvalidParams(
                        f"{key!r}: buffer of {view.nbytes} bytes (writable) cannot hold {res.size}"
                    )
                )
            else:
                try:
                    rep = self.read(key, res, view, t0, lease_s)
                    out.append(res.size)
                    if sources is not None:
                        sources.append(rep)
                    continue
                except StoreError as exc:
                    out.append(exc)
            if sources is not None:
                sources.append(None)
        return out

    def batch_get_into_ranges(
        self,
        keys: Sequence[str],
        ranges: Sequence[Sequence[tuple[int, BufferLike]] | RangeTable],
        guard: ReadGuard | None = None,
    ) -> list[int | StoreError]:
        """Scatter parts of each value straight into caller memory (no staging copy where the
        replica is mapped or local): ``ranges[i]`` lists ``(offset, buffer)`` pairs, each
        buffer filled with ``value[offset : offset + len(buffer)]``. Returns, per key, the
        bytes read or its error (InvalidParams for a range outside the value or a read-only
        buffer). ``guard``: a caller that may give up sets it (:meth:`ReadGuard.cancel`), after
        which no byte reaches its buffers; keys not done yet fail with TransferFailed."""
        if len(keys) != len(ranges):
            raise InvalidParams(f"{len(keys)} keys but {len(ranges)} range lists")
        tables = [_table(rs) for rs in ranges]
        reply, t0, lease_s = self.lookup(keys)
        out: list[int | StoreError] = []
        mapped: list[tuple[int, P.KeyResult, P.ReplicaDesc, RangeTable]] = []
        remote: list[tuple[int, P.KeyResult, NetRead]] = []
        for key, t, res in zip(keys, tables, reply.results, strict=True):
            if res.code != 0:
                out.append(error_for(res.code, f"{key!r}: {res.message}"))
            elif guard is not None and guard.cancelled:
                out.append(TransferFailed(f"{key!r}: read cancelled"))
            elif isinstance(t, str) or t.end > res.size:
                why = t if isinstance(t, str) else f"a range is outside its {res.size} bytes"
                out.append(InvalidParams(f"{key!r}: {why}"))
            elif (rep := self._batchable(res, t)) is not None:
                mapped.append((len(out), res, rep, t))
                out.append(TransferFailed("unreachable"))  # filled in below
            elif (net := self._net_read(key, res, t)) is not None:
                remote.append((len(out), res, net))
                out.append(TransferFailed("unreachable"))  # filled in below
            else:
                out.append(self._ranges_one(key, res, t.views(), t0, lease_s, guard))
        if mapped:
            self._ranges_mapped(keys, mapped, out, t0, lease_s, guard)
        if remote:
            self._ranges_remote(remote, out, t0, lease_s, guard)
        return out

    def _net_read(self, key: str, res: P.KeyResult, rs: RangeTable) -> NetRead | None:
        """The batched network read of this key's ranges (store/netreads.py), when its best
        replica is remote memory; else None."""
        if not res.replicas or not rs.nbytes:
            return None
        rep = self.order(res.replicas)[0]
        if rep.tier != "memory" or rep.segment in self.segments:
            return None
        if self.engine.reads_by_mapping(rep.segment):
            return None
        lo, hi = chunk_bounds(res.size, rs)
        sums = res.sums if self.verify_reads else None
        return NetRead(key, sums, res.size, lo, hi, rep.segment, rep.offset, rs)

    def _ranges_remote(
        self,
        remote: list[tuple[int, P.KeyResult, NetRead]],
        out: list[int | StoreError],
        t0: float,
        lease_s: float,
        guard: ReadGuard | None,
    ) -> None:
        """Every key whose best replica is remote memory, in one engine batch; a key it
        cannot settle takes the per-key path (which reports and tries other replicas)."""
        got = fetch_many(self.engine, [net for _, _, net in remote], guard, self.net_scratch)
        expired = time.monotonic() - t0 > lease_s
        for (i, res, net), r in zip(remote, got, strict=True):
            if r is None:
                out[i] = self._ranges_one(net.key, res, net.ranges.views(), t0, lease_s, guard)
            elif isinstance(r, int) and expired:
                out[i] = LeaseExpired(f"{net.key!r}: read outlived its lease; bytes may be stale")
            else:
                out[i] = r

    def _ranges_one(
        self,
        key: str,
        res: P.KeyResult,
        rs: list[tuple[int, memoryview]],
        t0: float,
        lease_s: float,
        guard: ReadGuard | None,
    ) -> int | StoreError:
        try:
            self.read_ranges(key, res, rs, t0, lease_s, guard)
            return sum(v.nbytes for _, v in rs)
        except StoreError as exc:
            return exc

    def _batchable(self, res: P.KeyResult, rs: RangeTable) -> P.ReplicaDesc | None:
        """The replica a batched same-host read takes for this key (its best one, when that is
        memory this process maps and the ranges are disjoint), or None."""
        if not native.AVAILABLE or not res.replicas or not rs.nbytes:
            return None
        rep = self.order(res.replicas)[0]
        if rep.tier != "memory" or not rs.disjoint:
            return None
        if rep.segment in self.segments or self.engine.reads_by_mapping(rep.segment):
            return rep
        return None

    def _ranges_mapped(
        self,
        keys: Sequence[str],
        mapped: list[tuple[int, P.KeyResult, P.ReplicaDesc, RangeTable]],
        out: list[int | StoreError],
        t0: float,
        lease_s: float,
        guard: ReadGuard | None,
    ) -> None:
        """Every key whose best replica this process maps, in one C call
        (``verify.scatter_verified_many``); a key it cannot settle (a mismatch, a dead owner,
        a location gone stale) takes the per-key path, which reports and tries other replicas."""
        reads, where = [], []
        for i, res, rep, rs in mapped:
            try:
                lo, hi = chunk_bounds(res.size, rs)
                span, check = self._span_of(rep, lo, hi - lo)
            except KvcakeError:
                out[i] = self._ranges_one(keys[i], res, rs.views(), t0, lease_s, guard)
                continue
            reads.append(MappedRead(keys[i], res.sums, res.size, lo, span, check, rs))
            where.append((i, res, rs))
        got = scatter_verified_many(reads, guard, verify=self.verify_reads)
        expired = time.monotonic() - t0 > lease_s
        for (i, res, rs), r in zip(where, got, strict=True):
            if r is None:
                out[i] = self._ranges_one(keys[i], res, rs.views(), t0, lease_s, guard)
            elif isinstance(r, int) and expired:
                out[i] = LeaseExpired(f"{keys[i]!r}: read outlived its lease; bytes may be stale")
            else:
                out[i] = r

    def get_size(self, key: str) -> int:
        res = self.get_replica_desc(key)
        return res.size

    def get_replica_desc(self, key: str) -> P.KeyResult:
        res = self.conn.call(P.GetReplicas(self.id, [key])).results[0]
        if res.code:
            raise error_for(res.code, f"{key!r}: {res.message}")
        return res

    def is_exist(self, key: str) -> bool:
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys: Sequence[str]) -> list[bool]:
        reply = self.conn.call(P.Exist(self.id, list(keys)))
        for r in reply.results:
            if r.code < 0:
                raise error_for(r.code, r.message)
        return [r.code == 1 for r in reply.results]
