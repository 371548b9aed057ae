"""The master's object table (part of :class:`~kvcake.store.master_state.MasterState`): the
records of every object and the primitives that free their space.

Invariants (every method is called with the state lock held, and takes no lock):
- ``objects`` is in LRU order (least recently used first); ``processing`` holds the PROCESSING
  ones in put_start order.
- A replica's range belongs to its segment's allocator (file-tier ranges to the file tier);
  freeing it is :meth:`free`. An object leaves the table only through :meth:`drop`, which frees
  every replica, forgets an offload in flight and gives its tenant's charge back.
- A replica a leased reader may still copy from is not freed at once: its range is discarded
  until the lease has run out (:meth:`drop_replica`).
- A memory range a writer may still be writing into (a PROCESSING object's, a copy in flight)
  is not freed at once either: its range is discarded for ``writer_grace_s`` (a revoked put's
  bytes may still sit in a paused node's sockets; a pre-empted writer may wake up).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kvcake.core.api import StoreEventKind
from kvcake.core.ids import ObjectKey
from kvcake.store.changes import Changes
from kvcake.store.events import EventLog
from kvcake.store.metadata import NodeTask, ObjectMeta, Replica, Status, Tier
from kvcake.store.segtable import SegmentTable
from kvcake.store.tenants import TenantQuotas

MEMORY_V = Tier.MEMORY.value
_COMPLETE, _REMOVED = Status.COMPLETE, StoreEventKind.REMOVED


class ObjectTable:
    def __init__(
        self,
        objects: OrderedDict[ObjectKey, ObjectMeta],
        segs: SegmentTable,
        free_file: Callable[[Replica], None],
        tenants: TenantQuotas,
        offloading: dict[ObjectKey, int],
        events: EventLog,
        changes: Changes,
        clock: Callable[[], float],
        writer_grace_s: float,
    ):
        self.objects = objects  # LRU order
        self.writer_grace_s = writer_grace_s  # MasterConfig.writer_grace_s
        self.processing: OrderedDict[ObjectKey, ObjectMeta] = OrderedDict()
        self.segs = segs
        self.free_file = free_file
        self.tenants = tenants
        self.offloading = offloading  # key -> memory bytes an in-flight offload will free
        self.events = events
        self.changes = changes
        self.clock = clock

    def check(self) -> None:
        """Assert that every replica lies in a mounted segment."""
        for obj in self.objects.values():
            for rep in obj.replicas:
                assert rep.segment in self.segs.segments, (obj.key, rep.segment)

    def leased(self, obj: ObjectMeta) -> bool:
        return obj.lease_until > self.clock()

    def free(self, rep: Replica) -> None:
        if rep.tier is Tier.FILE:
            self.free_file(rep)
        else:
            self.segs.release(rep)

    def retire(self, obj: ObjectMeta, rep: Replica) -> None:
        """Free ``rep`` of ``obj`` as it leaves; a memory range its writer may still be
        writing into is only discarded for ``writer_grace_s``."""
        if rep.tier is Tier.MEMORY and (obj.status is not _COMPLETE or not rep.complete):
            self.segs.discard(self.clock() + self.writer_grace_s, rep.segment, rep.offset, rep.size)
        else:
            self.free(rep)

    def free_persistent(self, obj: ObjectMeta) -> None:
        """Free ``obj``'s disk and file replicas (a disk copy's node is told to delete it)."""
        for rep in obj.persistent():
            self.free(rep)
            if rep.tier is Tier.DISK:
                self.segs.queue_task(rep.segment, NodeTask("delete", obj.key, obj.size, 0))

    def drop(self, obj: ObjectMeta, event: StoreEventKind | None = _REMOVED) -> None:
        """Forget ``obj`` and free its replicas; ``event`` is published if it was readable
        (``None``: the caller publishes)."""
        self.changes.object(obj.key)  # a PROCESSING one was logged as its writer's hold
        if event is not None and obj.status is _COMPLETE and obj.readable():
            self.events.emit(event, (obj.key,), MEMORY_V if event is not _REMOVED else "")
        self.offloading.pop(obj.key, None)
        for rep in obj.replicas:
            self.retire(obj, rep)
            if rep.tier is Tier.DISK:
                self.segs.queue_task(rep.segment, NodeTask("delete", obj.key, obj.size, 0))
        obj.replicas = []
        gone = self.objects.pop(obj.key, None)
        if gone is not None:
            self.tenants.release(gone.tenant, gone.size)
        self.processing.pop(obj.key, None)

    def drop_replica(self, obj: ObjectMeta, rep: Replica, publish: bool = True) -> None:
        """Forget one replica of ``obj`` (another readable one remains); ``publish``: emit the
        tier's eviction event if it was the tier's last copy (disk-tier eviction batches them)."""
        self.changes.object(obj.key)
        # A reader holding a lease may still be copying from it: its space is reused only
        # once the lease has run out (as for pre-empted puts).
        if obj.lease_until > self.clock():
            self.segs.discard(obj.lease_until, rep.segment, rep.offset)
        else:
            self.free(rep)
        obj.replicas.remove(rep)
        if rep.tier is Tier.DISK:
            self.segs.queue_task(rep.segment, NodeTask("delete", obj.key, obj.size, 0))
        if publish and not any(r.tier is rep.tier and r.complete for r in obj.replicas):
            disk = rep.tier is not Tier.MEMORY
            kind = StoreEventKind.EVICTED_DISK if disk else StoreEventKind.EVICTED_MEMORY
            self.events.emit(kind, (obj.key,), rep.tier.value)
