"""The store client: put/get KV objects in the pool (Pythonic: exceptions, any buffer).

Values are anything with the buffer protocol (bytes, bytearray, memoryview, numpy arrays,
contiguous torch CPU tensors). Writes are two-phase (master put_start -> bytes written into each
replica through the Transfer Engine -> put_end; put_revoke on failure). Reads pick local memory,
then same-host memory, then remote memory, then the disk tier, and fail with
:class:`LeaseExpired` rather than return bytes read after their read lease ran out.

Batch calls return one entry per key: ``None``/a value on success or the :class:`StoreError`
for that key (they raise only for whole-call problems such as mismatched lengths).
Threading: a Client may be shared by threads (its master connection is locked per call).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvcake.core import auth as _auth
from kvcake.core import integrity, native
from kvcake.core.backoff import pauses
from kvcake.core.clocks import boottime
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.core.via import Via
from kvcake.store import protocol as P
from kvcake.store.config import ClientConfig
from kvcake.store.errors import (
    InvalidParams,
    NoSpace,
    RpcFailed,
    SegmentAlreadyExists,
    SpacePending,
    TransferFailed,
    WriteLeaseExpired,
    error_for,
)
from kvcake.store.fences import write_deadline
from kvcake.store.filewriter import FileWriter
from kvcake.store.ha.resolve import FailoverConnection
from kvcake.store.landing import LandingSums
from kvcake.store.liveness import DEFAULT_CLIENT_TTL_S, Heartbeater, call_deadline_s
from kvcake.store.memtune import tune_malloc
from kvcake.store.netreads import Scratch
from kvcake.store.owners import dead_here
from kvcake.store.reads import ReadPath, byte_view
from kvcake.store.rpc import MasterConnection
from kvcake.store.staging import Staging
from kvcake.store.verify import write_summing
from kvcake.transfer.engine import TransferEngine
from kvcake.transfer.errors import DirectoryUnreachable, TransferError
from kvcake.transfer.metadata import DirectoryClient
from kvcake.transfer.registry import host_identity
from kvcake.transfer.segments import BufferLike

_T = TypeVar("_T")
FAILOVER_S = 30.0  # as long as FailoverConnection waits for a new leader
log = logging.getLogger(__name__)
REMOUNT_ROUNDS = 5  # a remount repeats while failovers keep moving the master under it

Result = StoreError | None


class Client:
    """A store client: puts here, reads through its :class:`ReadPath` part (``self.reads``),
    whose public methods are this client's (:class:`~kvcake.core.via.Via`)."""

    get = Via("reads", ReadPath.get)
    batch_get = Via("reads", ReadPath.batch_get)
    get_into = Via("reads", ReadPath.get_into)
    batch_get_into = Via("reads", ReadPath.batch_get_into)
    batch_get_into_ranges = Via("reads", ReadPath.batch_get_into_ranges)
    get_size = Via("reads", ReadPath.get_size)
    get_replica_desc = Via("reads", ReadPath.get_replica_desc)
    is_exist = Via("reads", ReadPath.is_exist)
    batch_is_exist = Via("reads", ReadPath.batch_is_exist)

    def __init__(
        self,
        config: ClientConfig | None = None,
        segment_name: str = "",
        auth: _auth.Authenticator | None = None,
        transfer_port: int = 0,
        **kw: Any,
    ):
        """``auth``: the cluster's shared secret (None: the environment's, if any);
        ``transfer_port``: the port this client's Transfer Engine listens on (0: the OS picks)."""

        self.cfg = config or ClientConfig(**kw)
        self.auth = auth = _auth.resolve(auth) or _auth.DISABLED
        if self.cfg.tune_malloc:
            tune_malloc()
        self.conn = _connection(
            self.cfg.master,
            self._call_deadline(DEFAULT_CLIENT_TTL_S),
            self.cfg.busy_poll_us,
            self.cfg.rpc_retries,
            auth=auth,
        )
        hello = self.conn.call(P.Heartbeat("", self.cfg.hostname))
        self.client_ttl_s = hello.client_ttl_ms / 1000 or DEFAULT_CLIENT_TTL_S
        self.conn.set_timeout(self._call_deadline(self.client_ttl_s))
        if not hello.directory:
            raise StoreError("the master hosts no Transfer Engine directory", -1)
        self.engine = TransferEngine(  # listens where peers reach this host (not only loopback)
            hello.directory,
            self.cfg.hostname,
            (self.cfg.hostname,),
            protocol=self.cfg.protocol,
            auth=auth,
            listen_port=transfer_port,
        )
        if self.engine.directory is not None:
            self.engine.directory.set_timeout(self._call_deadline(self.client_ttl_s))
        self.id = self.engine.owner
        self.host = self.cfg.hostname
        self.segments: dict[str, memoryview] = {}
        self.remount_hooks: list[Callable[[], None]] = [self._remount]
        self._writer: FileWriter | None = None  # the file tier's (store/filewriter.py), lazily
        self._closed = True
        try:
            staging = f"staging-{self.id.replace('/', '-')}"
            self.staging = self._through_failover(lambda: Staging(self.engine, staging))
            self.reads = ReadPath(
                self.conn,
                self.id,
                self.host,
                self.segments,
                self.engine,
                self.staging,
                Scratch(),
                self.cfg.verify,
            )
            self.conn.call(P.Heartbeat(self.id, self.host))
            if self.cfg.segment_size:
                name = segment_name or f"seg-{self.id.replace('/', '-')}"
                # "{port}": the port this client's Transfer Engine listens on (Mooncake names a
                # client's segment "host:port" after its engine's port).
                name = name.replace("{port}", self.engine.addresses[0].rsplit(":", 1)[1])
                size = self.cfg.segment_size
                if segment_name:  # (a default name carries this client's id: never held)
                    self._report_dead_holder(name)
                self.segments[name] = self._through_failover(
                    lambda: self.engine.allocate_segment(name, size)
                )
                self._mount(name)
        except BaseException:
            self.segments.clear()
            self.engine.close()  # releases the shm segment it may have created
            self.conn.close()
            raise
        deadline = self._call_deadline(self.client_ttl_s)
        hb_conn = _connection(self.cfg.master, deadline, retries=0, auth=auth)
        ttl_s = hello.client_ttl_ms / 1000
        self.heartbeat = Heartbeater(
            hb_conn,
            self.id,
            self.host,
            ttl_s,
            self.remount_hooks,
            self._directory_in_use,
            on_forgotten=[self.engine.cut_inbound],
            fences=self.engine.server.fences,
        )
        self.heartbeat.start()
        self._closed = False

    @property
    def disk_reads(self) -> int:
        """Values read from a node's disk tier over its disk service (a stat)."""
        return self.reads.replicas.disk_reads

    @property
    def file_reads(self) -> int:
        """Values read from the file tier (a stat)."""
        return self.reads.replicas.file_reads

    def _call_deadline(self, client_ttl_s: float) -> float:
        """Each try of a master call ends after this (client.master_call_timeout_s)."""
        cfg = self.cfg
        return call_deadline_s(client_ttl_s, cfg.rpc_timeout_s, cfg.master_call_timeout_s)

    # --- segments -----------------------------------------------------------------------------

    def _report_dead_holder(self, name: str) -> None:
        """A node restarted at once after a SIGKILL finds its name still held by its dead
        predecessor. A master on another host cannot check that pid; this process can, on its
        own host: it tells the master (``P.OwnerGone``; store/owners.py), which then frees the
        name at once instead of after the predecessor's lease (StoreServer waits for that).
        Here the directory names the holder; after a leader change it may not (the new leader's
        directory starts empty), and the refused mount names it instead (:meth:`_mount`)."""
        directory = self.engine.directory
        if directory is None:
            return
        try:
            holder = directory.lookup(name)
        except TransferError:  # no holder (the usual case), or no directory to ask
            return
        self._report_if_gone(name, holder.owner, holder.host_id)

    def _report_if_gone(self, name: str, owner: str, owner_host: str) -> bool:
        """Tell the master ``owner`` is gone if it ran on this host and its pid is; whether
        the master believed it."""
        if not dead_here(owner, owner_host, self.id):
            return False
        try:
            self.conn.call(P.OwnerGone(self.id, host_identity(), owner))
        except StoreError:  # not believed: the lease's expiry frees it
            return False
        log.warning("store client %s: %r was held by %s, gone", self.id, name, owner)
        return True

    def _mount(self, name: str) -> None:
        cap = self.segments[name].nbytes
        mount = lambda: P.Mount(self.id, self.host, name, cap, host_id=host_identity())  # noqa: E731
        try:
            reply = self.conn.call(mount())
        except SegmentAlreadyExists as exc:
            if exc.holder is None or not self._report_if_gone(name, *exc.holder):
                raise
            # The master believed it: the name is free now. (A new request: the refused one's
            # id would be answered from the master's dedup table.)
            reply = self.conn.call(mount())
        self.engine.server.fences.floor(reply.floors)  # before any stale write lands (fences.py)

    def _remount(self) -> None:
        """Publish our segments in the leader's directory, then mount them. A failover in
        between makes the mount land on the *next* leader (the connection follows it), which
        then knows us, so it never asks us to remount, while our segments sit in the dead
        leader's directory: readers get "unknown segment" for every object of ours. So the
        directory is asked again after the mounts, and the whole step repeats until the
        mounts and the publish went to the same master."""
        for _ in range(REMOUNT_ROUNDS):
            published = self._follow_directory()
            if self.engine.directory is not None:  # the master dropped us from the directory
                for name in self.engine.local_segments():
                    self.engine.directory.publish(self.engine.segment_info(name))
            for name in self.segments:
                self._mount(name)
            if self._directory_address() == published:
                return
            log.warning("store client %s: the master changed while remounting; again", self.id)

    def _through_failover(self, publish: Callable[[], _T]) -> _T:
        """Run a step that publishes to the segment directory; if the directory's master died
        (HA), follow the new leader's directory and retry (each step rolls back on failure,
        so a retry never finds half of it done)."""
        deadline = time.monotonic() + FAILOVER_S
        while True:
            try:
                return publish()
            except DirectoryUnreachable:
                if not self.cfg.master.startswith("etcd://") or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                self._follow_directory()

    def _directory_in_use(self) -> str:
        directory = self.engine.directory
        return directory.address if directory is not None else ""

    def _directory_address(self) -> str:
        """The Transfer Engine directory of the master our connection reaches now."""
        return self.conn.call(P.Heartbeat("", self.host)).directory

    def _follow_directory(self) -> str:
        """After a master failover (store/ha) the Transfer Engine directory lives elsewhere;
        returns the address followed."""
        where = self._directory_address()
        old = self.engine.directory
        if old is not None and where and where != old.address:
            self.engine.directory = self.engine.registry.directory = DirectoryClient(
                where, self._call_deadline(self.client_ttl_s), auth=self.auth
            )
            old.close()
        return where

    # --- writes -------------------------------------------------------------------------------

    def put(
        self,
        key: str,
        value: BufferLike,
        options: P.PutOptions | None = None,
        checksums: Sequence[int] | None = None,
    ) -> None:
        """Store ``value`` under ``key``. Raises ObjectAlreadyExists if it exists (put never
        overwrites), NoSpace, InvalidParams, TransferFailed. ``checksums``: the value's
        ``core.integrity.checksums(key, value)`` if the caller has them already (else they
        are computed here, once)."""
        sums = None if checksums is None else [checksums]
        _raise(self.batch_put([key], [value], options, checksums=sums)[0])

    def upsert(
        self,
        key: str,
        value: BufferLike,
        options: P.PutOptions | None = None,
        checksums: Sequence[int] | None = None,
    ) -> None:
        """Insert or overwrite (in place when the size matches)."""
        sums = None if checksums is None else [checksums]
        _raise(self._put_many([key], [value], options, upsert=True, checksums=sums)[0])

    def put_from(
        self,
        key: str,
        buffer: BufferLike,
        size: int | None = None,
        checksums: Sequence[int] | None = None,
    ) -> None:
        """Put the first ``size`` bytes of ``buffer`` (zero copy on the caller's side)."""
        view = byte_view(buffer)
        self.put(key, view if size is None else view[:size], checksums=checksums)

    def batch_put(
        self,
        keys: Sequence[str],
        values: Sequence[BufferLike],
        options: P.PutOptions | None = None,
        tenant: str | None = None,
        checksums: Sequence[Sequence[int]] | None = None,
    ) -> list[Result]:
        """``tenant``: charged for these puts instead of ``config.tenant`` (a serving
        instance puts blocks of many tenants' requests). ``checksums``: per value, its
        ``core.integrity.checksums`` if the caller computed them already (the vLLM connector,
        the Mooncake shim); malformed ones raise InvalidParams."""
        return self._put_many(
            keys, values, options, upsert=False, tenant=tenant, checksums=checksums
        )

    def batch_upsert(
        self,
        keys: Sequence[str],
        values: Sequence[BufferLike],
        checksums: Sequence[Sequence[int]] | None = None,
    ) -> list[Result]:
        return self._put_many(keys, values, None, upsert=True, checksums=checksums)

    def _sums(
        self,
        keys: Sequence[str],
        values: Sequence[BufferLike],
        given: Sequence[Sequence[int]] | None,
    ) -> list[list[int] | None]:
        """Each value's checksums: the caller's (checked for shape), else None: computed once
        later in this put (:meth:`_sum_small`, or while copied or sent), the only place a put
        computes them (re-puts and copies carry them)."""
        if len(keys) != len(values):
            raise InvalidParams(f"{len(keys)} keys but {len(values)} values")
        if given is not None:
            if len(given) != len(keys):
                raise InvalidParams(f"{len(keys)} keys but {len(given)} checksum lists")
            views = [byte_view(v) for v in values]
            for key, view, sums in zip(keys, views, given, strict=True):
                if not integrity.well_formed(view.nbytes, sums):
                    raise InvalidParams(f"{key!r}: checksums malformed for {view.nbytes} bytes")
            return [list(g) for g in given]
        if not self.cfg.verify:
            return [[] for _ in keys]
        # None: computed later, once -- a value of one chunk while its PutStart is at the
        # master (_sum_small), a larger one piece by piece while it is copied (_write_all)
        return [None] * len(keys)

    @staticmethod
    def _sum_small(
        keys: Sequence[str], views: list[memoryview], sums: list[list[int] | None]
    ) -> Callable[[], None]:
        """What a put does while its PutStart is at the master (``MasterConnection.call``'s
        ``meanwhile``): sum the values whose sums are not known yet, in place, up to one chunk
        of bytes in all -- they are in L2 then for the copy or send that follows, and the
        pass overlaps the master's work; the rest is summed piece by piece while it is copied
        or sent (_write_all)."""

        def run() -> None:
            # (cannot fail but for memory: a sum left None is computed after the write)
            budget = integrity.CHUNK  # what stays in L2 for the copy that follows
            with contextlib.suppress(Exception):
                for i, (key, view) in enumerate(zip(keys, views, strict=True)):
                    if sums[i] is None and view.nbytes <= budget:
                        sums[i] = integrity.checksums(key, view)
                        budget -= view.nbytes

        return run

    def _put_many(
        self,
        keys: Sequence[str],
        values: Sequence[BufferLike],
        options: P.PutOptions | None,
        upsert: bool,
        tenant: str | None = None,
        checksums: Sequence[Sequence[int]] | None = None,
    ) -> list[Result]:
        """One put attempt, then re-puts of the keys the master answered SpacePending (memory
        full while offloads to disk are in flight) until ``space_wait_s`` has passed."""
        sums = self._sums(keys, values, checksums)
        results = self._put_once(keys, values, options, upsert, tenant, sums)
        deadline = time.monotonic() + self.cfg.space_wait_s
        waits = pauses(0.005, 0.1)
        while True:
            waiting = [i for i, r in enumerate(results) if isinstance(r, SpacePending)]
            if not waiting:
                return results
            pause = next(waits)
            if time.monotonic() + pause > deadline:
                for i in waiting:  # callers (and Mooncake's API) know only NoSpace
                    results[i] = NoSpace(str(results[i]))
                return results
            time.sleep(pause)
            again = self._put_once(
                [keys[i] for i in waiting],
                [values[i] for i in waiting],
                options,
                upsert,
                tenant,
                [sums[i] for i in waiting],
            )
            for i, r in zip(waiting, again, strict=True):
                results[i] = r

    def _put_once(
        self,
        keys: Sequence[str],
        values: Sequence[BufferLike],
        options: P.PutOptions | None,
        upsert: bool,
        tenant: str | None,
        sums: list[list[int] | None],
    ) -> list[Result]:
        if len(keys) != len(values):
            raise InvalidParams(f"{len(keys)} keys but {len(values)} values")
        if len(set(keys)) != len(keys):
            raise InvalidParams("duplicate keys in one batch")
        views = [byte_view(v) for v in values]
        start = P.PutStart(
            self.id,
            self.host,
            list(keys),
            [v.nbytes for v in views],
            options or P.PutOptions(),
            upsert,
            tenant=self.cfg.tenant if tenant is None else tenant,
        )
        sent = boottime()
        try:
            reply = self.conn.call(start, meanwhile=self._sum_small(keys, views, sums))
        except RpcFailed:
            # The master may have applied the PutStart before the link failed: revoke whatever
            # it started, so the space is not held until the sweep (one attempt: the master
            # was just unreachable, and the sweep covers what this misses).
            self._revoke(list(keys), retries=0)
            raise
        started = [k for k, r in zip(keys, reply.results, strict=True) if r.code == 0]
        try:
            deadline = write_deadline(sent, reply.write_lease_ms)
            return self._finish_puts(keys, views, reply, started, sums, deadline)
        except BaseException:
            self._revoke(started)  # e.g. PutEnd lost, or interrupted mid-copy: undo half a put
            raise

    def _revoke(self, keys: list[str], retries: int | None = None) -> None:
        if keys:
            with contextlib.suppress(StoreError):
                self.conn.call(P.PutRevoke(self.id, keys), retries)

    def _finish_puts(
        self,
        keys: Sequence[str],
        views: list[memoryview],
        reply: P.Reply,
        started: list[str],
        sums: list[list[int] | None],
        deadline: float,
    ) -> list[Result]:
        by_key: dict[str, list[int] | None] = dict(zip(keys, sums, strict=True))
        errors: dict[str, Exception] = {}
        writes: list[tuple[str, memoryview, P.ReplicaDesc]] = []
        files: list[tuple[str, memoryview, P.ReplicaDesc]] = []
        for key, view, res in zip(keys, views, reply.results, strict=True):
            if res.code != 0:
                errors[key] = error_for(res.code, f"{key!r}: {res.message}")
            reps = res.replicas
            if reps and reps[-1].tier == "file":  # written after PutEnd (store/filewriter.py)
                files.append((key, view, reps[-1]))
                reps = reps[:-1]
            writes += [(key, view, rep) for rep in reps]
        failed_writes = self._write_all(writes, by_key, deadline)
        if failed_writes:  # stale cached locations (a node restarted under its name): retry once
            again = [w for w in writes if w[0] in failed_writes]
            for seg in {rep.segment for _, _, rep in again}:
                self.engine.registry.forget(seg)
            failed_writes = self._write_all(again, by_key, deadline)
        for key, exc in failed_writes.items():
            errors[key] = TransferFailed(f"{key!r}: {exc}")
        failed = [k for k in started if k in errors]
        done = [k for k in started if k not in errors]
        results: list[Result] = [errors.get(k) for k in keys]  # type: ignore[misc]
        if failed:
            self._revoke(failed)
        for key, view in zip(keys, views, strict=True):  # not summed while written (e.g. TCP)
            if by_key[key] is None:
                by_key[key] = integrity.checksums(key, view)
        if done:
            done_sums = [by_key[k] or [] for k in done] if any(by_key.values()) else []
            end = self.conn.call(P.PutEnd(self.id, done, sums=done_sums))
            codes = dict(zip(done, end.results, strict=True))
            results = [
                error_for(codes[k].code, codes[k].message) if k in codes and codes[k].code else r
                for k, r in zip(keys, results, strict=True)
            ]
        if files:
            ok = {k for k, r in zip(keys, results, strict=True) if r is None}
            for key, view, rep in files:
                if key in ok:
                    self._file_writer().submit(key, view, rep, by_key[key] or [])
        return results

    def _file_writer(self) -> FileWriter:
        if self._writer is None:  # its own master connection: reports do not queue behind puts
            conn = _connection(
                self.cfg.master, self._call_deadline(self.client_ttl_s), auth=self.auth
            )
            self._writer = FileWriter(
                lambda key, off, ok: conn.call(P.TaskDone(self.id, "persist", key, ok, offset=off)),
                self.cfg.file_queue_bytes,
            )
            self._writer_conn = conn
        return self._writer

    def _write_all(
        self,
        writes: list[tuple[str, memoryview, P.ReplicaDesc]],
        sums: dict[str, list[int] | None] | None = None,
        deadline: float = float("inf"),
    ) -> dict[str, Exception]:
        """Copy every (key, value, replica); returns the keys that failed. ``sums[key]`` None:
        the value's checksums are computed while it is copied into memory this process maps
        (its own segment, a same-host peer's: summed as it goes), and stored there. Network
        targets go through the staging buffer in one engine batch when they fit."""
        failed: dict[str, Exception] = {}
        remote = []
        for key, view, rep in writes:
            if boottime() > deadline:  # paused past its lease: the range may be another's
                failed[key] = WriteLeaseExpired(f"{key!r}: its write lease passed before its copy")
            elif rep.segment in self.segments or self.engine.reads_by_mapping(rep.segment):
                self._write_mapped(key, view, rep, sums, failed)
            else:
                remote.append((key, view, rep))
        if self.staging.fits([v.nbytes for _, v, _ in remote]) and self.staging.lock.acquire(
            blocking=False
        ):
            try:
                errs = self.staging.write([(v, r.segment, r.offset, r.fence) for _, v, r in remote])
            finally:
                self.staging.lock.release()
            failed.update({k: e for (k, _, _), e in zip(remote, errs, strict=True) if e})
            return failed
        if remote:
            failed.update(self._write_remote(remote, sums))
        return failed

    def _write_remote(
        self,
        remote: list[tuple[str, memoryview, P.ReplicaDesc]],
        sums: dict[str, list[int] | None] | None,
    ) -> dict[str, Exception]:
        """Network writes as ONE engine batch (its lanes keep the link busy); sums still due
        are taken from each piece right after it is sent (store/landing.py)."""
        due = {k for k, _, _ in remote if sums and sums.get(k, []) is None}
        landings = {k: LandingSums(k, 0, v) for k, v, _ in remote if k in due}
        items = [
            (r.segment, r.offset, v, landings[k].landed if k in landings else None)
            for k, v, r in remote
        ]
        failed: dict[str, Exception] = {}
        if len(items) == 1:  # one value: the engine's inline path, no batch machinery
            try:
                self.engine.write(*items[0], fence=remote[0][2].fence)
            except KvcakeError as exc:
                failed[remote[0][0]] = exc
            return self._summed(landings, failed, sums)
        by_fence: dict[int, list[int]] = {}  # (one per master request: a put batch shares one)
        for i, (_, _, r) in enumerate(remote):
            by_fence.setdefault(r.fence, []).append(i)
        for fence, idx in by_fence.items():
            result = self.engine.write_many([items[i] for i in idx], fence)
            for i, res in zip(idx, result.results, strict=True):
                if not res.ok:
                    failed[remote[i][0]] = TransferFailed(f"{res.error_type}: {res.error}")
        return self._summed(landings, failed, sums)

    @staticmethod
    def _summed(
        landings: dict[str, LandingSums],
        failed: dict[str, Exception],
        sums: dict[str, list[int] | None] | None,
    ) -> dict[str, Exception]:
        if sums is not None:
            for key, landing in landings.items():
                if key not in failed:
                    sums[key] = landing.final()
        return failed

    def _write_mapped(
        self,
        key: str,
        view: memoryview,
        rep: P.ReplicaDesc,
        sums: dict[str, list[int] | None] | None,
        failed: dict[str, Exception],
    ) -> None:
        """One copy into memory this process maps, summed as it goes when the sums are due."""
        try:
            own = self.segments.get(rep.segment)
            if own is not None:
                span, check = own[rep.offset : rep.offset + view.nbytes], None
            else:
                mapped = self.engine.mapped_span(rep.segment, rep.offset, view.nbytes)
                if mapped is None:  # no longer mappable (a restarted peer): the general path
                    self.engine.write(rep.segment, rep.offset, view, fence=rep.fence)
                    return
                span, check = mapped
            if sums is not None and sums.get(key, []) is None:
                sums[key] = write_summing(key, view, span)
            else:
                native.copy(span, view)
            if check is not None:
                check()  # the owner died meanwhile: the bytes went nowhere
        except KvcakeError as exc:
            failed[key] = exc

    # --- replicas -----------------------------------------------------------------------------

    def copy_replica(self, key: str, targets: Sequence[str]) -> None:
        """Copy ``key`` onto each memory segment of ``targets`` (store/replica_ops.py): the new
        replicas are readable once this returns; on any failure none of them is."""
        value = memoryview(self.get(key))
        sent = boottime()
        reply = self.conn.call(P.ReplicaCopyStart(self.id, key, list(targets)))
        if reply.code:
            raise error_for(reply.code, f"{key!r}: {reply.message}")
        failed: dict[str, Exception] = {}
        deadline = write_deadline(sent, reply.write_lease_ms)
        try:
            writes = [(key, value, rep) for rep in reply.results[0].replicas]
            failed = self._write_all(writes, None, deadline)
        finally:
            end = self.conn.call(P.ReplicaCopyEnd(self.id, key, not failed))
        if failed:
            raise TransferFailed(f"{key!r}: copy failed: {failed[key]}")
        if end.code:
            raise error_for(end.code, f"{key!r}: {end.message}")

    def drop_replica(self, key: str, segment: str) -> None:
        """Forget the replica of ``key`` on ``segment`` (another readable one must remain)."""
        reply = self.conn.call(P.ReplicaDrop(self.id, key, segment))
        if reply.code:
            raise error_for(reply.code, f"{key!r}: {reply.message}")

    def move_replica(self, key: str, source: str, target: str) -> None:
        """Copy ``key``'s replica to ``target``, then drop the one on ``source``."""
        self.copy_replica(key, [target])
        self.drop_replica(key, source)

    # --- removal ------------------------------------------------------------------------------

    def remove(self, key: str, force: bool = False) -> None:
        """Raises ObjectNotFound, ObjectHasLease (someone is reading it) unless ``force``."""
        _raise(self.batch_remove([key], force)[0])

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[Result]:
        reply = self.conn.call(P.Remove(self.id, list(keys), force))
        return [error_for(r.code, r.message) if r.code else None for r in reply.results]

    def remove_all(self, force: bool = False, pattern: str = "") -> int:
        """Remove every object, or those matching a prefix or glob ``pattern`` (docs/store.md,
        "Patterns"); leased ones are skipped unless ``force``."""
        return self.conn.call(P.RemoveAll(self.id, force, pattern)).count

    def remove_by_regex(self, regex: str, force: bool = False) -> int:
        """Mooncake's ``remove_by_regex``: keys ``re.search``-matching ``regex``. Bounded by a
        time budget on the master (InvalidParams when exceeded or for a bad expression)."""
        return self.conn.call(P.RemoveAll(self.id, force, regex=regex)).count

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Unmount our segments (their objects vanish), stop heartbeats, close the engine."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if self._writer is not None:  # queued file writes first: they are acknowledged puts
            self._writer.close()
            self._writer_conn.close()
        self.heartbeat.stop()
        for name in list(self.segments):
            with contextlib.suppress(KvcakeError):
                self.conn.call(P.Unmount(self.id, name))
        self.segments.clear()
        self.engine.close()
        self.conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connection(address: str, *args: Any, **kw: Any) -> MasterConnection:
    if address.startswith("etcd://"):  # HA: find the leader through etcd and follow it
        return FailoverConnection(address, *args, **kw)
    return MasterConnection(address, *args, **kw)


def _raise(result: Result) -> None:
    if result is not None:
        raise result
