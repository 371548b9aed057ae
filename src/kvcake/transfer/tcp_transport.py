"""TCP transport: slices pipelined over pooled connections, spread over paths, with failover.

Each task is a *lane*: it takes a path (``PathHealth.choose``), borrows a connection, and pumps
slices from the group's shared queue with up to ``window`` in flight (replies are matched by
request id). When the connection breaks, the lane marks the path down, puts its unacknowledged
slices back at the front of the queue and carries on over another path; a slice that has failed
``max_attempts`` times, or finds no path at all, fails its request. Remote refusals (bad range,
unknown segment) fail the request without retry: another path would refuse it too.
"""

from __future__ import annotations

import collections
import math
import socket
import struct
import threading
from collections.abc import Callable

from typing_extensions import Buffer

from kvcake.core import framing
from kvcake.core.auth import TRANSFER, Authenticator, AuthError
from kvcake.core.errors import FramingError
from kvcake.transfer.batch import Batch, Job, Slice, cut
from kvcake.transfer.config import TransferConfig
from kvcake.transfer.errors import (
    AuthFailed,
    EndpointsExhausted,
    InvalidRequest,
    NoPathAvailable,
    OutOfRange,
    PathFailure,
    RemoteError,
    TransferError,
    UnknownSegment,
)
from kvcake.transfer.netserver import split_address
from kvcake.transfer.paths import PathHealth
from kvcake.transfer.pool import Endpoint, EndpointPool
from kvcake.transfer.protocol import (
    CODEC,
    MAX_ENTRIES,
    Ack,
    AckV,
    Fail,
    Probe,
    ReadReq,
    ReadV,
    WriteReq,
    WriteV,
    request_limits,
)
from kvcake.transfer.stream import FrameReader, send_all
from kvcake.transfer.transport import Task, Transport
from kvcake.transfer.types import Op, PathInfo, SegmentInfo

_REMOTE_ERRORS: dict[str, type[TransferError]] = {
    "OutOfRange": OutOfRange,
    "UnknownSegment": UnknownSegment,
    "InvalidRequest": InvalidRequest,
}
_REPLY_LIMITS = request_limits(2**40)


class TransferHooks:
    """Test hooks. ``after_send(address, n)`` runs in the lane after the n-th slice sent on
    ``address`` (e.g. to kill that path mid-transfer)."""

    def __init__(self) -> None:
        self.after_send: Callable[[str, int], None] | None = None
        self._sent: dict[str, int] = {}
        self._lock = threading.Lock()

    def sent(self, address: str) -> None:
        if self.after_send is None:
            return
        with self._lock:
            n = self._sent[address] = self._sent.get(address, 0) + 1
        self.after_send(address, n)


class SliceQueue:
    """Slices striped over lanes (slice i -> lane i mod n, so every lane and hence every path
    gets work); a lane whose own share is done and has nothing in flight steals one slice from
    the back of the fullest other."""

    def __init__(self, slices: list[Slice], lanes: int):
        self._qs = [collections.deque(slices[i::lanes]) for i in range(lanes)]
        self._started = [False] * lanes
        self._lock = threading.Lock()

    def pop(self, lane: int, steal: bool = True) -> Slice | None:
        with self._lock:
            self._started[lane] = True
            own = self._qs[lane]
            if own:
                return own.popleft()
            if not steal:
                return None
            # Only lanes that run are robbed, so every lane (and its path) gets its first slices
            # even when another lane's thread happened to start much earlier.
            started = [q for q, st in zip(self._qs, self._started, strict=True) if st]
            victim = max(started, key=len)
            return victim.pop() if victim else None

    def take(self, lane: int, count: int, max_bytes: int, steal: bool) -> list[Slice]:
        """Up to ``count`` slices (and about ``max_bytes``) of this lane's own share under one
        lock; with ``steal`` and an empty share, one slice stolen as :meth:`pop` does."""
        with self._lock:
            self._started[lane] = True
            own = self._qs[lane]
            if own:
                out: list[Slice] = []
                size = 0
                while own and len(out) < count and size < max_bytes:
                    s = own.popleft()
                    out.append(s)
                    size += s.length
                return out
        if not steal:
            return []
        stolen = self.pop(lane, steal=True)
        return [stolen] if stolen is not None else []

    def push_front(self, lane: int, slices: list[Slice]) -> None:
        with self._lock:
            self._qs[lane].extendleft(reversed(slices))

    def drain(self) -> list[Slice]:
        with self._lock:
            out = [s for q in self._qs for s in q]
            for q in self._qs:
                q.clear()
            return out

    def __bool__(self) -> bool:
        return any(self._qs)


