"""TCP transport: one request or one vectored frame inline in the caller's thread (the latency
path), everything else through :class:`~kvcake.transfer.lanes.Lanes` (slices pipelined over
pooled connections, spread over paths, with failover).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import socket
from collections.abc import Callable, Sequence
from typing import TypeVar

from typing_extensions import Buffer

from kvcake.core import framing
from kvcake.core.auth import TRANSFER, Authenticator, AuthError
from kvcake.core.errors import FramingError, MalformedFrame
from kvcake.net.netserver import split_address
from kvcake.transfer import scatter
from kvcake.transfer.batch import Batch, Job, SliceQueue, cut
from kvcake.transfer.config import TransferConfig
from kvcake.transfer.errors import (
    AuthFailed,
    EndpointsExhausted,
    PathFailure,
    TransferError,
    UnknownSegment,
)
from kvcake.transfer.lanes import Lanes, TransferHooks
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
from kvcake.transfer.types import Landed, Op, SegmentInfo
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
        self.lanes = Lanes(cfg, pool, health, hooks, on_unknown_segment)
        self.frame_bytes = self.lanes.frame_bytes

    def usable(self, target: SegmentInfo) -> bool:
        return bool(target.paths)

    def tasks(self, batch: Batch, jobs: list[Job]) -> list[Task]:
        slices = [s for j in jobs for s in cut(j, self.cfg.slice_size)]
        total = sum(j.length for j in jobs)
        lanes = max(1, min(self.cfg.streams, len(slices), math.ceil(total / self.cfg.lane_bytes)))
        queue = SliceQueue(slices, lanes)
        paths = jobs[0].target.paths
        return [self.lanes.task(batch, queue, paths, i) for i in range(lanes)]

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
            self.lanes.path_failed(addr)
            return PATH_FAILED
        try:
            out = work(ep, *args)
        except AuthError as exc:  # the peer wants a secret (before FramingError: a subclass)
            self.pool.release(ep, healthy=False)
            raise AuthFailed(str(exc)) from exc
        except (OSError, FramingError, PathFailure):
            self.pool.release(ep, healthy=False)
            self.lanes.path_failed(addr)
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
