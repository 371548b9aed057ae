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
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvcake.core.errors import KvcakeError, StoreError
from kvcake.store import protocol as P
from kvcake.store.config import ClientConfig
from kvcake.store.disk import read_remote
from kvcake.store.errors import (
    InternalError,
    InvalidParams,
    LeaseExpired,
    ObjectNotFound,
    TransferFailed,
    error_for,
)
from kvcake.store.liveness import Heartbeater
from kvcake.store.memtune import tune_malloc
from kvcake.store.rpc import MasterConnection
from kvcake.store.staging import Staging


def byte_view(value: Any) -> memoryview:
    """A 1-D unsigned-byte view of any C-contiguous buffer (no copy)."""
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


Result = StoreError | None


class Client:
    def __init__(self, config: ClientConfig | None = None, segment_name: str = "", **kw: Any):
        from kvcake.transfer.engine import TransferEngine

        self.cfg = config or ClientConfig(**kw)
        if self.cfg.tune_malloc:
            tune_malloc()
        self.conn = MasterConnection(self.cfg.master, self.cfg.rpc_timeout_s)
        hello = self.conn.call(P.Heartbeat("", self.cfg.hostname))
        if not hello.directory:
            raise StoreError("the master hosts no Transfer Engine directory", -1)
        self.engine = TransferEngine(hello.directory, self.cfg.hostname, protocol=self.cfg.protocol)
        self.id = self.engine.owner
        self.host = self.cfg.hostname
        self.segments: dict[str, memoryview] = {}
        self.remount_hooks: list[Callable[[], None]] = [self._remount]
        self._closed = True
        try:
            self.staging = Staging(self.engine, f"staging-{self.id.replace('/', '-')}")
            self.conn.call(P.Heartbeat(self.id, self.host))
            if self.cfg.segment_size:
                name = segment_name or f"seg-{self.id.replace('/', '-')}"
                self.segments[name] = self.engine.allocate_segment(name, self.cfg.segment_size)
                self._mount(name)
        except BaseException:
            self.segments.clear()
            self.engine.close()  # releases the shm segment it may have created
            self.conn.close()
            raise
        hb_conn = MasterConnection(self.cfg.master, self.cfg.rpc_timeout_s)
        ttl_s = hello.client_ttl_ms / 1000
        self.heartbeat = Heartbeater(hb_conn, self.id, self.host, ttl_s, self.remount_hooks)
        self.heartbeat.start()
        self._closed = False

    # --- segments -----------------------------------------------------------------------------

    def _mount(self, name: str) -> None:
        cap = self.segments[name].nbytes
        self.conn.call(P.Mount(self.id, self.host, name, cap))

    def _remount(self) -> None:
        if self.engine.directory is not None:  # the master dropped us from the directory
            for name in self.engine.local_segments():
                self.engine.directory.publish(self.engine.segment_info(name))
        for name in self.segments:
            self._mount(name)

    # --- writes -------------------------------------------------------------------------------

    def put(self, key: str, value: Any, options: P.PutOptions | None = None) -> None:
        """Store ``value`` under ``key``. Raises ObjectAlreadyExists if it exists (put never
        overwrites), NoSpace, InvalidParams, TransferFailed."""
        _raise(self.batch_put([key], [value], options)[0])

    def upsert(self, key: str, value: Any, options: P.PutOptions | None = None) -> None:
        """Insert or overwrite (in place when the size matches)."""
        _raise(self._put_many([key], [value], options, upsert=True)[0])

    def put_from(self, key: str, buffer: Any, size: int | None = None) -> None:
        """Put the first ``size`` bytes of ``buffer`` (zero copy on the caller's side)."""
        view = byte_view(buffer)
        self.put(key, view if size is None else view[:size])

    def batch_put(
        self, keys: Sequence[str], values: Sequence[Any], options: P.PutOptions | None = None
    ) -> list[Result]:
        return self._put_many(keys, values, options, upsert=False)

    def batch_upsert(self, keys: Sequence[str], values: Sequence[Any]) -> list[Result]:
        return self._put_many(keys, values, None, upsert=True)

    def _put_many(
        self, keys: Sequence[str], values: Sequence[Any], options: P.PutOptions | None, upsert: bool
    ) -> list[Result]:
        if len(keys) != len(values):
            raise InvalidParams(f"{len(keys)} keys but {len(values)} values")
        if len(set(keys)) != len(keys):
            raise InvalidParams("duplicate keys in one batch")
        views = [byte_view(v) for v in values]
        reply = self.conn.call(
            P.PutStart(
                self.id,
                self.host,
                list(keys),
                [v.nbytes for v in views],
                options or P.PutOptions(),
                upsert,
            )
        )
        errors: dict[str, Exception] = {}
        writes: list[tuple[str, memoryview, P.ReplicaDesc]] = []
        for key, view, res in zip(keys, views, reply.results, strict=True):
            if res.code != 0:
                errors[key] = error_for(res.code, f"{key!r}: {res.message}")
            writes += [(key, view, rep) for rep in res.replicas]
        for key, exc in self._write_all(writes).items():
            errors[key] = TransferFailed(f"{key!r}: {exc}")
        failed = [k for k, r in zip(keys, reply.results, strict=True) if not r.code and k in errors]
        done = [k for k in keys if k not in errors]
        results: list[Result] = [errors.get(k) for k in keys]  # type: ignore[misc]
        if failed:
            with contextlib.suppress(StoreError):
                self.conn.call(P.PutRevoke(self.id, failed))
        if done:
            end = self.conn.call(P.PutEnd(self.id, done))
            codes = dict(zip(done, end.results, strict=True))
            results = [
                error_for(codes[k].code, codes[k].message) if k in codes and codes[k].code else r
                for k, r in zip(keys, results, strict=True)
            ]
        return results

    def _write_all(
        self, writes: list[tuple[str, memoryview, P.ReplicaDesc]]
    ) -> dict[str, Exception]:
        """Copy every (key, value, replica); returns the keys that failed."""
        failed: dict[str, Exception] = {}
        remote = []
        for key, view, rep in writes:
            own = self.segments.get(rep.segment)
            if own is not None:  # our own segment: a plain memcpy
                own[rep.offset : rep.offset + view.nbytes] = view
            else:
                remote.append((key, view, rep))
        if self.staging.fits([v.nbytes for _, v, _ in remote]) and self.staging.lock.acquire(
            blocking=False
        ):
            try:
                errs = self.staging.write([(v, r.segment, r.offset) for _, v, r in remote])
            finally:
                self.staging.lock.release()
            failed.update({k: e for (k, _, _), e in zip(remote, errs, strict=True) if e})
            return failed
        for key, view, rep in remote:
            try:
                self.engine.write(rep.segment, rep.offset, view)
            except KvcakeError as exc:
                failed[key] = exc
        return failed

    # --- reads --------------------------------------------------------------------------------

    def _order(self, reps: list[P.ReplicaDesc]) -> list[P.ReplicaDesc]:
        def rank(r: P.ReplicaDesc) -> int:
            if r.tier == "disk":
                return 3
            return 0 if r.segment in self.segments else 1 if r.host == self.host else 2

        return sorted(reps, key=rank)

    def _read(self, key: str, res: P.KeyResult, out: memoryview, t0: float, lease_s: float) -> None:
        errors = []
        for rep in self._order(res.replicas):
            try:
                own = self.segments.get(rep.segment)
                if own is not None:
                    out[: res.size] = own[rep.offset : rep.offset + res.size]
                elif rep.tier == "disk":
                    read_remote(rep.endpoint, key, out[: res.size])
                else:
                    self.engine.read_into(rep.segment, rep.offset, out[: res.size])
            except KvcakeError as exc:
                errors.append(f"{rep.segment}: {exc}")
                continue
            if time.monotonic() - t0 > lease_s:
                raise LeaseExpired(f"{key!r}: read outlived its lease; bytes may be stale")
            return
        raise TransferFailed(f"{key!r}: no replica readable ({'; '.join(errors)})")

    def _lookup(self, keys: Sequence[str]) -> tuple[P.Reply, float, float]:
        t0 = time.monotonic()
        reply = self.conn.call(P.GetReplicas(self.id, list(keys)))
        return reply, t0, reply.lease_ms / 1000

    def get(self, key: str) -> bytearray:
        """The value of ``key`` (a new bytearray: one copy, no second copy into ``bytes``);
        raises ObjectNotFound on a miss."""
        got = self.batch_get([key])[0]
        if isinstance(got, StoreError):
            raise got
        return got

    def batch_get(self, keys: Sequence[str]) -> list[bytearray | StoreError]:
        reply, t0, lease_s = self._lookup(keys)
        out: list[bytearray | StoreError | None] = []
        fast: list[tuple[int, P.ReplicaDesc]] = []  # (index, remote memory replica)
        for i, (key, res) in enumerate(zip(keys, reply.results, strict=True)):
            best = self._order(res.replicas)[0] if res.code == 0 else None
            if res.code != 0:
                out.append(error_for(res.code, f"{key!r}: {res.message}"))
            elif best is not None and best.tier == "memory" and best.segment not in self.segments:
                out.append(None)
                fast.append((i, best))
            else:
                out.append(self._get_one(key, res, t0, lease_s))
        if fast:
            self._get_staged(keys, reply.results, fast, out, t0, lease_s)
        return [o if o is not None else InternalError("unreachable") for o in out]

    def _get_staged(
        self,
        keys: Sequence[str],
        results: list[P.KeyResult],
        fast: list[tuple[int, P.ReplicaDesc]],
        out: list[bytearray | StoreError | None],
        t0: float,
        lease_s: float,
    ) -> None:
        """One engine batch for several remote values, falling back per key on any failure."""
        sizes = [results[i].size for i, _ in fast]
        got: list[bytearray | Exception] = []
        if self.staging.fits(sizes) and self.staging.lock.acquire(blocking=False):
            try:
                got = self.staging.read(
                    [(n, r.segment, r.offset) for n, (_, r) in zip(sizes, fast, strict=True)]
                )
            finally:
                self.staging.lock.release()
        expired = time.monotonic() - t0 > lease_s
        for j, (i, _) in enumerate(fast):
            value = got[j] if got else None
            if isinstance(value, bytearray) and not expired:
                out[i] = value
            elif isinstance(value, bytearray):
                out[i] = LeaseExpired(f"{keys[i]!r}: read outlived its lease")
            else:
                out[i] = self._get_one(keys[i], results[i], t0, lease_s)

    def _get_one(
        self, key: str, res: P.KeyResult, t0: float, lease_s: float
    ) -> bytearray | StoreError:
        buf = bytearray(res.size)
        try:
            self._read(key, res, memoryview(buf), t0, lease_s)
        except StoreError as exc:
            return exc
        return buf

    def get_into(self, key: str, buffer: Any) -> int:
        """Read ``key`` into ``buffer``; returns its size. InvalidParams if the buffer is too
        small, ObjectNotFound on a miss."""
        got = self.batch_get_into([key], [buffer])[0]
        if isinstance(got, StoreError):
            raise got
        return got

    def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[int | StoreError]:
        if len(keys) != len(buffers):
            raise InvalidParams(f"{len(keys)} keys but {len(buffers)} buffers")
        views = [byte_view(b) for b in buffers]
        reply, t0, lease_s = self._lookup(keys)
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
                    self._read(key, res, view, t0, lease_s)
                    out.append(res.size)
                except StoreError as exc:
                    out.append(exc)
        return out

    def get_size(self, key: str) -> int:
        res = self.get_replica_desc(key)
        return res.size

    def get_replica_desc(self, key: str) -> P.KeyResult:
        res = self.conn.call(P.GetReplicas(self.id, [key])).results[0]
        _raise(error_for(res.code, f"{key!r}: {res.message}") if res.code else None)
        return res

    def is_exist(self, key: str) -> bool:
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys: Sequence[str]) -> list[bool]:
        reply = self.conn.call(P.Exist(self.id, list(keys)))
        for r in reply.results:
            if r.code < 0:
                raise error_for(r.code, r.message)
        return [r.code == 1 for r in reply.results]

    # --- removal ------------------------------------------------------------------------------

    def remove(self, key: str, force: bool = False) -> None:
        """Raises ObjectNotFound, ObjectHasLease (someone is reading it) unless ``force``."""
        _raise(self.batch_remove([key], force)[0])

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[Result]:
        reply = self.conn.call(P.Remove(self.id, list(keys), force))
        return [error_for(r.code, r.message) if r.code else None for r in reply.results]

    def remove_all(self, force: bool = False, pattern: str = "") -> int:
        """Remove every (or every matching) object; leased ones are skipped unless ``force``."""
        return self.conn.call(P.RemoveAll(self.id, force, pattern)).count

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Unmount our segments (their objects vanish), stop heartbeats, close the engine."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
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


def _raise(result: Result) -> None:
    if result is not None:
        raise result


_ = ObjectNotFound  # re-exported for callers that catch misses from get()
