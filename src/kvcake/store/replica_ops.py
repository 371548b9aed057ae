"""Replica copy and drop on the master (a part of
:class:`~kvcake.store.master_state.MasterState`: :class:`ReplicaOps`).

A client copies a readable object onto more memory segments in two phases, like a put:
``copy_start`` allocates the new replicas (not yet readable) and marks the object as in copy
(so it is neither evicted nor removed meanwhile, as during an offload); the client writes the
bytes through the Transfer Engine; ``copy_end`` makes them readable or frees them. ``drop_replica``
forgets one replica of an object that keeps another readable one (a move = copy, then drop).
These back Mooncake's ``create_copy_task`` / ``create_move_task`` in ``compat.mooncake``.

A copy whose client never finishes is aborted by ``sweep_copies`` (housekeeping) once it is
older than ``put_start_discard_s``, or when its client has expired.

Invariants: called with the state lock held (takes no lock); owns ``copies`` (key -> (copying
client, started at), at most ``MAX_COPIES``); an object in copy is marked ``copying``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvcake.core.api import StoreEventKind
from kvcake.core.ids import ClientId, ObjectKey, SegmentName
from kvcake.store.changes import Changes
from kvcake.store.errors import InvalidParams, NoSpace, ObjectNotFound, ReplicaNotReady
from kvcake.store.events import EventLog
from kvcake.store.metadata import ObjectMeta, Replica, Segment, Status, Tier
from kvcake.store.objtable import ObjectTable
from kvcake.store.protocol import ReplicaDesc
from kvcake.store.segtable import SegmentTable

log = logging.getLogger(__name__)
MAX_COPIES = 65_536  # copies in flight at once (a bound on the table)


class ReplicaOps:
    def __init__(
        self,
        table: ObjectTable,
        segs: SegmentTable,
        discard_s: float,
        events: EventLog,
        changes: Changes,
    ):
        self.table = table
        self.objects = table.objects
        self.segs = segs
        self.discard_s = discard_s  # a copy older than this is aborted (put_start_discard_s)
        self.events = events
        self.changes = changes
        self.clock = table.clock
        self.copies: dict[ObjectKey, tuple[ClientId, float]] = {}
        self.replicas_bad = 0  # replicas dropped because a reader found them failing checksums

    def _readable(self, key: str) -> ObjectMeta:
        obj = self.objects.get(ObjectKey(key))
        if obj is None or obj.status is not Status.COMPLETE or not obj.readable():
            raise ObjectNotFound(f"{key!r} is not in the store")
        return obj

    def copy_start(self, client: ClientId, key: str, targets: list[str]) -> list[ReplicaDesc]:
        """New (unreadable) memory replicas of ``key`` on each of ``targets``."""
        if not targets or len(set(targets)) != len(targets):
            raise InvalidParams("copy targets must be distinct segment names, at least one")
        obj = self._readable(key)
        if obj.copying:
            raise ReplicaNotReady(f"{key!r} is being copied")
        if len(self.copies) >= MAX_COPIES:
            raise NoSpace(f"{MAX_COPIES} copies in flight: retry later")
        segs = [self._copy_target(obj, SegmentName(t)) for t in targets]
        new: list[Replica] = []
        for seg in segs:
            off = seg.allocator.allocate(obj.size)
            if off is None:
                for rep in new:
                    self.table.free(rep)
                raise NoSpace(f"no room for {obj.size} B on {seg.name!r}")
            new.append(Replica(seg.name, off, obj.size, Tier.MEMORY, complete=False))
        self.segs.fence(new)
        obj.replicas.extend(new)
        obj.copying = True
        self.copies[obj.key] = (client, self.clock())
        self.changes.writing(obj.key, obj.size * len(new))  # the targets are held (ObjRec.held)
        return [self.segs.describe(r) for r in new]

    def _copy_target(self, obj: ObjectMeta, name: SegmentName) -> Segment:
        seg = self.segs.segments.get(name)
        if seg is None or seg.tier is not Tier.MEMORY:
            raise InvalidParams(f"{name!r} is not a mounted memory segment")
        if any(r.segment == name for r in obj.replicas):
            raise InvalidParams(f"{obj.key!r} already has a replica on {name!r}")
        return seg

    def copy_end(self, client: ClientId, key: str, ok: bool) -> None:
        """The client wrote the new replicas (``ok``) or gave up: readable, or freed."""
        okey = ObjectKey(key)
        started = self.copies.get(okey)
        if started is None or started[0] != client:
            raise InvalidParams(f"{key!r} has no copy in progress by this client")
        obj = self.objects.get(okey)
        if obj is None:  # removed with force meanwhile: its replicas are already freed
            self.copies.pop(okey, None)
            raise ObjectNotFound(f"{key!r} was removed during the copy")
        self._finish_copy(obj, ok)

    def _finish_copy(self, obj: ObjectMeta, ok: bool) -> None:
        self.changes.object(obj.key)
        self.copies.pop(obj.key, None)
        obj.copying = False
        pending = [r for r in obj.replicas if r.tier is Tier.MEMORY and not r.complete]
        for rep in pending:
            if ok:
                rep.complete = True
            else:  # the copier may still be writing it
                self.table.retire(obj, rep)
                obj.replicas.remove(rep)
        if ok and pending:
            self.events.emit(StoreEventKind.STORED, (obj.key,), Tier.MEMORY.value)

    def drop_replica(self, key: str, segment: str) -> None:
        """Forget the replica of ``key`` on ``segment``; another readable one must remain."""
        obj = self._readable(key)
        if obj.copying:
            raise ReplicaNotReady(f"{key!r} is being copied")
        rep = next((r for r in obj.replicas if r.segment == segment and r.complete), None)
        if rep is None:
            raise InvalidParams(f"{key!r} has no replica on {segment!r}")
        if len(obj.readable()) < 2:
            raise InvalidParams(f"{key!r} has no other replica: remove the key instead")
        self.table.drop_replica(obj, rep)

    def replica_bad(self, key: str, segment: str, offset: int, sums: list[int]) -> bool:
        """A reader found the replica at ``segment``/``offset`` failing ``sums``: drop exactly
        that replica if ``key`` still has it and still has those sums (a report about an older
        version, or a range reused since, changes nothing). The last readable replica takes
        the object with it: corrupt bytes are worse than a miss. Returns whether it dropped."""
        obj = self.objects.get(ObjectKey(key))
        if obj is None or obj.status is not Status.COMPLETE or obj.sums != sums:
            return False
        # offset -1: the node of a disk tier names its copy by key (one per disk segment)
        rep = next(
            (
                r
                for r in obj.replicas
                if r.segment == segment
                and (r.offset == offset or (offset == -1 and r.tier is Tier.DISK))
            ),
            None,
        )
        if rep is None or not rep.complete:
            return False
        self.replicas_bad += 1
        log.warning("replica of %r on %s at %d failed its checksums: dropped", key, segment, offset)
        if len(obj.readable()) < 2:
            self.table.drop(obj)
        else:
            self.table.drop_replica(obj, rep)
        return True

    def sweep_copies(self, live: Callable[[ClientId], bool]) -> int:
        """Abort copies older than ``put_start_discard_s`` or whose client is gone."""
        deadline = self.clock() - self.discard_s
        stale = [k for k, (c, t0) in self.copies.items() if t0 < deadline or not live(c)]
        for key in stale:
            obj = self.objects.get(key)
            if obj is None:
                self.copies.pop(key, None)
            else:
                self._finish_copy(obj, ok=False)
        return len(stale)
