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
import dataclasses
import enum
import math
import socket
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from typing_extensions import Buffer

from kvcake.core import framing
from kvcake.core.auth import TRANSFER, Authenticator, AuthError
from kvcake.core.errors import FramingError, MalformedFrame
from kvcake.net.netserver import split_address
from kvcake.transfer import scatter
from kvcake.transfer.batch import Batch, Job, Slice, SliceQueue, cut
from kvcake.transfer.config import TransferConfig
from kvcake.transfer.errors import (
    AuthFailed,
    EndpointsExhausted,
    NoPathAvailable,
    PathFailure,
    TransferError,
    UnknownSegment,
)
from kvcake.transfer.paths import PathHealth
from kvcake.transfer.planner import Merged
from kvcake.transfer.pool import Endpoint, EndpointPool
from kvcake.transfer.protocol import (
    CODEC,
    MAX_ENTRIES,
    Ack,
    Fail,
    Probe,
    ReadReq,
    WriteReq,
)
from kvcake.transfer.stream import FrameReader, send_all
from kvcake.transfer.transport import Task, Transport
from kvcake.transfer.types import Landed, Op, PathInfo, SegmentInfo
from kvcake.transfer.vector import (
    REPLY_LIMITS,
    Refusals,
    add_request,
    read_reply,
    read_vreply,
    remote_error,
)

T = TypeVar("T")


class Failed(enum.Enum):
    PATH_FAILED = "path failed"


PATH_FAILED = Failed.PATH_FAILED  # an inline attempt's path broke: take the general path
# One frame's outcome: one error for the whole frame, per-entry refusals (None: all fine), or
# PATH_FAILED.
Outcome = TransferError | Refusals | Failed


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


def probe(address: str, timeout_s: float, auth: Authenticator | None = None) -> bool:
    """Does a fresh connection to ``address`` answer a ``Probe``?"""
    try:
        host, port = split_address(address)
        with socket.create_connection((host, port), timeout_s) as sock:
            if auth is not None:
                auth.client_handshake(sock, TRANSFER, address)
            sock.settimeout(timeout_s)
            framing.send_frame(sock, CODEC, 1, Probe())
            frame = framing.read_frame(sock, CODEC, REPLY_LIMITS)
            return frame is not None and isinstance(frame.msg, Ack)
    except (OSError, FramingError, ValueError, AuthError):
        return False


@dataclasses.dataclass(frozen=True, slots=True)
class VectorPlan:
    """One batch as one vectored frame (``TransferEngine._vector_plan``): ``runs`` are the
    coalesced requests (``planner.merge``), ``views`` and ``rows`` their local memory and
    wire rows, all in ``target``."""

    transport: TcpTransport
    op: Op
    views: list[memoryview]
    target: SegmentInfo
    rows: list[int]
    total: int
    runs: Merged
    fence: int = 0  # every entry's (transfer/fences.py)

    def run(self) -> Outcome:
        """The frame, in the caller's thread (:meth:`TcpTransport.run_vectors`)."""
        return self.transport.run_vectors([self])[0]


def _frame_landed(frame: list[Slice]) -> Callable[[int, int, int], None] | None:
    """Entry ``k``'s progress told to its job's ``landed`` in the job's offsets (None: no
    job of the frame listens)."""
    if all(s.job.landed is None for s in frame):
        return None

    def landed(k: int, a: int, b: int) -> None:
        s = frame[k]
        if s.job.landed is not None:
            s.job.landed(s.offset + a, s.offset + b)

    return landed


