"""The TCP transport's general path: *lanes* (:class:`Lanes`).

Each task is a lane: it takes a path (``PathHealth.choose``), borrows a connection, and pumps
slices from the group's shared queue with up to ``window`` in flight (replies are matched by
request id). When the connection breaks, the lane marks the path down, puts its unacknowledged
slices back at the front of the queue and carries on over another path; a slice that has failed
``max_attempts`` times, or finds no path at all, fails its request. Remote refusals (bad range,
unknown segment) fail the request without retry: another path would refuse it too.
"""

from __future__ import annotations

import collections
import socket
import threading
from collections.abc import Callable

from typing_extensions import Buffer

from kvcake.core.auth import AuthError
from kvcake.core.errors import FramingError
from kvcake.transfer.batch import Batch, Slice, SliceQueue
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
from kvcake.transfer.pool import Endpoint, EndpointPool
from kvcake.transfer.protocol import MAX_ENTRIES
from kvcake.transfer.stream import FrameReader, send_all
from kvcake.transfer.transport import Task
from kvcake.transfer.types import Op, PathInfo
from kvcake.transfer.vector import add_request, read_vreply


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


class Lanes:
    """Runs a batch's slices over pooled connections (:meth:`task`: one lane's task).

    Invariants: a lane holds at most one pooled endpoint at a time and releases it (marked
    unhealthy when its stream broke) before it takes another or returns; every slice a lane
    takes from the queue is reported to the batch exactly once -- done, failed, or put back at
    the queue's front for another attempt (``max_attempts`` in all). The slices' memory is the
    caller's; lanes only read it (writes) or fill it (reads)."""

    def __init__(
        self,
        cfg: TransferConfig,
        pool: EndpointPool,
        health: PathHealth,
        hooks: TransferHooks,
        on_unknown_segment: Callable[[str], None],
    ):
        self.cfg = cfg
        self.pool = pool
        self.health = health
        self.hooks = hooks
        self._on_unknown = on_unknown_segment
        # A vectored frame carries at most this many bytes (the peer's server_max_data, assumed
        # to be this engine's, bounds it; 16 MiB keeps a lane's replies coming).
        self.frame_bytes = max(cfg.slice_size, min(cfg.server_max_data, 16 << 20))

    def task(self, batch: Batch, q: SliceQueue, paths: tuple[PathInfo, ...], lane: int) -> Task:
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
                self.path_failed(addr)
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
                self.path_failed(addr)
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

    def path_failed(self, addr: str) -> None:
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
