"""The dummy client's connection to a real client (kvcake's ``mooncake_client``): the part of
kvcake's :class:`~kvcake.store.client.Client` interface the Mooncake store methods use, forwarded
over the dummy-client IPC (``_dummy_wire``). Data moves through shared memory: buffers in
``alloc_from_mem_pool`` memory are read and written in place by the real client; other values
are staged in the dummy's local buffer (one copy), and values too large for it come back inline.

Raises kvcake's typed errors (``RpcFailed`` when the real client is gone or misses the call
deadline, ``KVCAKE_DUMMY_CALL_S``, default 30 s); attributes of the real Client that a dummy has
no counterpart for raise ``InvalidParams`` (the Mooncake methods then answer -600)."""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from kvcake.compat.mooncake import _dummy_shm as shm
from kvcake.compat.mooncake import _dummy_wire as W
from kvcake.compat.mooncake._base import view
from kvcake.core import framing, integrity
from kvcake.core.errors import FramingError, StoreError
from kvcake.store import errors as E
from kvcake.store import verify
from kvcake.store.protocol import PutOptions
from kvcake.store.reads import byte_view
from kvcake.store.rpc import split_address

CALL_ENV = "KVCAKE_DUMMY_CALL_S"
CONNECT_S = 5.0
Result = StoreError | None


class NotForwarded(E.InvalidParams, AttributeError):
    """A kvcake Client attribute a dummy has no counterpart for (-600 at the Mooncake API;
    ``hasattr`` is False)."""


def _address(v: memoryview) -> int:
    return int(np.frombuffer(v, dtype=np.uint8).ctypes.data) if v.nbytes else 0