def _send_telling(sock: socket.socket, parts: list[Buffer], told: dict[int, Slice]) -> None:
    """``send_all(parts)``; each write slice of ``told`` is told to its job (``Job.landed``)
    right after its part is sent, while the peer takes it in and the bytes the send just read
    are still in the cache (the store sums a put's value this way: store/landing.py)."""
    start = 0
    for i, s in told.items():  # in part order
        assert s.job.landed is not None
        send_all(sock, parts[start : i + 1])
        s.job.landed(s.offset, s.offset + s.length)
        start = i + 1
    if start < len(parts):
        send_all(sock, parts[start:])


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
        self.frame_bytes = max(cfg.slice_size, min(cfg.server_max_data, 16 << 20))

    def usable(self, target: SegmentInfo) -> bool:
        return bool(target.paths)

    def tasks(self, batch: Batch, jobs: list[Job]) -> list[Task]:
        slices = [s for j in jobs for s in cut(j, self.cfg.slice_size)]
        total = sum(j.length for j in jobs)
        lanes = max(1, min(self.cfg.streams, len(slices), math.ceil(total / self.cfg.lane_bytes)))
        queue = SliceQueue(slices, lanes)
        paths = jobs[0].target.paths
        return [self._lane_task(batch, queue, paths, i) for i in range(lanes)]

    def _inline(self, target: SegmentInfo, work: Callable[..., T], *args: object) -> T | Failed:
        """``work(endpoint, *args)`` on a pooled connection to ``target``, in the caller's
        thread (arguments passed through: no closure on the 4 KB latency path). Returns
        ``PATH_FAILED`` when the path failed (it is marked down; the caller then goes through
        the general path, which fails over); an AuthError reaches the caller as AuthFailed."""
        addr = self.health.choose(target.paths, 0)
        if addr is None:
            return PATH_FAILED
        try:
            ep = self.pool.acquire(addr)
        except EndpointsExhausted:
            return PATH_FAILED
        except PathFailure:  # (AuthFailed is not one: it reaches the caller)
            self._path_failed(addr)
            return PATH_FAILED
        try:
            out = work(ep, *args)
        except AuthError as exc:  # the peer wants a secret (before FramingError: a subclass)
            self.pool.release(ep, healthy=False)
            raise AuthFailed(str(exc)) from exc
        except (OSError, FramingError, PathFailure):
            self.pool.release(ep, healthy=False)
            self._path_failed(addr)
            return PATH_FAILED
        except BaseException:
            self.pool.release(ep, healthy=False)
            raise
        self.pool.release(ep)
        return out

    def run_single(
        self,
        op: Op,
        local: memoryview,
        target: SegmentInfo,
        offset: int,
        landed: Landed | None = None,
        fence: int = 0,
    ) -> bool:
        """Fast path for one request of at most one slice in the caller's thread, without
        batch machinery. Returns False when the path failed (see :meth:`_inline`) or the
        request is larger; raises the remote refusal."""
        if local.nbytes > self.cfg.slice_size:
            return False
        err = self._inline(target, self._single, op, local, target, offset, landed, fence)
        if err is PATH_FAILED:
            return False
        if err is not None:
            raise err
        return True

    def _single(
        self,
        ep: Endpoint,
        op: Op,
        local: memoryview,
        target: SegmentInfo,
        offset: int,
        landed: Landed | None,
        fence: int = 0,
    ) -> TransferError | None:
        ep.rid += 1
        rid = ep.rid
        n = local.nbytes
        if op is Op.WRITE:
            meta = CODEC.encode(WriteReq(target.name, offset, fence))
            send_all(ep.sock, [framing.pack_header(rid, len(meta), n) + meta, local])
            if landed is not None:  # summed while the peer takes the bytes in (types.Landed)
                landed(0, n)
        else:
            meta = CODEC.encode(ReadReq(target.name, offset, n))
            ep.sock.sendall(framing.pack_header(rid, len(meta), 0) + meta)
        if self.hooks.after_send is not None:
            self.hooks.sent(ep.address)
        return self._recv(ep.reader, rid, op, local, target, landed)

    def vector_fits(self, entries: int, total: int) -> bool:
        """Would the general path run these entries as one lane and one frame?"""
        return entries <= MAX_ENTRIES and total <= min(self.frame_bytes, self.cfg.lane_bytes)

    def run_vectors(self, plans: Sequence[VectorPlan]) -> list[Outcome]:
        """The frames of ``plans`` (one target segment, one op; see :class:`VectorPlan`) in
        the caller's thread, sent back to back on one pooled connection, then their replies
        in order: each plan's refusals, or ``PATH_FAILED`` for every frame whose reply did
        not arrive (the caller then runs those batches through the general path). One plan:
        the inline path of a batch that :meth:`vector_fits`."""
        target = plans[0].target
        outs: list[Outcome] = [PATH_FAILED] * len(plans)

        def work(ep: Endpoint) -> None:
            rids: list[int] = []
            parts: list[Buffer] = []
            for p in plans:
                rids.append(ep.next_rid())
                fences = [p.fence] * len(p.views) if p.fence else None
                add_request(parts, rids[-1], p.op, [target.name], p.rows, p.views, p.total, fences)
            send_all(ep.sock, parts)
            if self.hooks.after_send is not None:
                for p in plans:
                    for _ in p.views:  # one call per entry, as the lanes make one per slice
                        self.hooks.sent(ep.address)
            for k, p in enumerate(plans):
                outs[k] = read_vreply(ep.reader, rids[k], p.op, p.views)

        self._inline(target, work)
        for out in outs:
            if isinstance(out, UnknownSegment) or (
                isinstance(out, dict) and any(isinstance(e, UnknownSegment) for e in out.values())
            ):
                self._on_unknown(target.name)
                break
        return outs

    def read_scatter(
        self,
        target: SegmentInfo,
        reads: Sequence[scatter.ScatterRead],
        groups: list[list[int]],
        gate: scatter.Gate | None,
        chunk: int,
    ) -> dict[int, scatter.Outcome] | None:
        """``reads`` named by ``groups`` (one frame each) straight into their ranges, in the
        caller's thread (:mod:`.scatter`); None: the path failed (read another way)."""
        out = self._inline(
            target, scatter.run, target.name, reads, groups, gate, chunk, self.cfg.io_timeout_s
        )
        if out is PATH_FAILED:
            return None
        if any(isinstance(o, UnknownSegment) for o in out.values()):
            self._on_unknown(target.name)
        return out

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
                told: dict[int, Slice] = {}  # part index -> a write slice whose job listens
                for frame in self._frames(fresh):
                    rid = ep.next_rid()
                    inflight.append((rid, frame))
                    self._vrequest(parts, rid, frame)
                    if frame[0].job.op is Op.WRITE:
                        base = len(parts) - len(frame)
                        told.update(
                            (base + k, s) for k, s in enumerate(frame) if s.job.landed is not None
                        )
                pending += len(fresh)
                _send_telling(ep.sock, parts, told)
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
        cap = self.frame_bytes
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
        """One vectored request for a frame of slices (see :func:`.vector.add_request`)."""
        segs: dict[str, int] = {}
        rows: list[int] = []
        fences: list[int] = []
        total = 0
        for s in frame:
            job = s.job
            fences.append(job.fence)
            name = job.target.name
            idx = segs.get(name)
            if idx is None:
                idx = segs[name] = len(segs)
            rows += (idx, job.target_offset + s.offset, s.length)
            total += s.length
        op = frame[0].job.op
        data = [s.local for s in frame] if op is Op.WRITE else []
        add_request(parts, rid, op, list(segs), rows, data, total, fences if any(fences) else None)

    def _vrecv(
        self, reader: FrameReader, rid: int, frame: list[Slice]
    ) -> list[tuple[Slice, TransferError | None]]:
        """Per-slice outcomes of the reply to a frame of slices (refusals returned)."""
        out = read_vreply(
            reader, rid, frame[0].job.op, [s.local for s in frame], _frame_landed(frame)
        )
        if out is None:
            return [(s, None) for s in frame]
        bad = dict.fromkeys(range(len(frame)), out) if isinstance(out, TransferError) else out
        for i, err in bad.items():
            if isinstance(err, UnknownSegment):
                self._on_unknown(frame[i].job.target.name)
        return [(s, bad.get(i)) for i, s in enumerate(frame)]

    def _recv(
        self,
        reader: FrameReader,
        rid: int,
        op: Op,
        local: memoryview,
        target: SegmentInfo,
        landed: Landed | None = None,
    ) -> TransferError | None:
        """Read the reply to a single request; a refusal is returned, a broken stream raises."""
        msg, data_len = read_reply(reader, rid)
        if type(msg) is not Ack:
            if isinstance(msg, Fail):
                if data_len:
                    raise MalformedFrame("a Fail reply carries no data")
                if msg.kind == "UnknownSegment":
                    self._on_unknown(target.name)
                return remote_error(msg.kind, msg.message)
            raise MalformedFrame(f"unexpected reply {type(msg).__name__}")
        n = local.nbytes
        expect = n if op is Op.READ else 0
        if data_len != expect or msg.length != n:
            raise MalformedFrame(f"reply of {data_len} bytes, expected {expect}")
        if expect:
            reader.read_into(local, landed)
        return None
