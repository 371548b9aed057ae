"""One attached dummy client, on the real client's side: the shared memory it mapped for it and
the store operations it runs for it on the real client's kvcake :class:`Client`.

Everything the dummy sends is checked before use (op names, key counts, every buffer's segment
and bounds); a bad request gets an error reply (-600) and the session goes on. ``close`` unmaps
everything it held (the dummy detached, closed or died)."""

from __future__ import annotations

import logging
import mmap
from collections.abc import Sequence

import msgspec

from kvcake.compat.mooncake import _dummy_shm as shm
from kvcake.compat.mooncake import _dummy_wire as W
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.store import errors as E
from kvcake.store.client import Client

log = logging.getLogger(__name__)
Outcome = tuple[W.Reply, list[bytes | bytearray | memoryview]]


class Session:
    def __init__(self, client: Client, peer: str):
        self.client = client
        self.peer = peer
        self.pid = 0
        self.segs: dict[int, mmap.mmap] = {}

    def handle(self, msg: msgspec.Struct) -> Outcome:
        """The reply (and its data parts) to one request; never raises for a bad request."""
        try:
            return self._dispatch(msg)
        except StoreError as exc:
            return W.Reply(code=exc.code, message=str(exc)), []
        except (KvcakeError, ValueError, OverflowError, OSError) as exc:
            return W.Reply(code=E.INVALID_PARAMS, message=f"{type(exc).__name__}: {exc}"), []

    def _dispatch(self, msg: msgspec.Struct) -> Outcome:
        if isinstance(msg, W.Attach):
            self.pid = msg.pid
            return W.Reply(values=[msg.protocol]), []
        if not self.pid:
            raise E.InvalidParams("attach first")
        if isinstance(msg, W.Ping):
            return W.Reply(), []
        if isinstance(msg, W.MapSeg):
            return self._map(msg), []
        if isinstance(msg, W.UnmapSeg):
            self._unmap(msg.seg)
            return W.Reply(), []
        assert isinstance(msg, W.Call)
        return self._call(msg)

    def _map(self, msg: W.MapSeg) -> W.Reply:
        if msg.seg < 0 or msg.seg in self.segs:
            raise E.InvalidParams(f"segment id {msg.seg} is taken or invalid")
        if len(self.segs) >= W.MAX_SEGMENTS:
            raise E.InvalidParams(f"a dummy maps at most {W.MAX_SEGMENTS} segments")
        self.segs[msg.seg] = shm.open_map(msg.name, msg.size)
        return W.Reply()

    def _unmap(self, seg: int) -> None:
        m = self.segs.pop(seg, None)
        if m is None:
            raise E.InvalidParams(f"segment {seg} is not mapped")
        _close(m)

    def close(self) -> int:
        """Unmap every segment; returns the bytes released."""
        total = 0
        for seg in list(self.segs):
            m = self.segs.pop(seg)
            total += len(m)
            _close(m)
        return total

    def _view(self, loc: W.Loc) -> memoryview:
        seg, off, n = loc
        m = self.segs.get(seg)
        if m is None or off < 0 or n < 0 or off + n > len(m):
            raise E.InvalidParams(f"buffer {loc} is outside the dummy's mapped memory")
        return memoryview(m)[off : off + n]

    def _call(self, msg: W.Call) -> Outcome:
        if msg.op not in W.OPS:
            raise E.InvalidParams(f"unknown operation {msg.op!r}")
        if len(msg.keys) > W.MAX_KEYS:
            raise E.InvalidParams(f"more than {W.MAX_KEYS} keys")
        c, keys = self.client, msg.keys
        if msg.op in ("put", "upsert"):
            views = self._views(msg.locs, len(keys))
            results = c.writes.put_many(
                keys, views, msg.options, upsert=msg.op == "upsert", checksums=msg.sums or None
            )
            return W.Reply(codes=[0 if r is None else r.code for r in results]), []
        if msg.op == "get":
            return self._get(keys)
        if msg.op == "get_into":
            return self._get_into(keys, msg.locs)
        if msg.op == "exist":
            return W.Reply(values=[int(b) for b in c.batch_is_exist(keys)]), []
        if msg.op == "size":
            return W.Reply(values=[c.get_size(k) for k in keys[:1]]), []
        if msg.op == "remove":
            results = c.batch_remove(keys, msg.force)
            return W.Reply(codes=[0 if r is None else r.code for r in results]), []
        if msg.op == "remove_all":
            return W.Reply(values=[c.remove_all(msg.force)]), []
        return W.Reply(values=[c.remove_by_regex(msg.pattern, msg.force)]), []

    def _views(self, locs: Sequence[W.Loc], count: int) -> list[memoryview]:
        if len(locs) != count:
            raise E.InvalidParams(f"{count} keys but {len(locs)} buffers")
        return [self._view(loc) for loc in locs]

    def _get(self, keys: list[str]) -> Outcome:
        """Values go into the dummy's local buffer while they fit, the rest inline. One key is
        read straight into the local buffer (no copy here) unless it does not fit."""
        local = self.segs.get(W.LOCAL)
        sums: list[list[int]] = []
        if len(keys) == 1 and local is not None:
            one = self.client.batch_get_into(keys, [memoryview(local)], sums=sums)[0]
            if not isinstance(one, StoreError):
                return W.Reply(codes=[0], locs=[(W.LOCAL, 0, one)], sums=sums), []
            if not isinstance(one, E.InvalidParams):  # InvalidParams: larger than the buffer
                return W.Reply(codes=[one.code], locs=[(W.INLINE, 0, 0)], sums=[[]]), []
            sums = []
        got = self.client.batch_get(keys, sums=sums)
        room = len(local) if local is not None else 0
        reply, pos, inline = W.Reply(sums=sums), 0, 0
        parts: list[bytes | bytearray | memoryview] = []
        for g in got:
            if isinstance(g, StoreError):
                reply.codes.append(g.code)
                reply.locs.append((W.INLINE, 0, 0))
                continue
            n = len(g)
            reply.codes.append(0)
            if local is not None and pos + n <= room:
                local[pos : pos + n] = g
                reply.locs.append((W.LOCAL, pos, n))
                pos += n
            else:
                parts.append(g)
                reply.locs.append((W.INLINE, inline, n))
                inline += n
        return reply, parts

    def _get_into(self, keys: list[str], locs: list[W.Loc]) -> Outcome:
        """Destinations in mapped memory are written in place; ``INLINE`` ones (capacity only)
        through a temporary buffer returned in the reply."""
        if len(locs) != len(keys):
            raise E.InvalidParams(f"{len(keys)} keys but {len(locs)} buffers")
        views: list[memoryview] = []
        for seg, _off, n in locs:
            views.append(
                memoryview(bytearray(n)) if seg == W.INLINE else self._view((seg, _off, n))
            )
        sums: list[list[int]] = []
        results = self.client.batch_get_into(keys, views, sums=sums)
        reply, inline = W.Reply(sums=sums), 0
        parts: list[bytes | bytearray | memoryview] = []
        for (seg, off, _n), view, r in zip(locs, views, results, strict=True):
            if isinstance(r, StoreError):
                reply.codes.append(r.code)
                reply.values.append(0)
                reply.locs.append((seg, off, 0))
                continue
            reply.codes.append(0)
            reply.values.append(r)
            if seg == W.INLINE:
                parts.append(view[:r])
                reply.locs.append((W.INLINE, inline, r))
                inline += r
            else:
                reply.locs.append((seg, off, r))
        return reply, parts


def _close(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:  # a view is still alive somewhere: the mapping goes with it
        log.warning("a dummy-client segment is still in use; it is unmapped when released")