class RemoteClient:
    disk_reads = 0  # get_offload_rpc_read_count: a dummy reads nothing from disk itself

    def __init__(self, address: str, local_size: int, pool_size: int):
        host, port = split_address(address)
        self._lock = threading.RLock()
        self._rids = itertools.count(1)
        self.segs = shm.Segments()
        self._seg_ids = itertools.count(1)
        self.pool_left = pool_size
        self._broken = ""
        self.local_size = 0
        self._local: tuple[int, int] | None = None
        self._sock = socket.create_connection((host, port), timeout=CONNECT_S)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._rpc(W.Attach(os.getpid()))
            self._sock.settimeout(float(os.environ.get(CALL_ENV, "30")))
            if local_size > 0:
                self._local = self._map(W.LOCAL, local_size)
                self.local_size = local_size
        except BaseException:
            self._sock.close()
            raise

    def __getattr__(self, name: str) -> Any:
        raise NotForwarded(f"a dummy client has no {name!r} (not forwarded to the real client)")

    # --- connection ---------------------------------------------------------------------------

    def _rpc(self, msg: msgspec.Struct) -> tuple[W.Reply, bytes]:
        with self._lock:
            if self._broken:
                raise E.RpcFailed(f"real client connection lost: {self._broken}")
            try:
                framing.send_frame(self._sock, W.REQUESTS, next(self._rids), msg)
                frame = framing.read_frame(self._sock, W.REPLIES, W.REPLY_LIMITS)
                if frame is None:
                    raise ConnectionResetError("the real client closed the connection")
            except (OSError, FramingError) as exc:
                self._broken = str(exc) or type(exc).__name__
                self._sock.close()
                raise E.RpcFailed(f"real client connection lost: {self._broken}") from exc
        reply = frame.msg
        assert isinstance(reply, W.Reply)
        if reply.code < 0:
            raise E.error_for(reply.code, reply.message)
        return reply, frame.data

    def ping(self) -> None:
        self._rpc(W.Ping())

    def close(self) -> None:
        """Detach: the real client unmaps this dummy's memory when the connection closes."""
        with self._lock:
            self._broken = self._broken or "closed"
            self._sock.close()
            if self._local is not None:
                shm.unmap(self._local[0], self._local[1])
                self._local = None

    # --- shared memory ------------------------------------------------------------------------

    def _map(self, seg: int, size: int) -> tuple[int, int]:
        name, addr = shm.create(size)
        try:
            self._rpc(W.MapSeg(seg, name, size))
        except BaseException:
            shm.unmap(addr, size)
            raise
        finally:
            shm.unlink(name)
        self.segs.add(seg, addr, size)
        return addr, size

    def alloc(self, size: int) -> int:
        """New shared memory (bounded by the dummy's ``mem_pool_size``) the real client has
        mapped too: its address. It stays mapped here until the process exits, as Mooncake's."""
        with self._lock:
            if size <= 0 or size > self.pool_left:
                raise E.NoSpace(f"{size} bytes: {self.pool_left} left in the dummy's pool")
            addr, _ = self._map(next(self._seg_ids), size)
            self.pool_left -= size
            return addr

    # --- puts ---------------------------------------------------------------------------------

    def put(self, key: str, value: Any, options: PutOptions | None = None) -> None:
        _raise(self._put_many([key], [value], options, upsert=False)[0])

    def upsert(self, key: str, value: Any, options: PutOptions | None = None) -> None:
        _raise(self._put_many([key], [value], options, upsert=True)[0])

    def batch_put(
        self, keys: Sequence[str], values: Sequence[Any], options: PutOptions | None = None
    ) -> list[Result]:
        return self._put_many(keys, values, options, upsert=False)

    def _put_many(
        self, keys: Sequence[str], values: Sequence[Any], options: PutOptions | None, upsert: bool
    ) -> list[Result]:
        """Values in registered memory go by reference, the others through the local buffer
        (several calls when they do not fit at once; a value larger than it: InvalidParams)."""
        if len(keys) != len(values):
            raise E.InvalidParams(f"{len(keys)} keys but {len(values)} values")
        views = [byte_view(v) for v in values]
        results: list[Result] = [None] * len(keys)
        with self._lock:
            batch: list[tuple[int, W.Loc]] = []
            pos = 0
            for i, v in enumerate(views):
                loc = self.segs.find(_address(v), v.nbytes)
                if loc is None:
                    if v.nbytes > self.local_size:
                        results[i] = E.InvalidParams(f"value of {v.nbytes} bytes > local buffer")
                        continue
                    if pos + v.nbytes > self.local_size:
                        self._flush_puts(keys, views, batch, options, upsert, results)
                        batch, pos = [], 0
                    self._local_view(pos, v.nbytes)[:] = v
                    loc, pos = (W.LOCAL, pos, v.nbytes), pos + v.nbytes
                batch.append((i, loc))
            self._flush_puts(keys, views, batch, options, upsert, results)
        return results

    def _flush_puts(
        self,
        keys: Sequence[str],
        views: list[memoryview],
        batch: list[tuple[int, W.Loc]],
        options: PutOptions | None,
        upsert: bool,
        results: list[Result],
    ) -> None:
        if not batch:
            return
        op = "upsert" if upsert else "put"
        sums = [integrity.checksums(keys[i], views[i]) for i, _ in batch]
        call = W.Call(op, [keys[i] for i, _ in batch], [loc for _, loc in batch], options,
                      sums=sums)  # fmt: skip
        reply, _ = self._rpc(call)
        for (i, _), code in zip(batch, reply.codes, strict=True):
            results[i] = E.error_for(code, f"{keys[i]!r}: error {code}") if code else None

    def _local_view(self, pos: int, n: int) -> memoryview:
        if not n:
            return memoryview(bytearray(0))
        assert self._local is not None
        return view(self._local[0] + pos, n)

    # --- gets ---------------------------------------------------------------------------------

    def get_bytes(self, keys: Sequence[str]) -> list[bytes | StoreError]:
        """Each value as ``bytes`` (one copy out of shared memory), or its error."""
        with self._lock:
            reply, data = self._rpc(W.Call("get", list(keys)))
            sums = _sums_of(reply, len(keys))
            out: list[bytes | StoreError] = []
            for i, (key, code, (seg, off, n)) in enumerate(
                zip(keys, reply.codes, reply.locs, strict=True)
            ):
                if code:
                    out.append(E.error_for(code, f"{key!r}: error {code}"))
                    continue
                value = bytes(self._local_view(off, n)) if seg == W.LOCAL else data[off : off + n]
                out.append(_checked(key, sums[i], memoryview(value)) or value)
            return out

    def get(self, key: str) -> bytearray:
        got = self.get_bytes([key])[0]
        if isinstance(got, StoreError):
            raise got
        return bytearray(got)

    def batch_get(self, keys: Sequence[str]) -> list[bytearray | StoreError]:
        return [g if isinstance(g, StoreError) else bytearray(g) for g in self.get_bytes(keys)]

    def get_into(self, key: str, buffer: Any) -> int:
        got = self.batch_get_into([key], [buffer])[0]
        if isinstance(got, StoreError):
            raise got
        return got

    def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[int | StoreError]:
        """Registered destinations are written in place by the real client; others through the
        local buffer while it has room, then inline."""
        if len(keys) != len(buffers):
            raise E.InvalidParams(f"{len(keys)} keys but {len(buffers)} buffers")
        views = [byte_view(b) for b in buffers]
        with self._lock:
            locs: list[W.Loc] = []
            pos = 0
            for v in views:
                loc = None if v.readonly else self.segs.find(_address(v), v.nbytes)
                if v.readonly:
                    loc = (W.INLINE, 0, 0)  # the real client answers InvalidParams, as kvcake's
                elif loc is None and self._local is not None and pos + v.nbytes <= self.local_size:
                    loc, pos = (W.LOCAL, pos, v.nbytes), pos + v.nbytes
                locs.append(loc or (W.INLINE, 0, v.nbytes))
            reply, data = self._rpc(W.Call("get_into", list(keys), locs))
            return self._copy_out(keys, views, locs, reply, data)

    def _copy_out(
        self,
        keys: Sequence[str],
        views: list[memoryview],
        sent: list[W.Loc],
        reply: W.Reply,
        data: bytes,
    ) -> list[int | StoreError]:
        out: list[int | StoreError] = []
        sums = _sums_of(reply, len(keys))
        for i, (key, v, (seg0, _, _), code, n, (_, off, _)) in enumerate(
            zip(keys, views, sent, reply.codes, reply.values, reply.locs, strict=True)
        ):
            if code:
                out.append(E.error_for(code, f"{key!r}: error {code}"))
                continue
            if seg0 == W.LOCAL:
                v[:n] = self._local_view(off, n)
            elif seg0 == W.INLINE:
                v[:n] = data[off : off + n]
            out.append(_checked(key, sums[i], v[:n]) or n)  # in place: what the caller holds
        return out

    # --- metadata -----------------------------------------------------------------------------

    def is_exist(self, key: str) -> bool:
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys: Sequence[str]) -> list[bool]:
        return [bool(v) for v in self._rpc(W.Call("exist", list(keys)))[0].values]

    def get_size(self, key: str) -> int:
        return self._rpc(W.Call("size", [key]))[0].values[0]

    def remove(self, key: str, force: bool = False) -> None:
        _raise(self.batch_remove([key], force)[0])

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[Result]:
        reply, _ = self._rpc(W.Call("remove", list(keys), force=force))
        return [
            E.error_for(c, f"{k!r}: error {c}") if c else None
            for k, c in zip(keys, reply.codes, strict=True)
        ]

    def remove_all(self, force: bool = False) -> int:
        return self._rpc(W.Call("remove_all", force=force))[0].values[0]

    def remove_by_regex(self, regex: str, force: bool = False) -> int:
        return self._rpc(W.Call("remove_regex", pattern=regex, force=force))[0].values[0]


def _sums_of(reply: W.Reply, count: int) -> list[list[int]]:
    if len(reply.sums) != count:
        raise E.InternalError(f"the real client sent {len(reply.sums)} checksum lists for {count}")
    return reply.sums


def _checked(key: str, sums: list[int], value: memoryview) -> StoreError | None:
    """The last hop's check: the bytes the dummy hands over, against the object's checksums
    (the real client verified what it read from the pool; this covers shared memory and the
    reply frame between the two)."""
    bad = integrity.verify_whole(key, sums, value)
    if not bad:
        return None
    verify.integrity_failed("dummy", key, "dummy-hop", -1)
    return E.IntegrityError(f"{key!r}: chunks {bad[:4]} changed between the real client and here")


def _raise(result: Result) -> None:
    if result is not None:
        raise result
