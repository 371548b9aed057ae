"""The store client's read path (a mixin of :class:`~kvcake.store.client.Client`): replica
choice, leases, staged batch reads, ``get_into`` straight into caller buffers."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kvcake.core import native
from kvcake.core.buffers import uninitialized_bytearray
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.core.integrity import whole_ok_many
from kvcake.core.ranges import RangeError, RangeTable
from kvcake.core.via import Via
from kvcake.store import protocol as P
from kvcake.store.errors import (
    InternalError,
    InvalidParams,
    LeaseExpired,
    TransferFailed,
    error_for,
)
from kvcake.store.landing import RUN as LANDING_MIN
from kvcake.store.netreads import NetRead, Scratch, fetch_direct, fetch_many
from kvcake.store.readguard import ReadGuard
from kvcake.store.replica_read import ReplicaReader
from kvcake.store.rpc import MasterConnection
from kvcake.store.staging import Staging
from kvcake.store.verify import (
    MappedRead,
    chunk_bounds,
    scatter_verified_many,
)
from kvcake.transfer.engine import TransferEngine
from kvcake.transfer.segments import BufferLike


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
    read methods are this part's): lookups, and the batch APIs over many keys at once. It gets
    the client's master connection, id, host, own segment views (the client's dict: mounts and
    unmounts show here), Transfer Engine, staging buffer and network scratch, and owns its
    :class:`~kvcake.store.replica_read.ReplicaReader` (``replicas``: one key from its
    replicas, verified), where a key the batch way cannot settle goes. Thread safe as the
    client is: no state of its own changes on a read but the replica reader's counters and the
    staging buffer's and scratch's locks, which it takes without waiting."""

    order = Via("replicas", ReplicaReader.order)
    read = Via("replicas", ReplicaReader.read)
    read_ranges = Via("replicas", ReplicaReader.read_ranges)

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
        self.conn, self.id = conn, client_id
        self.segments, self.engine, self.staging = segments, engine, staging
        self.net_scratch = net_scratch
        self.replicas = ReplicaReader(conn, client_id, host, segments, engine, verify)

    # --- reads ---------------------------------------------------------------------------------

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
        direct = set(big)
        small = [j for j in range(len(fast)) if j not in direct]
        sub = [fast[j] for j in small]
        sizes = [results[i].size for i, _ in sub]
        if sub and self.staging.fits(sizes) and self.staging.lock.acquire(blocking=False):
            try:
                staged = self.staging.read(
                    [(n, r.segment, r.offset) for n, (_, r) in zip(sizes, sub, strict=True)]
                )
            finally:
                self.staging.lock.release()
            good = [(j, v) for j, v in zip(small, staged, strict=True) if isinstance(v, bytearray)]
            if good and self.replicas.verify_reads:  # each one chunk (< LANDING_MIN): one pass
                ok = whole_ok_many(
                    [keys[fast[j][0]] for j, _ in good],
                    [v for _, v in good],
                    [results[fast[j][0]].sums for j, _ in good],
                )  # a value that fails is read again alone below, which reports the replica
                good = [g for g, o in zip(good, ok, strict=True) if o]
            got.update(good)
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
            self.replicas.span_read(
                keys[fast[j][0]], results[fast[j][0]], fast[j][1], 0, memoryview(bufs[j])
            )
            for j in which
        ]
        got = fetch_direct(self.engine, reads)
        return {j: bufs[j] for j, g in zip(which, got, strict=True) if isinstance(g, int)}

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
        sums = res.sums if self.replicas.verify_reads else None
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
                span, check = self.replicas.span_of(rep, lo, hi - lo)
            except KvcakeError:
                out[i] = self._ranges_one(keys[i], res, rs.views(), t0, lease_s, guard)
                continue
            reads.append(MappedRead(keys[i], res.sums, res.size, lo, span, check, rs))
            where.append((i, res, rs))
        got = scatter_verified_many(reads, guard, verify=self.replicas.verify_reads)
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
