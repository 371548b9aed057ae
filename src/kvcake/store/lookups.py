"""Reads and removals on the master (a part of :class:`~kvcake.store.master_state.MasterState`:
:class:`Lookups`).

Invariants: called with the state lock held (takes no lock). Only COMPLETE objects with a
complete replica are found; a found object gets a read lease (``lease_ttl_s``) and moves to the
most recently used end; a leased, PROCESSING or in-copy object is removed only with ``force``.
"""

from __future__ import annotations

from collections.abc import Callable

from kvcake.core.ids import ObjectKey
from kvcake.store.config import MasterConfig
from kvcake.store.errors import ObjectHasLease, ObjectNotFound, ReplicaNotReady
from kvcake.store.metadata import ObjectMeta, Status, Tier
from kvcake.store.objtable import ObjectTable
from kvcake.store.protocol import ReplicaDesc
from kvcake.store.segtable import SegmentTable
from kvcake.store.writes import check_key

MEMORY = Tier.MEMORY  # module constant: enum attribute lookups are slow on hot paths


class Lookups:
    def __init__(
        self,
        cfg: MasterConfig,
        table: ObjectTable,
        segs: SegmentTable,
        promote: Callable[[ObjectMeta], None],
    ):
        self.cfg = cfg
        self.table = table
        self.objects = table.objects
        self.segs = segs
        self.promote = promote  # start copying a disk-only object back to memory
        self.clock = table.clock

    def lookup(self, okey: ObjectKey) -> tuple[int, list[ReplicaDesc], list[int]]:
        """Readable replicas of ``okey``, its checksums, and a fresh read lease on it."""
        obj = self.objects.get(okey)
        reps = obj.readable() if obj is not None else []
        if obj is None or not reps:
            raise ObjectNotFound(f"{okey!r} not found")
        obj.lease_until = max(obj.lease_until, self.clock() + self.cfg.lease_ttl_s)
        self.objects.move_to_end(okey)
        for r in reps:
            if r.tier is MEMORY:
                break
        else:
            obj.disk_hits += 1
            if obj.disk_hits >= self.cfg.promote_after_hits:
                self.promote(obj)
        return obj.size, [self.segs.describe(r) for r in reps], obj.sums

    def remove(self, key: str, force: bool) -> None:
        obj = self.objects.get(check_key(key))
        if obj is None:
            raise ObjectNotFound(f"{key!r} not found")
        if not force and self.table.leased(obj):
            raise ObjectHasLease(f"{key!r} has a read lease")
        if not force and (obj.status is Status.PROCESSING or obj.copying):
            raise ReplicaNotReady(f"{key!r} is being written")
        self.table.drop(obj)

    def remove_keys(self, keys: list[str], force: bool) -> int:
        """Remove what is still there of ``keys``; leased/busy ones are skipped unless
        ``force``. Work is proportional to ``len(keys)``."""
        removed = 0
        for key in keys:
            try:
                self.remove(key, force)
                removed += 1
            except (ObjectNotFound, ObjectHasLease, ReplicaNotReady):
                continue
        return removed
