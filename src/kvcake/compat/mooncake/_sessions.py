"""Put and get sessions: reserve objects (or look their replicas up) once, then move byte ranges
of them between caller buffers and the replicas, then end the session.

A put session is kvcake's two-phase put split open: ``batch_put_session_start`` is PutStart
(space reserved, the object invisible), range writes go straight into every replica,
``batch_put_session_end`` is PutEnd, ``..._revoke`` PutRevoke. The session computes the value's
checksums as it writes (``_range_sums``) and hands them over with PutEnd, as every writer does
(core/integrity.py). A get session caches the replica list, checksums and lease of each key;
ranges are read through the store's verified read (every chunk a range touches is checked
before any byte is handed over; a corrupt replica is dropped and the next one tried; none
verifies: -801, and the buffer gets none of the bad bytes). The lease still guards them: a read
after it ran out fails with -707 instead of returning possibly stale bytes."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from kvcake.compat.mooncake._base import Conn, options, returns, view
from kvcake.compat.mooncake._range_sums import RangeSums, ReadBack
from kvcake.compat.mooncake._types import ReplicateConfig
from kvcake.core.errors import KvcakeError, StoreError
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
    sums: RangeSums | None = None  # put: the checksums of what was written
    res: P.KeyResult | None = None  # get: the lookup's answer (replicas, checksums)


class Sessions:
    """Put and get sessions. Owns the two session tables (key -> what the session holds;
    bounded by MAX_SESSIONS each): a put session holds space reserved on the master, a get
    session a read lease. Reaches the client through the Conn. Thread safety: one session key
    is used by one thread at a time (as with the wheel); the tables themselves are dicts whose
    single operations the GIL keeps whole."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._tables: dict[str, dict[str, _Open]] = {"put": {}, "get": {}}

    def _sessions(self, kind: str) -> dict[str, _Open]:
        return self._tables[kind]

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
        c = self._conn.c
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
                    opened[key] = _Open(size, reps, file=files[0] if files else None,
                                        sums=RangeSums(key, size))  # fmt: skip
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
        c = self._conn.c
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
                        c.engine.write(rep.segment, rep.offset + off, data, fence=rep.fence)
                except KvcakeError:
                    return E.TRANSFER_FAIL
            if sess.sums is not None:
                sess.sums.feed(off, data)
            total += n
        return total

    def _read_back(self, sess: _Open) -> ReadBack:
        """Reads the value's bytes back from the first replica the session wrote."""
        c = self._conn.c
        if not sess.replicas:
            raise E.TransferFailed("the session has no memory replica")
        rep = sess.replicas[0]

        def read(off: int, out: memoryview) -> None:
            own = c.segments.get(rep.segment)
            if own is not None:
                out[:] = own[rep.offset + off : rep.offset + off + out.nbytes]
            else:
                c.engine.read_into(rep.segment, rep.offset + off, out)

        return read

    def _finish(self, keys: list[str], msg: type[P.PutEnd] | type[P.PutRevoke]) -> list[int]:
        opened = self._sessions("put")
        known = [k for k in dict.fromkeys(keys) if k in opened]
        codes = {k: E.INVALID_PARAMS for k in keys}
        if known and msg is P.PutEnd:
            sums: dict[str, list[int]] = {}
            for k in known:
                sess = opened[k]
                with contextlib.suppress(KvcakeError):
                    if sess.sums is not None:
                        sums[k] = sess.sums.sums(self._read_back(sess))
            lost = [k for k in known if k not in sums]
            if lost:  # its bytes cannot be summed: never published without checksums
                self._end(lost, P.PutRevoke, opened, codes, [])
                codes.update(dict.fromkeys(lost, E.TRANSFER_FAIL))
            known = [k for k in known if k in sums]
            self._end(known, msg, opened, codes, [sums[k] for k in known])
        elif known:
            self._end(known, msg, opened, codes, [])
        return [codes[k] for k in keys]

    def _end(self, known: list[str], msg: type[P.PutEnd] | type[P.PutRevoke],
             opened: dict[str, _Open], codes: dict[str, int], sums: list[list[int]]) -> None:  # fmt: skip
        if not known:
            return
        c = self._conn.c
        call = P.PutEnd(c.id, known, sums=sums) if msg is P.PutEnd else P.PutRevoke(c.id, known)
        reply = c.conn.call(call)
        results = reply.results or [P.KeyResult(0)] * len(known)
        for i, (k, res) in enumerate(zip(known, results, strict=True)):
            codes[k] = res.code
            sess = opened.pop(k)
            if sess.file is not None and res.code == 0 and msg is P.PutEnd:
                self._persist(k, sess.file, sums[i])

    def _persist(self, key: str, rep: P.ReplicaDesc, sums: list[int]) -> None:
        """The value written in ranges goes to the file tier as a whole (store/filewriter.py)."""
        c = self._conn.c
        try:
            value = c.get(key)
        except KvcakeError:
            with contextlib.suppress(KvcakeError):  # the master drops the file replica
                c.writes.file_writer().report(key, rep.offset, False)
            return
        c.writes.file_writer().submit(key, memoryview(value), rep, sums)

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
        reply, t0, lease_s = self._conn.c.reads.lookup(keys)
        out = []
        for key, res in zip(keys, reply.results, strict=True):
            out.append(res.code)
            if res.code == 0:
                opened[key] = _Open(res.size, list(res.replicas), t0, lease_s, res=res)
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
        ranges = []
        for p, n, off in zip(ptrs, sizes, offs, strict=True):
            if n <= 0 or off < 0 or off + n > sess.size:
                return E.INVALID_PARAMS
            ranges.append((off, view(p, n)))
        assert sess.res is not None
        try:  # verified, replica by replica; LeaseExpired (-707) past the session's lease
            self._conn.c.reads.read_ranges(key, sess.res, ranges, sess.t0, sess.lease_s)
        except StoreError as exc:
            return exc.code  # IntegrityError: -801 (no replica verifies)
        except KvcakeError:
            return E.TRANSFER_FAIL
        return sum(v.nbytes for _, v in ranges)

    @returns(int)
    def batch_get_session_end(self, keys: list[str]) -> int:
        opened = self._sessions("get")
        for k in keys:
            opened.pop(k, None)
        return 0