def probe(address: str, timeout_s: float, auth: Authenticator | None = None) -> bool:
    """Does a fresh connection to ``address`` answer a ``Probe``?"""
    try:
        host, port = split_address(address)
        with socket.create_connection((host, port), timeout_s) as sock:
            if auth is not None:
                auth.client_handshake(sock, TRANSFER, address)
            sock.settimeout(timeout_s)
            framing.send_frame(sock, CODEC, 1, Probe())
            frame = framing.read_frame(sock, CODEC, _REPLY_LIMITS)
            return frame is not None and isinstance(frame.msg, Ack)
    except (OSError, FramingError, ValueError, AuthError):
        return False


class TcpTransport(Transport):
    name = "tcp"

    def __init__(
        self,
        cfg: TransferConfig,
        pool: EndpointPool,
        health: PathHealth,
        hooks: TransferHooks,
        on_unknown_segment: Callable[[str], None] = lambda _n: None,
    ):
        self.cfg = cfg
        self.pool = pool
        self.health = health
        self.hooks = hooks
        self._on_unknown = on_unknown_segment
        # A vectored frame carries at most this many bytes (the peer's server_max_data, assumed
        # to be this engine's, bounds it; 16 MiB keeps a lane's replies coming).
        self._frame_bytes = max(cfg.slice_size, min(cfg.server_max_data, 16 << 20))

    def usable(self, target: SegmentInfo) -> bool:
        return bool(target.paths)

    def tasks(self, batch: Batch, jobs: list[Job]) -> list[Task]:
        slices = [s for j in jobs for s in cut(j, self.cfg.slice_size)]
        total = sum(j.length for j in jobs)
        lanes = max(1, min(self.cfg.streams, len(slices), math.ceil(total / self.cfg.lane_bytes)))
        queue = SliceQueue(slices, lanes)
        paths = jobs[0].target.paths
        return [self._lane_task(batch, queue, paths, i) for i in range(lanes)]

    def run_single(self, op: Op, local: memoryview, target: SegmentInfo, offset: int) -> bool:
        """Fast path for one small request in the caller's thread, without batch machinery.
        Returns False when the path failed (it is marked down; the caller then goes through
        the general path, which fails over); raises the remote refusal, if any."""
        addr = self.health.choose(target.paths, 0)
        if addr is None:
            return False
        try:
            ep = self.pool.acquire(addr)
        except EndpointsExhausted:
            return False
        except PathFailure:  # (AuthFailed is not one: it reaches the caller)
            self._path_failed(addr)
            return False
        try:
            rid = ep.next_rid()
            n = local.nbytes
            if op is Op.WRITE:
                meta = CODEC.encode(WriteReq(target.name, offset))
                send_all(ep.sock, [framing.pack_header(rid, len(meta), n) + meta, local])
            else:
                meta = CODEC.encode(ReadReq(target.name, offset, n))
                ep.sock.sendall(framing.pack_header(rid, len(meta), 0) + meta)
            if self.hooks.after_send is not None:
                self.hooks.sent(addr)
            err = self._recv(ep.reader, rid, op, local, target)
        except AuthError as exc:  # the peer wants a secret (before FramingError: a subclass)
            self.pool.release(ep, healthy=False)
            raise AuthFailed(str(exc)) from exc
        except (OSError, FramingError, PathFailure):
            self.pool.release(ep, healthy=False)
            self._path_failed(addr)
            return False
        except BaseException:
            self.pool.release(ep, healthy=False)
            raise
        self.pool.release(ep)
        if err is not None:
            raise err
        return True

    def _lane_task(
        self, batch: Batch, q: SliceQueue, paths: tuple[PathInfo, ...], lane: int
    ) -> Task:
        return lambda: self._lane(batch, q, paths, lane)

    def _lane(self, batch: Batch, q: SliceQueue, paths: tuple[PathInfo, ...], lane: int) -> None:
        while q:
            addr = self.health.choose(paths, lane)
            if addr is None:
                for s in q.drain():
                    # The owner may be gone for good: look the segment up afresh next time.
                    self._on_unknown(s.job.target.name)
                    batch.slice_done(s, NoPathAvailable(f"no path to {s.job.target.owner} works"))
                return
            try:
                ep = self.pool.acquire(addr)
            except EndpointsExhausted:
                continue  # other lanes hold every endpoint: wait again, the path is not at fault
            except AuthFailed as exc:  # every path of this peer has the same secret
                for s in q.drain():
                    batch.slice_done(s, exc)
                return
            except PathFailure:
                self._path_failed(addr)
                continue
            inflight: collections.deque[tuple[int, list[Slice]]] = collections.deque()
            try:
                last = self._pump(batch, q, lane, ep, inflight)
            except AuthError as exc:  # before FramingError (AuthRequired is a MalformedFrame)
                self.pool.release(ep, healthy=False)
                auth_err = AuthFailed(str(exc))
                for s in [s for _, f in inflight for s in f] + q.drain():
                    batch.slice_done(s, auth_err)
                return
            except (OSError, FramingError, PathFailure) as exc:
                self.pool.release(ep, healthy=False)
                self._path_failed(addr)
                self._requeue(batch, q, lane, [s for _, f in inflight for s in f], exc)
                continue
            except Exception as exc:  # a bug or a released buffer: fail, never hang the batch
                self.pool.release(ep, healthy=False)
                err = TransferError(f"transfer aborted: {exc!r}")
                for s in [s for _, f in inflight for s in f] + q.drain():
                    batch.slice_done(s, err)
                return
            self.pool.release(ep)
            if last is not None:  # reported after the release, so a finished batch holds none
                batch.slices_done(last)

    def _path_failed(self, addr: str) -> None:
        self.health.mark_down(addr)
        self.pool.invalidate(addr)

    def _requeue(
        self, batch: Batch, q: SliceQueue, lane: int, slices: list[Slice], exc: BaseException
    ) -> None:
        retry = []
        for s in slices:
            s.attempts += 1
            if s.attempts >= self.cfg.max_attempts:
                batch.slice_done(s, PathFailure(f"slice failed {s.attempts} times, last: {exc!r}"))
            else:
                retry.append(s)
        q.push_front(lane, retry)

    def _pump(
        self,
        batch: Batch,
        q: SliceQueue,
        lane: int,
        ep: Endpoint,
        inflight: collections.deque[tuple[int, list[Slice]]],
    ) -> list[tuple[Slice, TransferError | None]] | None:
        """Run slices until the queue is empty; the last reply's outcomes are returned, not
        reported. Each round's slices go out as vectored frames (one per op and at most
        ``MAX_ENTRIES`` / ``frame_bytes`` each) in one ``sendmsg``."""
        window, max_bytes = self.cfg.window, self.cfg.window_bytes
        pending_bytes = 0
        pending = 0  # slices in flight
        while True:
            fresh: list[Slice] = []
            if pending < window and pending_bytes < max_bytes:
                # Steal only when idle, one slice at a time: a lane with a deep window would
                # otherwise swallow the other lanes' shares (and paths) in one go.
                fresh = q.take(lane, window - pending, max_bytes - pending_bytes, not inflight)
                for s in fresh:
                    pending_bytes += s.length
            if fresh:
                parts: list[Buffer] = []
                for frame in self._frames(fresh):
                    rid = ep.next_rid()
                    inflight.append((rid, frame))
                    self._vrequest(parts, rid, frame)
                pending += len(fresh)
                send_all(ep.sock, parts)
                if self.hooks.after_send is not None:
                    for _ in fresh:
                        self.hooks.sent(ep.address)
            if not inflight:
                return None
            rid, frame = inflight[0]
            outcomes = self._vrecv(ep.reader, rid, frame)
            inflight.popleft()
            pending -= len(frame)
            for s in frame:
                pending_bytes -= s.length
            if not inflight and not q:
                return outcomes
            batch.slices_done(outcomes)

    def _frames(self, slices: list[Slice]) -> list[list[Slice]]:
        """Group a round's slices into frames: one op each, bounded entries and bytes."""
        cap = self._frame_bytes
        out: list[list[Slice]] = []
        for op in (Op.WRITE, Op.READ):
            cur: list[Slice] = []
            size = 0
            for s in slices:
                if s.job.op is not op:
                    continue
                if cur and (len(cur) >= MAX_ENTRIES or size + s.length > cap):
                    out.append(cur)
                    cur, size = [], 0
                cur.append(s)
                size += s.length
            if cur:
                out.append(cur)
        return out

    def _vrequest(self, parts: list[Buffer], rid: int, frame: list[Slice]) -> None:
        """One vectored request: header + meta (segment table, descriptor rows) and, for a
        write, one part per slice straight from initiator memory."""
        segs: dict[str, int] = {}
        rows: list[int] = []
        total = 0
        for s in frame:
            job = s.job
            name = job.target.name
            idx = segs.get(name)
            if idx is None:
                idx = segs[name] = len(segs)
            rows += (idx, job.target_offset + s.offset, s.length)
            total += s.length
        desc = struct.pack(f"<{len(rows)}q", *rows)
        if frame[0].job.op is Op.WRITE:
            meta = CODEC.encode(WriteV(list(segs), desc))
            parts.append(framing.pack_header(rid, len(meta), total) + meta)
            parts.extend(s.local for s in frame)
        else:
            meta = CODEC.encode(ReadV(list(segs), desc))
            parts.append(framing.pack_header(rid, len(meta), 0) + meta)

    def _vrecv(
        self, reader: FrameReader, rid: int, frame: list[Slice]
    ) -> list[tuple[Slice, TransferError | None]]:
        """Read the reply to a vectored request: per-slice outcomes (refusals returned); a
        read's bytes land straight in initiator memory, one ``recvmsg_into`` per wake-up."""
        msg, data_len = _read_reply(reader, rid)
        if isinstance(msg, Fail):
            if data_len:
                raise framing.MalformedFrame("a Fail reply carries no data")
            err = self._remote_error(msg.kind, msg.message, frame)
            return [(s, err) for s in frame]
        if not isinstance(msg, AckV):
            raise framing.MalformedFrame(f"unexpected reply {type(msg).__name__}")
        bad: dict[int, TransferError] = {}
        for i, kind, message in msg.failed:
            if not 0 <= i < len(frame):
                raise framing.MalformedFrame(f"reply names entry {i} of {len(frame)}")
            bad[i] = self._remote_error(kind, message, [frame[i]])
        if frame[0].job.op is Op.READ:
            views = [s.local for i, s in enumerate(frame) if i not in bad] if bad else None
            if views is None:
                views = [s.local for s in frame]
            expect = 0
            for v in views:
                expect += v.nbytes
            if data_len != expect:
                raise framing.MalformedFrame(f"reply of {data_len} bytes, expected {expect}")
            reader.read_into_views(views)
        elif data_len:
            raise framing.MalformedFrame("a write's reply carries no data")
        if not bad:
            return [(s, None) for s in frame]
        return [(s, bad.get(i)) for i, s in enumerate(frame)]

    def _remote_error(self, kind: str, message: str, slices: list[Slice]) -> TransferError:
        if kind == "UnknownSegment":
            for s in slices:
                self._on_unknown(s.job.target.name)
        return _REMOTE_ERRORS.get(kind, RemoteError)(f"remote: {message}")

    def _recv(
        self, reader: FrameReader, rid: int, op: Op, local: memoryview, target: SegmentInfo
    ) -> TransferError | None:
        """Read the reply to a single request; a refusal is returned, a broken stream raises."""
        msg, data_len = _read_reply(reader, rid)
        if type(msg) is not Ack:
            if isinstance(msg, Fail):
                if data_len:
                    raise framing.MalformedFrame("a Fail reply carries no data")
                if msg.kind == "UnknownSegment":
                    self._on_unknown(target.name)
                return _REMOTE_ERRORS.get(msg.kind, RemoteError)(f"remote: {msg.message}")
            raise framing.MalformedFrame(f"unexpected reply {type(msg).__name__}")
        n = local.nbytes
        expect = n if op is Op.READ else 0
        if data_len != expect or msg.length != n:
            raise framing.MalformedFrame(f"reply of {data_len} bytes, expected {expect}")
        if expect:
            reader.read_into(local)
        return None


def _read_reply(reader: FrameReader, rid: int) -> tuple[object, int]:
    """The reply to request ``rid``: its message and the length of the data that follows."""
    head = reader.read_head(_REPLY_LIMITS)
    if head is None:
        raise framing.TruncatedFrame("transfer server closed the connection")
    reply_rid, meta_len, data_len = head
    if reply_rid != rid:
        raise framing.MalformedFrame(f"reply {reply_rid} does not match request {rid}")
    return reader.read_msg(CODEC, meta_len), data_len
