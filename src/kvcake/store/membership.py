"""Clients and segments joining and leaving the master (a part of
:class:`~kvcake.store.master_state.MasterState`: :class:`Membership`).

Invariants: called with the state lock held (takes no lock). A segment belongs to the client
that mounted it until that client unmounts it, expires (silent for ``client_ttl_s``) or is
known dead; then every replica on it is forgotten and objects left without a readable replica
vanish. A disk tier's verified copies join the pool at mount only with their own checksums.
"""

from __future__ import annotations

from collections.abc import Callable

from kvcake.core import integrity
from kvcake.core.api import StoreEventKind
from kvcake.core.ids import ClientId, ObjectKey, SegmentName
from kvcake.store.admin import readable_tiers
from kvcake.store.allocator import RangeAllocator
from kvcake.store.changes import Changes
from kvcake.store.clients import ClientTable
from kvcake.store.config import MasterConfig
from kvcake.store.dedup import DedupTable
from kvcake.store.errors import InvalidParams, SegmentAlreadyExists
from kvcake.store.events import EventLog
from kvcake.store.filetier import FILE_SEGMENT, FileTier
from kvcake.store.metadata import ObjectMeta, Replica, Segment, Status, Tier
from kvcake.store.objtable import ObjectTable
from kvcake.store.segtable import SegmentTable

OwnerDead = Callable[[ClientId, SegmentName], bool]


