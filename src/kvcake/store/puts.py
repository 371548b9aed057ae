"""The store client's write path (a part of :class:`~kvcake.store.client.Client`, whose put
methods are this part's): two-phase puts (``PutStart`` -> the bytes into each replica ->
``PutEnd``; ``PutRevoke`` on failure), each value's checksums computed once on the way, and
the file tier's writer.

Who owns what: the client owns the master connection, the Transfer Engine, its segment views
(a dict shared with this part: mounts and unmounts show here) and the staging buffer; this part
owns only the file writer and its own master connection (``connect`` makes it, on first use).
Thread safe as the client is: the staging buffer's lock is taken without waiting.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from kvcake.core import integrity
from kvcake.core.backoff import pauses
from kvcake.core.clocks import boottime
from kvcake.core.errors import StoreError
from kvcake.core.via import Via
from kvcake.store import protocol as P
from kvcake.store.config import ClientConfig
from kvcake.store.errors import (
    InvalidParams,
    NoSpace,
    RpcFailed,
    SpacePending,
    TransferFailed,
    error_for,
)
from kvcake.store.fences import write_deadline
from kvcake.store.filewriter import FileWriter
from kvcake.store.reads import byte_view
from kvcake.store.replica_write import ReplicaWriter, Write
from kvcake.store.rpc import MasterConnection
from kvcake.store.staging import Staging
from kvcake.transfer.engine import TransferEngine
from kvcake.transfer.segments import BufferLike

Result = StoreError | None


def raise_if(result: Result) -> None:
    if result is not None:
        raise result


class WritePath:
    """A store client's puts: ``put``, ``upsert``, ``put_from``, ``batch_put``,
    ``batch_upsert`` (the client's own, through :class:`~kvcake.core.via.Via`), and what the
    client's replica copies and the Mooncake shim share with them: :meth:`put_many`,
    :meth:`write_all`, :meth:`file_writer`."""

    write_all = Via("replicas", ReplicaWriter.write_all)

    def __init__(
        self,
        conn: MasterConnection,
        client_id: str,
        cfg: ClientConfig,
        segments: dict[str, memoryview],
        engine: TransferEngine,
        staging: Staging,
        connect: Callable[[], MasterConnection],
    ):
        self.conn, self.id, self.host, self.cfg = conn, client_id, cfg.hostname, cfg
        self.engine = engine
        self.replicas = ReplicaWriter(segments, engine, staging)  # the bytes into replicas
        self._connect = connect
        self.writer: FileWriter | None = None  # the file tier's (store/filewriter.py), lazily
        self._writer_conn: MasterConnection | None = None

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
        raise_if(self.batch_put([key], [value], options, checksums=sums)[0])

    def upsert(
        self,
        key: str,
        value: BufferLike,
        options: P.PutOptions | None = None,
        checksums: Sequence[int] | None = None,
    ) -> None:
        """Insert or overwrite (in place when the size matches)."""
        sums = None if checksums is None else [checksums]
        raise_if(self.put_many([key], [value], options, upsert=True, checksums=sums)[0])

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
        return self.put_many(
            keys, values, options, upsert=False, tenant=tenant, checksums=checksums
        )

    def batch_upsert(
        self,
        keys: Sequence[str],
        values: Sequence[BufferLike],
        checksums: Sequence[Sequence[int]] | None = None,
    ) -> list[Result]:
        return self.put_many(keys, values, None, upsert=True, checksums=checksums)

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
        # master (_sum_small), a larger one piece by piece while it is copied (write_all)
        return [None] * len(keys)

    @staticmethod
    def _sum_small(
        keys: Sequence[str], views: list[memoryview], sums: list[list[int] | None]
    ) -> Callable[[], None]:
        """What a put does while its PutStart is at the master (``MasterConnection.call``'s
        ``meanwhile``): sum the values whose sums are not known yet, in place, up to one chunk
        of bytes in all -- they are in L2 then for the copy or send that follows, and the
        pass overlaps the master's work; the rest is summed piece by piece while it is copied
        or sent (write_all)."""

        def run() -> None:
            # (cannot fail but for memory: a sum left None is computed after the write)
            budget = integrity.CHUNK  # what stays in L2 for the copy that follows
            with contextlib.suppress(Exception):
                for i, (key, view) in enumerate(zip(keys, views, strict=True)):
                    if sums[i] is None and view.nbytes <= budget:
                        sums[i] = integrity.checksums(key, view)
                        budget -= view.nbytes

        return run

    def put_many(
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
            self.revoke(list(keys), retries=0)
            raise
        started = [k for k, r in zip(keys, reply.results, strict=True) if r.code == 0]
        try:
            deadline = write_deadline(sent, reply.write_lease_ms)
            return self._finish_puts(keys, views, reply, started, sums, deadline)
        except BaseException:
            self.revoke(started)  # e.g. PutEnd lost, or interrupted mid-copy: undo half a put
            raise

    def revoke(self, keys: list[str], retries: int | None = None) -> None:
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
        """The bytes into the replicas the master placed, then ``PutEnd`` for the keys whose
        every replica was written (``PutRevoke`` for the others), then the file tier's copies."""
        by_key: dict[str, list[int] | None] = dict(zip(keys, sums, strict=True))
        errors, writes, files = _placed(keys, views, reply)
        for key, exc in self._write_retrying(writes, by_key, deadline).items():
            errors[key] = TransferFailed(f"{key!r}: {exc}")
        failed = [k for k in started if k in errors]
        if failed:
            self.revoke(failed)
        for key, view in zip(keys, views, strict=True):  # not summed while written (e.g. TCP)
            if by_key[key] is None:
                by_key[key] = integrity.checksums(key, view)
        results: list[Result] = [errors.get(k) for k in keys]  # type: ignore[misc]
        done = [k for k in started if k not in errors]
        if done:
            results = self._end(keys, done, by_key, results)
        if files:  # (most puts have none: no set built on the hot path)
            ok = {k for k, r in zip(keys, results, strict=True) if r is None}
            for key, view, rep in files:
                if key in ok:
                    self.file_writer().submit(key, view, rep, by_key[key] or [])
        return results

    def _write_retrying(
        self, writes: list[Write], by_key: dict[str, list[int] | None], deadline: float
    ) -> dict[str, Exception]:
        """``write_all``, and once more for the keys that failed: a failure may be a stale
        cached location (a node restarted under its name), forgotten before the retry."""
        failed = self.write_all(writes, by_key, deadline)
        if failed:
            again = [w for w in writes if w[0] in failed]
            for seg in {rep.segment for _, _, rep in again}:
                self.engine.registry.forget(seg)
            failed = self.write_all(again, by_key, deadline)
        return failed

    def _end(
        self,
        keys: Sequence[str],
        done: list[str],
        by_key: dict[str, list[int] | None],
        results: list[Result],
    ) -> list[Result]:
        """``PutEnd`` of ``done`` with their sums; ``results`` with the master's refusals."""
        done_sums = [by_key[k] or [] for k in done] if any(by_key.values()) else []
        end = self.conn.call(P.PutEnd(self.id, done, sums=done_sums))
        codes = dict(zip(done, end.results, strict=True))
        return [
            error_for(codes[k].code, codes[k].message) if k in codes and codes[k].code else r
            for k, r in zip(keys, results, strict=True)
        ]

    def file_writer(self) -> FileWriter:
        """The file tier's writer (store/filewriter.py), made on first use, with its own master
        connection: its reports do not queue behind puts."""
        if self.writer is None:
            conn = self._connect()
            self.writer = FileWriter(
                lambda key, off, ok: conn.call(P.TaskDone(self.id, "persist", key, ok, offset=off)),
                self.cfg.file_queue_bytes,
            )
            self._writer_conn = conn
        return self.writer

    def close(self) -> None:
        """Finish the queued file writes (they are acknowledged puts), then drop their link."""
        if self.writer is not None and self._writer_conn is not None:
            self.writer.close()
            self._writer_conn.close()


def _placed(
    keys: Sequence[str], views: list[memoryview], reply: P.Reply
) -> tuple[dict[str, Exception], list[Write], list[Write]]:
    """A ``PutStart`` reply as (refused keys' errors, memory replicas to write, file replicas
    to write after ``PutEnd``: store/filewriter.py)."""
    errors: dict[str, Exception] = {}
    writes: list[Write] = []
    files: list[Write] = []
    for key, view, res in zip(keys, views, reply.results, strict=True):
        if res.code != 0:
            errors[key] = error_for(res.code, f"{key!r}: {res.message}")
        reps = res.replicas
        if reps and reps[-1].tier == "file":
            files.append((key, view, reps[-1]))
            reps = reps[:-1]
        writes += [(key, view, rep) for rep in reps]
    return errors, writes, files
