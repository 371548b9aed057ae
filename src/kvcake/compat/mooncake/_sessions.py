"""Put and get sessions: reserve objects (or look their replicas up) once, then move byte ranges
of them between caller buffers and the replicas, then end the session.

A put session is kvcake's two-phase put split open: ``batch_put_session_start`` is PutStart
(space reserved, the object invisible), range writes go straight into every replica,
``batch_put_session_end`` is PutEnd, ``..._revoke`` PutRevoke. A get session caches the replica
list and lease of each key; ranges are read from the cached replica (the lease still guards
them: a read after it ran out fails with -707 instead of returning possibly stale bytes)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from kvcake.compat.mooncake._base import StoreBase, options, returns, view
from kvcake.compat.mooncake._types import ReplicateConfig
from kvcake.core.errors import KvcakeError
from kvcake.store import errors as E
from kvcake.store import protocol as P

MAX_SESSIONS = 65536  # open session keys per store (each holds reserved space or a lease)


@dataclass
class _Open:
    size: int
    replicas: list[P.ReplicaDesc]
    t0: float = 0.0
    lease_s: float = 0.0
    written: set[tuple[int, int]] = field(default_factory=set)
    file: P.ReplicaDesc | None = None  # the file tier's replica: written after PutEnd


class SessionMethods(StoreBase):
    def _sessions(self, kind: str) -> dict[str, _Open]:
        name = f"_{kind}_sessions"
        if name not in self.__dict__:
            self.__dict__[name] = {}
        return self.__dict__[name]

    # --- put sessions -------------------------------------------------------------------------

    @returns([])
    def batch_put_session_start(
        self, keys: list[str], sizes: list[int], config: ReplicateConfig | None = None
    ) -> list[int]:
        opened = self._sessions("put")
        if len(keys) != len(sizes) or len(opened) + len(keys) > MAX_SESSIONS:
            return [E.INVALID_PARAMS] * len(keys)
        if not keys:
            return []
        bad = [not k or s <= 0 or k in opened for k, s in zip(keys, sizes, strict=True)]
        c = self._c
        start = P.PutStart(c.id, c.host, list(keys), list(sizes), options(config), False)
        reply = c.conn.call(start)
        out = []
        for key, size, res, is_bad in zip(keys, sizes, reply.results, bad, strict=True):
            if is_bad:
                out.append(E.INVALID_PARAMS)
            elif res.code == E.OBJECT_ALREADY_EXISTS:
                out.append(res.code)
            else:
                out.append(res.code)
                if res.code == 0:
                    reps = [r for r in res.replicas if r.tier != "file"]
                    files = [r for r in res.replicas if r.tier == "file"]
                    opened[key] = _Open(size, reps, file=files[0] if files else None)
        return out

    @returns([])
    def batch_put_from_multi_buffer_ranges(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_dst_offsets: list[list[int]],
    ) -> list[int]:
        """Write each key's buffers at their offsets of the reserved object: bytes written."""
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) == len(all_dst_offsets):
            return [E.INVALID_PARAMS] * len(keys)
        opened = self._sessions("put")
        out = []
        for key, ptrs, sizes, offs in zip(
            keys, all_buffer_ptrs, all_sizes, all_dst_offsets, strict=True
        ):
            sess = opened.get(key)
            if sess is None or not len(ptrs) == len(sizes) == len(offs):
                out.append(E.INVALID_PARAMS)
                continue
            out.append(self._write_ranges(sess, ptrs, sizes, offs))
        return out

    def _write_ranges(self, sess: _Open, ptrs: list[int], sizes: list[int], offs: list[int]) -> int:
        c = self._c
        total = 0
        for p, n, off in zip(ptrs, sizes, offs, strict=True):
            if n <= 0 or off < 0 or off + n > sess.size:
                return E.INVALID_PARAMS
            data = view(p, n)
            for rep in sess.replicas:
                own = c.segments.get(rep.segment)
                try:
                    if own is not None:
                        own[rep.offset + off : rep.offset + off + n] = data
                    else:
                        c.engine.write(rep.segment, rep.offset + off, data)
                except KvcakeError:
                    return E.TRANSFER_FAIL
            total += n
        return total

    def _finish(self, keys: list[str], msg: type[P.PutEnd] | type[P.PutRevoke]) -> list[int]:
        opened = self._sessions("put")
        known = [k for k in dict.fromkeys(keys) if k in opened]
        codes = {k: E.INVALID_PARAMS for k in keys}
        if known:
            c = self._c
            reply = c.conn.call(msg(c.id, known))
            results = reply.results or [P.KeyResult(0)] * len(known)
            for k, res in zip(known, results, strict=True):
                codes[k] = res.code
                sess = opened.pop(k)
                if sess.file is not None and res.code == 0 and msg is P.PutEnd:
                    self._persist(k, sess.file)
        return [codes[k] for k in keys]

    def _persist(self, key: str, rep: P.ReplicaDesc) -> None:
        """The value written in ranges goes to the file tier as a whole (store/filewriter.py)."""
        c = self._c
        try:
            value = c.get(key)
        except KvcakeError:
            with contextlib.suppress(KvcakeError):  # the master drops the file replica
                c._file_writer().report(key, rep.offset, False)
            return
        c._file_writer().submit(key, memoryview(value), rep)

    @returns([])
    def batch_put_session_end(self, keys: list[str]) -> list[int]:
        return self._finish(keys, P.PutEnd)

    @returns([])
    def batch_put_session_revoke(self, keys: list[str]) -> list[int]:
        return self._finish(keys, P.PutRevoke)

    # --- get sessions -------------------------------------------------------------------------

    @returns([])
    def batch_get_session_start(self, keys: list[str]) -> list[int]:
        opened = self._sessions("get")
        if len(opened) + len(keys) > MAX_SESSIONS:
            return [E.INVALID_PARAMS] * len(keys)
        if not keys:
            return []
        reply, t0, lease_s = self._c._lookup(keys)
        out = []
        for key, res in zip(keys, reply.results, strict=True):
            out.append(res.code)
            if res.code == 0:
                opened[key] = _Open(res.size, self._c._order(list(res.replicas)), t0, lease_s)
        return out

    @returns([])
    def batch_get_into_multi_buffer_ranges(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_src_offsets: list[list[int]],
    ) -> list[int]:
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) == len(all_src_offsets):
            return [E.INVALID_PARAMS] * len(keys)
        opened = self._sessions("get")
        out = []
        for key, ptrs, sizes, offs in zip(
            keys, all_buffer_ptrs, all_sizes, all_src_offsets, strict=True
        ):
            sess = opened.get(key)
            if sess is None or not len(ptrs) == len(sizes) == len(offs):
                out.append(E.INVALID_PARAMS)
                continue
            out.append(self._read_ranges(key, sess, ptrs, sizes, offs))
        return out

    def _read_ranges(
        self, key: str, sess: _Open, ptrs: list[int], sizes: list[int], offs: list[int]
    ) -> int:
        c = self._c
        total = 0
        whole: bytearray | None = None
        for p, n, off in zip(ptrs, sizes, offs, strict=True):
            if n <= 0 or off < 0 or off + n > sess.size:
                return E.INVALID_PARAMS
            dst = view(p, n)
            rep = sess.replicas[0]
            try:
                own = c.segments.get(rep.segment)
                if own is not None:
                    dst[:] = own[rep.offset + off : rep.offset + off + n]
                elif rep.tier == "memory":
                    c.engine.read_into(rep.segment, rep.offset + off, dst)
                else:
                    whole = whole if whole is not None else c.get(key)
                    dst[:] = whole[off : off + n]
            except KvcakeError:
                return E.TRANSFER_FAIL
            total += n
        if time.monotonic() - sess.t0 > sess.lease_s:
            return E.LEASE_EXPIRED
        return total

    @returns(int)
    def batch_get_session_end(self, keys: list[str]) -> int:
        opened = self._sessions("get")
        for k in keys:
            opened.pop(k, None)
        return 0
