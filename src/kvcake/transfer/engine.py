"""The Transfer Engine: segments, batches, transport choice.

Threading: any number of threads may call every method. ``submit`` validates and plans in the
caller's thread, then hands transport tasks to a worker pool; the ``transfer_sync_*``,
``write`` and ``read_into`` conveniences run their first task inline (a small transfer then
costs no thread hand-off). Memory: see :mod:`kvcake.transfer.segments`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import secrets
from collections.abc import Callable, Sequence

from kvcake.core import auth as _auth
from kvcake.core.ids import BatchId, SegmentName
from kvcake.core.pools import started_pool
from kvcake.transfer import scatter, shm
from kvcake.transfer.batch import Batch, Claimable, Job, failure
from kvcake.transfer.batchtable import BatchTable
from kvcake.transfer.config import TransferConfig
from kvcake.transfer.errors import InvalidRequest, TransferError, TransferTimeout
from kvcake.transfer.lanes import TransferHooks
from kvcake.transfer.metadata import DirectoryClient
from kvcake.transfer.paths import PathHealth
from kvcake.transfer.pipeline import FramePipeline, PipeItem
from kvcake.transfer.planner import Item, merge, run_results, uniform_runs
from kvcake.transfer.pool import EndpointPool
from kvcake.transfer.protocol import MAX_ENTRIES
from kvcake.transfer.registry import SegmentRegistry, Topology
from kvcake.transfer.segments import BufferLike, as_byte_view, check_range
from kvcake.transfer.server import TransferServer
from kvcake.transfer.shm_transport import ShmTransport
from kvcake.transfer.tcp_transport import (
    PATH_FAILED,
    Outcome,
    TcpTransport,
    VectorPlan,
    probe,
)
from kvcake.transfer.transport import Task, Transport
from kvcake.transfer.types import (
    BatchResult,
    BatchStatus,
    Landed,
    Op,
    PathInfo,
    SegmentInfo,
    TransferRequest,
)

log = logging.getLogger(__name__)


class TransferEngine:
    """See ``docs/transfer.md``. ``directory`` is the ``host:port`` of a DirectoryService
    (or ``None`` for an engine that only talks to its own segments)."""

    def __init__(
        self,
        directory: str | None,
        hostname: str = "127.0.0.1",
        listen_hosts: tuple[str, ...] = ("127.0.0.1",),
        protocol: str = "auto",
        config: TransferConfig | None = None,
        topology: Topology | None = None,
        cleanup_stale_shm: bool = True,
        auth: _auth.Authenticator | None = None,
        listen_port: int = 0,  # 0: the OS picks (compat.mooncake asks for Mooncake's range)
    ):
        base = config or TransferConfig()
        # The shared secret (None: the environment's, see kvcake.core.auth.resolve).
        self.auth = auth = _auth.resolve(auth)
        self.config = (
            base if protocol == base.protocol else dataclasses.replace(base, protocol=protocol)
        )
        self.hostname = hostname
        self.owner = f"{hostname}/{os.getpid()}/{secrets.token_hex(4)}"
        if cleanup_stale_shm:
            shm.cleanup_stale()
        self._batches = BatchTable(self.config.max_batches, self.config.batch_ttl_s)
        self._ids = itertools.count(1)
        self._closed = False
        self.directory = DirectoryClient(directory, auth=auth) if directory else None
        self.registry = SegmentRegistry(
            self.owner, hostname, self.directory, lambda: self.server.addresses, topology
        )
        self.host_id = self.registry.host_id
        self._segments = self.registry.table
        self.server = TransferServer(
            self._segments,
            listen_hosts,
            self.config.server_max_data,
            self.config.busy_poll_us,
            auth=auth,
            port=listen_port,
        )
        self.server.start()
        cfg = self.config
        self.pool = EndpointPool(
            cfg.max_endpoints, cfg.connect_timeout_s, cfg.io_timeout_s, cfg.busy_poll_us, auth
        )
        self.health = PathHealth(
            lambda a: probe(a, cfg.connect_timeout_s, auth), cfg.probe_interval_s
        )
        self.hooks = TransferHooks()
        self.transports: dict[str, Transport] = {
            "shm": ShmTransport(
                self.owner, self.host_id, self._segments, cfg.max_peer_maps, self.registry.forget
            ),
            "tcp": TcpTransport(cfg, self.pool, self.health, self.hooks, self.registry.forget),
        }
        self._executor = started_pool(cfg.workers, "kvcake-xfer")
        self._pipeline = FramePipeline(
            cfg.window, cfg.window_bytes, self._finish_frame, self._abort_frame
        )

    # --- segments -------------------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        """This engine's transfer-server addresses (one per listen host)."""
        return list(self.server.addresses)

    def cut_inbound(self) -> int:
        """Cut every connection peers opened to this engine's server (they reconnect); after
        it returns, no byte that arrives on them reaches a segment. See
        ``ThreadedServer.cut_connections``."""
        return self.server.cut_connections()

    def register_memory(
        self, name: str, buffer: BufferLike, location: str | None = None
    ) -> SegmentInfo:
        """Expose a writable buffer-protocol object as segment ``name``. The caller keeps
        owning the memory and must keep it alive until :meth:`unregister`."""
        self._check_open()
        return self.registry.register(name, buffer, location)

    def allocate_segment(self, name: str, size: int, location: str | None = None) -> memoryview:
        """Create a ``/dev/shm``-backed segment owned by the engine (same-host peers map it)."""
        self._check_open()
        return self.registry.allocate(name, size, location)

    def unregister(self, name: str) -> None:
        """Unpublish ``name``; engine-owned shm memory is unlinked."""
        self.registry.unregister(name)
        self.server.fences.forget(name)

    def segment_info(self, name: str) -> SegmentInfo:
        """Where segment ``name`` lives (this engine's or any peer's), asked afresh from the
        directory for a peer's segment; raises UnknownSegment."""
        return self.registry.info(name)

    def local_segments(self) -> list[str]:
        return self.registry.names()

    # --- batches --------------------------------------------------------------------------

    def _transport_for(self, target: SegmentInfo) -> Transport:
        proto = self.config.protocol
        if proto != "auto":
            t = self.transports[proto]
            if not t.usable(target):
                raise TransferError(f"protocol {proto!r} cannot reach segment {target.name!r}")
            return t
        for t in self.transports.values():
            if t.usable(target):
                return t
        raise TransferError(f"no transport can reach segment {target.name!r}")

    def reads_by_mapping(self, segment: str) -> bool:
        """Whether reads of ``segment`` are plain copies out of a shared-memory mapping in this
        process (same host): they finish in memory-copy time and cannot hang on a peer."""
        try:
            return isinstance(self._transport_for(self.registry.target(segment)), ShmTransport)
        except TransferError:
            return False

    def mapped_span(
        self, segment: str, offset: int, n: int
    ) -> tuple[memoryview, Callable[[], None]] | None:
        """Bytes ``[offset, offset + n)`` of a same-host segment as a view of this process's
        mapping, to copy through directly (one lookup for a whole value, however it is cut),
        and the check to call after the copy (raises OwnerGone if the owner died meanwhile).
        None when ``segment`` is not reachable by mapping here."""
        target = self.registry.target(segment)
        check_range(segment, target.size, offset, n)
        try:
            transport = self._transport_for(target)
        except TransferError:
            return None
        return transport.span(target, offset, n) if isinstance(transport, ShmTransport) else None

    def _plan(self, batch: Batch, requests: Sequence[TransferRequest]) -> list[Task]:
        """Validate each request (failing bad ones alone), coalesce, group per transport and
        owner, and return the tasks that execute the rest. Requests are grouped by (op,
        local segment, target segment) first, so each segment is looked up once per batch."""
        groups: dict[tuple[Op, str, str, int], list[Item]] = {}
        for i, r in enumerate(requests):
            try:
                if not isinstance(r.op, Op):
                    raise InvalidRequest(f"op must be Op.READ or Op.WRITE, got {r.op!r}")
                if r.length <= 0:
                    raise InvalidRequest(f"length must be > 0, got {r.length}")
                key = (r.op, r.local_segment, r.target_segment, r.fence)  # (no merge across)
                item = (r.target_offset, r.local_offset, r.length, i)
            except TransferError as exc:
                batch.fail_request(i, exc)
                continue
            g = groups.get(key)
            if g is None:
                g = groups[key] = []
            g.append(item)
        by_owner: dict[tuple[str, str, tuple[PathInfo, ...]], list[Job]] = {}
        for (op, lname, tname, fence), items in groups.items():
            valid = self._check_group(batch, lname, tname, items)
            if not valid:
                continue
            target = self.registry.target(tname)
            try:
                transport = self._transport_for(target)
            except TransferError as exc:
                for it in valid:
                    batch.fail_request(it[3], exc)
                continue
            local = self._segments.get(lname).view
            jobs = by_owner.setdefault((transport.name, target.owner, target.paths), [])
            for lo, to, n, members in merge(valid):
                jobs.append(Job(op, local[lo : lo + n], target, to, n, members, batch, fence=fence))
        return self._owner_tasks(batch, by_owner)

    def _owner_tasks(
        self, batch: Batch, by_owner: dict[tuple[str, str, tuple[PathInfo, ...]], list[Job]]
    ) -> list[Task]:
        """The tasks of jobs grouped by (transport, owner, paths): each group is one
        transport's work on one peer."""
        return [
            t
            for (name, _, _), jobs in by_owner.items()
            for t in self.transports[name].tasks(batch, jobs)
        ]

    def _check_group(self, batch: Batch, lname: str, tname: str, items: list[Item]) -> list[Item]:
        """The items whose local and target ranges are in bounds; the others fail alone (in
        the order every path checks them: local segment, its range, target, its range)."""
        try:
            lsize = self._segments.get(lname).size
        except TransferError as exc:
            for it in items:
                batch.fail_request(it[3], exc)
            return []
        try:
            tsize = self.registry.target(tname).size
        except TransferError as exc:
            terr: TransferError | None = exc
            tsize = -1
        else:
            terr = None
        valid: list[Item] = []
        for it in items:
            to, lo, n, i = it
            if lo >= 0 and lo + n <= lsize and terr is None and to >= 0 and to + n <= tsize:
                valid.append(it)
                continue
            try:
                check_range(lname, lsize, lo, n)
                if terr is not None:
                    raise terr
                check_range(tname, tsize, to, n)
            except TransferError as exc:
                batch.fail_request(i, exc)
        return valid

    def _new_batch(self, n: int, collectable: bool = True) -> Batch:
        """A batch; ``collectable`` ones (``submit``) enter the bounded table that ``status``
        and ``wait`` look up (:class:`.batchtable.BatchTable`)."""
        self._check_open()
        batch = Batch(BatchId(next(self._ids)), n)
        if collectable:
            self._batches.add(batch)
        return batch

    def _run(self, batch: Batch, tasks: list[Task], inline: bool) -> None:
        """Start ``tasks``; with ``inline`` the caller runs what no worker has taken yet."""
        if inline and len(tasks) == 1:
            tasks[0]()
            return
        batch.tasks = [Claimable(t) for t in tasks]
        for t in batch.tasks[1:] if inline else batch.tasks:
            self._executor.submit(t)
        if inline:
            batch.help()

    def submit(self, requests: Sequence[TransferRequest]) -> BatchId:
        """Start a batch; returns at once. Collect it with :meth:`wait`. A batch that one
        frame carries (see :meth:`_vector_plan`) joins the queue of its target segment and
        op, whose frames one worker sends back to back on one connection
        (:mod:`.pipeline`): the layer-by-layer streaming case."""
        batch = self._new_batch(len(requests))
        plan = self._vector_plan(requests)
        if plan is None:
            self._run(batch, self._plan(batch, requests), inline=False)
        else:
            drain = self._pipeline.add(PipeItem(batch, requests, plan))
            if drain is not None:
                self._executor.submit(drain)
        return batch.id

    def _finish_frame(self, item: PipeItem, out: Outcome) -> None:
        """A submitted frame's outcome; after a path failure the general path takes the
        whole batch (in this thread), which fails over."""
        batch, requests = item.batch, item.requests
        if out is PATH_FAILED:
            self._run(batch, self._plan(batch, requests), inline=True)
            return
        batch.settle_all(run_results(batch.id, len(requests), item.plan.runs, out).results)

    @staticmethod
    def _abort_frame(item: PipeItem, exc: BaseException) -> None:
        err = exc if isinstance(exc, TransferError) else TransferError(f"transfer aborted: {exc!r}")
        item.batch.settle_all([failure(err)] * len(item.requests))

    def status(self, batch_id: BatchId) -> BatchStatus:
        return self._batches.get(batch_id).status()

    def wait(self, batch_id: BatchId, timeout: float | None = None) -> BatchResult:
        """Block until every request of the batch has an outcome; the batch id is then freed.
        Raises TransferTimeout (the batch stays collectable) when ``timeout`` passes first."""

        batch = self._batches.get(batch_id)
        if timeout is None:
            batch.help()
        if not batch.wait(timeout):
            raise TransferTimeout(f"batch {batch_id} not finished after {timeout}s")
        self._batches.discard(batch_id)
        return batch.result()

    def transfer(self, requests: Sequence[TransferRequest]) -> BatchResult:
        """Run a batch to completion in the calling thread (plus workers for extra lanes)."""
        done = self._inline_batch(requests)
        if done is not None:
            return done
        batch = self._new_batch(len(requests), collectable=False)
        return self._run_to_end(batch, self._plan(batch, requests))

    def _inline_batch(self, requests: Sequence[TransferRequest]) -> BatchResult | None:
        """A batch that one frame carries (:meth:`_vector_plan`), run in this thread with no
        batch, job or slice objects. ``None``: take the general path (also after a path
        failure, which it then fails over; reads and writes of the same bytes are
        idempotent)."""
        plan = self._vector_plan(requests)
        if plan is None:
            return None
        out = plan.run()
        if out is PATH_FAILED:
            return None
        return run_results(BatchId(next(self._ids)), len(requests), plan.runs, out)

    def _vector_plan(self, requests: Sequence[TransferRequest]) -> VectorPlan | None:
        """The one vectored TCP frame of a batch whose requests all have one op, one local
        and one remote segment, are in bounds and fit one frame after coalescing (one layer
        of a request's KV blocks); ``None`` for any other batch."""
        self._check_open()
        if not 1 < len(requests) <= MAX_ENTRIES:
            return None
        r0 = requests[0]
        try:
            local = self._segments.get(r0.local_segment)
            target = self.registry.target(r0.target_segment)
            transport = self._transport_for(target)
        except TransferError:
            return None
        if not isinstance(transport, TcpTransport):
            return None
        plan = uniform_runs(requests, local.size, target.size)
        if plan is None or not transport.vector_fits(len(plan[1]), plan[2]):
            return None
        op, runs, total = plan
        view = local.view
        views = [view[lo : lo + n] for lo, _, n, _ in runs]
        rows: list[int] = []
        for _, to, n, _ in runs:
            rows += (0, to, n)
        return VectorPlan(transport, op, views, target, rows, total, runs, r0.fence)

    def _run_to_end(self, batch: Batch, tasks: list[Task]) -> BatchResult:
        """Run ``tasks`` inline, wait for every outcome and free the batch id."""
        self._run(batch, tasks, inline=True)
        batch.wait(None)
        return batch.result()

    def _sync(
        self, op: Op, target: str, local: str, local_offset: int, target_offset: int, length: int
    ) -> None:
        # The checks of _plan, in its order, without building a request first (the typed
        # error is worded by check_range only when one fails: this is the latency path).
        if length <= 0:
            raise InvalidRequest(f"length must be > 0, got {length}")
        seg = self._segments.get(local)
        view = seg.view
        if local_offset < 0 or local_offset + length > view.nbytes:
            check_range(local, view.nbytes, local_offset, length)
        info = self.registry.target(target)
        if target_offset < 0 or target_offset + length > info.size:
            check_range(target, info.size, target_offset, length)
        view = view[local_offset : local_offset + length]
        if self._try_fast(op, view, info, target_offset):
            return
        req = TransferRequest(
            op, SegmentName(local), local_offset, SegmentName(target), target_offset, length
        )
        self.transfer([req]).raise_for_errors()

    def _try_fast(
        self,
        op: Op,
        view: memoryview,
        target: SegmentInfo,
        offset: int,
        landed: Landed | None = None,
        fence: int = 0,
    ) -> bool:
        """One request in the caller's thread, without the batch machinery: a same-host copy
        through the mapping (any size), or one small TCP request (the 4 KB latency path).
        False: take the general path (which also reports any error)."""
        try:
            transport = self._transport_for(target)
        except TransferError:
            return False
        return transport.run_single(op, view, target, offset, landed, fence)

    def transfer_sync_write(
        self,
        target_segment: str,
        local_segment: str,
        local_offset: int,
        target_offset: int,
        length: int,
    ) -> None:
        """Write registered local bytes to a target; raises TransferError on failure."""
        self._sync(Op.WRITE, target_segment, local_segment, local_offset, target_offset, length)

    def transfer_sync_read(
        self,
        target_segment: str,
        local_segment: str,
        local_offset: int,
        target_offset: int,
        length: int,
    ) -> None:
        """Read target bytes into a registered local segment; raises TransferError."""
        self._sync(Op.READ, target_segment, local_segment, local_offset, target_offset, length)

    def _unregistered(
        self,
        op: Op,
        target_segment: str,
        target_offset: int,
        buf: BufferLike,
        landed: Landed | None = None,
        fence: int = 0,
    ) -> None:
        view = as_byte_view(buf)
        if op is Op.READ and view.readonly:
            raise InvalidRequest("read_into needs a writable buffer")
        target = self.registry.target(target_segment)
        check_range(target_segment, target.size, target_offset, view.nbytes)
        if self._try_fast(op, view, target, target_offset, landed, fence):
            return
        batch = self._new_batch(1, collectable=False)
        job = Job(
            op, view, target, target_offset, view.nbytes, [0], batch, landed=landed, fence=fence
        )
        tasks = self._transport_for(target).tasks(batch, [job])
        self._run_to_end(batch, tasks).raise_for_errors()

    def write(
        self,
        target_segment: str,
        target_offset: int,
        data: BufferLike,
        landed: Landed | None = None,
        fence: int = 0,
    ) -> None:
        """Write any (unregistered, possibly read-only) buffer to a target segment.
        ``landed``: told of each piece right after it is sent over TCP (``types.Landed``);
        ``fence``: the allocation written for (transfer/fences.py; 0: not fenced)."""
        self._unregistered(Op.WRITE, target_segment, target_offset, data, landed, fence)

    def read_into(
        self, target_segment: str, target_offset: int, out: BufferLike, landed: Landed | None = None
    ) -> None:
        """Fill any writable (unregistered) buffer from a target segment. ``landed``: told of
        the bytes as they arrive over TCP (``types.Landed``; shared memory does not call it)."""
        self._unregistered(Op.READ, target_segment, target_offset, out, landed)

    def read_many(self, items: Sequence[tuple[str, int, BufferLike, Landed | None]]) -> BatchResult:
        """Fill each unregistered writable buffer from ``(segment, offset, buffer, landed)`` in
        ONE batch (a load's network reads pipelined over the lanes instead of one round trip
        each); a bad item fails alone in the result. ``landed`` as for :meth:`read_into`."""
        return self._many(Op.READ, items)

    def read_scatter(
        self,
        segment: str,
        reads: Sequence[scatter.ScatterRead],
        gate: scatter.Gate | None,
        chunk: int,
    ) -> list[scatter.Outcome] | None:
        """Read each value over TCP straight into its ranges, summed as it lands, under
        ``gate`` (:mod:`.scatter`): per value its sums or its refusal. None: not this way (the
        target is not reached over TCP, a value's ranges do not tile it or exceed a frame, or
        the path failed): the caller reads another way. Raises scatter.Cancelled."""
        self._check_open()
        target = self.registry.target(segment)
        transport = self._transport_for(target)
        if not isinstance(transport, TcpTransport) or not all(r.table.tiled for r in reads):
            return None
        total = sum(r.table.nbytes for r in reads)
        lanes = max(1, min(self.config.streams, -(-total // self.config.lane_bytes)))
        runs = scatter.plan(reads, transport.frame_bytes, lanes)
        if runs is None:
            return None
        read = functools.partial(transport.read_scatter, target, reads, gate=gate, chunk=chunk)
        return scatter.striped(self._executor, read, runs, len(reads))

    def write_many(
        self, items: Sequence[tuple[str, int, BufferLike, Landed | None]], fence: int = 0
    ) -> BatchResult:
        """Write each unregistered buffer to ``(segment, offset)`` in ONE batch (a batch put's
        values pipelined over the lanes, each summed by its ``landed`` while the others are on
        the wire); a bad item fails alone. ``landed`` and ``fence`` (every item's) as for
        :meth:`write`."""
        return self._many(Op.WRITE, items, fence)

    def _many(
        self, op: Op, items: Sequence[tuple[str, int, BufferLike, Landed | None]], fence: int = 0
    ) -> BatchResult:
        batch = self._new_batch(len(items), collectable=False)
        by_owner: dict[tuple[str, str, tuple[PathInfo, ...]], list[Job]] = {}
        for i, (segment, offset, buf, landed) in enumerate(items):
            try:
                view = as_byte_view(buf)
                if (op is Op.READ and view.readonly) or not view.nbytes:
                    raise InvalidRequest(f"{op.name.lower()}_many: empty or read-only buffer")
                target = self.registry.target(segment)
                check_range(segment, target.size, offset, view.nbytes)
                name = self._transport_for(target).name
            except TransferError as exc:
                batch.fail_request(i, exc)
                continue
            job = Job(op, view, target, offset, view.nbytes, [i], batch, landed=landed, fence=fence)
            by_owner.setdefault((name, target.owner, target.paths), []).append(job)
        return self._run_to_end(batch, self._owner_tasks(batch, by_owner))

    # --- lifecycle ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransferError("transfer engine is closed")

    def close(self) -> None:
        """Unregister every segment (unpublishing it), stop the server, drop connections.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        for name in self._segments.names():
            with contextlib.suppress(TransferError):
                self.unregister(name)
        self._executor.shutdown(wait=True, cancel_futures=False)
        self.server.stop()
        self.health.close()
        self.pool.close()
        for t in self.transports.values():
            t.close()
        if self.directory is not None:
            self.directory.close()

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