class Membership:
    def __init__(
        self,
        cfg: MasterConfig,
        clients: ClientTable,
        segs: SegmentTable,
        table: ObjectTable,
        files: FileTier,
        dedup: DedupTable[object],
        owner_dead: OwnerDead,
        events: EventLog,
        changes: Changes,
    ):
        self.cfg = cfg
        self.clients = clients
        self.segs = segs
        self.table = table
        self.files = files
        self.dedup = dedup
        # Whether the process of ``client`` (holding ``segment``) is known to be gone, e.g. its
        # pid no longer exists on this host: its segments are then released to a new owner.
        self.owner_dead = owner_dead
        self.events = events
        self.changes = changes
        self.clock = table.clock
        self.swept = 0

    def mount(
        self,
        client: ClientId,
        host: str,
        name: SegmentName,
        capacity: int,
        tier: Tier = Tier.MEMORY,
        endpoint: str = "",
        existing: list[tuple[str, int]] | None = None,
        existing_sums: list[list[int]] | None = None,
        host_id: str = "",
    ) -> list[str]:
        """Mount a segment; for a disk tier adopt the verified copies in ``existing`` (with
        their checksums, ``existing_sums``, in order) and return those the node must delete:
        size or checksums unlike the object's, no checksums, no room."""
        if not name or name == FILE_SEGMENT:
            raise InvalidParams(f"segment name {name!r} is empty or reserved")
        if capacity <= 0 or capacity > 1 << 50:
            raise InvalidParams(f"segment capacity {capacity} out of range")
        self.clients.touch(client, host)
        seg = self.segs.segments.get(name)
        if seg is not None and seg.client != client and self._gone(seg.client, name):
            # The old owner's process is gone (killed and restarted under the same name):
            # release its segments now instead of after its client TTL.
            self.drop_client(seg.client)
            seg = None
        if seg is not None and seg.client != client:
            raise SegmentAlreadyExists(
                f"segment {name!r} is mounted by another client ({seg.client}), which is alive",
                holder=(seg.client, seg.host_id),
            )
        rejected: list[str] = []
        if seg is None:  # else an idempotent remount
            seg = Segment(name, client, host, tier, RangeAllocator(capacity), endpoint, host_id)
            rejected = self._add(seg, existing or [], existing_sums or [])
        self.clients.rejoin.discard(client)
        self.changes.segment(name)
        return rejected

    def _add(
        self, seg: Segment, existing: list[tuple[str, int]], sums: list[list[int]]
    ) -> list[str]:
        self.segs.add(seg)
        self.clients.clients[seg.client].segments.add(seg.name)
        rejected = [
            k
            for i, (k, size) in enumerate(existing)
            if not self._adopt(seg, k, size, sums[i] if i < len(sums) else [])
        ]
        if existing:
            bad = set(rejected)
            adopted = [k for k, _ in existing if k not in bad]
            self.events.emit(StoreEventKind.STORED, adopted, Tier.DISK.value)
        return rejected

    def _gone(self, client: ClientId, name: SegmentName) -> bool:
        return self.clients.expired(client) or self.owner_dead(client, name)

    def _adopt(self, seg: Segment, key: str, size: int, sums: list[int]) -> bool:
        """A verified disk copy joins the pool only with well-formed checksums that are the
        object's own (a copy of an older version of the key never does)."""
        self.changes.object(key)
        obj = self.table.objects.get(ObjectKey(key))
        if size <= 0 or not sums or not integrity.well_formed(size, sums):
            return False
        if obj is not None and (
            obj.size != size or obj.status is Status.PROCESSING or obj.sums != sums
        ):
            return False
        off = seg.allocator.allocate(size)
        if off is None:
            return False
        rep = Replica(seg.name, off, size, Tier.DISK, complete=True)
        if obj is None:
            obj = ObjectMeta(ObjectKey(key), size, Status.COMPLETE, seg.client, self.clock())
            obj.sums = list(sums)
            self.table.objects[obj.key] = obj
            self.table.objects.move_to_end(obj.key, last=False)  # restored copies are coldest
        obj.replicas.append(rep)
        return True

    def drop_segment(self, seg: Segment) -> None:
        """Forget a segment and every replica on it; objects left without replicas vanish."""
        self.changes.segment(seg.name)
        self.segs.remove(seg)
        info = self.clients.clients.get(seg.client)
        if info is not None:
            info.segments.discard(seg.name)
        lost: list[str] = []
        for key in list(self.table.objects):
            obj = self.table.objects[key]
            if not any(r.segment == seg.name for r in obj.replicas):
                continue
            self.changes.object(key)
            had = seg.tier in readable_tiers(obj)
            obj.replicas = [r for r in obj.replicas if r.segment != seg.name]
            if obj.status is Status.PROCESSING or not obj.readable():
                self.table.drop(obj, None)
            if had and seg.tier not in readable_tiers(obj):
                lost.append(key)
        self.events.emit(StoreEventKind.SEGMENT_LOST, lost, seg.tier.value, seg.name)

    def drop_client(self, cid: ClientId) -> None:
        """Forget a client: its segments, its unfinished puts, its dedup sessions, its tasks."""
        info = self.clients.clients.pop(cid, None)
        for name in sorted(info.segments if info else ()):
            if name in self.segs.segments:
                self.drop_segment(self.segs.segments[name])
        for obj in [o for o in self.table.processing.values() if o.writer == cid]:
            self.table.drop(obj)
        if self.files.writes:
            self.files.abandon(cid, 0.0)
        self.segs.tasks.pop(cid, None)
        self.dedup.forget_client(cid)

    def sweep_processing(self) -> int:
        """Drop puts left PROCESSING longer than ``put_start_timeout_s + put_start_discard_s``
        (a writer that slow may be pre-empted anyway, and its space is reusable by then).
        Puts of dead writers go in :meth:`expire_clients`. Bounded: only the stale head of
        the put_start-ordered index is read."""
        limit = self.clock() - self.cfg.put_start_timeout_s - self.cfg.put_start_discard_s
        n = 0
        processing = self.table.processing
        while processing:
            obj = next(iter(processing.values()))
            if obj.put_started > limit:
                break
            self.table.drop(obj)
            n += 1
        if self.files.writes:  # writers silent as long are given up too
            self.files.abandon(None, limit)
        self.swept += n
        return n

    def expire_clients(self) -> list[ClientId]:
        """Unmount the segments of clients silent for longer than ``client_ttl_s``."""
        dead = self.clients.silent()
        for cid in dead:
            self.drop_client(cid)
        return dead
