"""Eviction and tier movement of the master (a part of
:class:`~kvcake.store.master_state.MasterState`: :class:`Tiering`).

Eviction is incremental: each step takes at most ``evict_batch`` objects (and at most
``evict_step_ms`` of time) from the least recently used end of the LRU-ordered object
table (no copy or scan of the table), skips leased,
PROCESSING, hard-pinned and in-copy objects (moving them to the MRU end) and soft-pinned ones
until nothing else is left. For each victim: if a disk copy
exists, its memory replicas are freed; else, if offloading is allowed and the owner node has a
disk tier, the node is asked to copy it to disk (memory is freed when it reports done) — a full
disk tier first drops its own least recently used copies (``evicted_disk`` events); else the
object is dropped.

Invariants: every method is called with the state lock held and takes no lock. Never evicted:
leased, PROCESSING, hard-pinned, in-copy objects and those whose file is being written;
soft-pinned ones only once nothing else is left. The memory of an object being offloaded is
counted in ``offloading`` until its node reports the copy.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from kvcake.core.api import StoreEventKind
from kvcake.core.ids import ClientId, ObjectKey
from kvcake.store.changes import Changes
from kvcake.store.config import MasterConfig
from kvcake.store.events import EventLog
from kvcake.store.metadata import NodeTask, ObjectMeta, Replica, Segment, Status, Tier
from kvcake.store.objtable import ObjectTable
from kvcake.store.segtable import SegmentTable

SYNC_EVICT_STEPS = 4  # eviction batches a put_start may run when allocation fails


class Tiering:
    def __init__(
        self,
        cfg: MasterConfig,
        table: ObjectTable,
        segs: SegmentTable,
        writing_file: Callable[[ObjectMeta], bool],
        file_unlink: Callable[[int], None],
        events: EventLog,
        changes: Changes,
    ):
        self.cfg = cfg
        self.table = table
        self.objects = table.objects
        self.offloading = table.offloading
        self.segs = segs
        self.writing_file = writing_file
        self.file_unlink = file_unlink
        self.events = events
        self.changes = changes
        self.clock = table.clock
        self.evicted_objects = 0
        self.evicted_bytes = 0
        self.evicted_disk_objects = 0  # disk copies dropped to make room on a full disk tier
        self.offloads = 0
        self.promotions = 0
        self.barren = 0  # objects looked at by eviction since the last one it could evict
        self.evicting = False  # a watermark eviction run is in progress

    # --- eviction -----------------------------------------------------------------------------

    def used_ratio(self) -> float:
        segs = self.segs.memory()
        cap = sum(s.allocator.capacity for s in segs)
        return 0.0 if cap == 0 else sum(s.allocator.allocated for s in segs) / cap

    def reclaim(self, force: bool = False) -> None:
        self.segs.reclaim(self.clock(), force, self.file_unlink)

    def maybe_evict(self) -> int:
        """One bounded eviction step: above the high watermark, evict towards ``high -
        eviction_ratio``, looking at no more than ``evict_batch`` objects. Returns the bytes
        freed or scheduled; the housekeeper repeats it (releasing the lock in between) while
        it makes progress."""
        self.reclaim()
        segs = self.segs.memory()
        cap = sum(s.allocator.capacity for s in segs)
        # Bytes already on their way to disk count as freed, so a slow node is not
        # flooded with more offloads every tick.
        used = sum(s.allocator.allocated for s in segs) - sum(self.offloading.values())
        low = int((self.cfg.high_watermark - self.cfg.eviction_ratio) * cap)
        # Hysteresis: a run that started above the high watermark goes on, step by step,
        # until usage is down to high - eviction_ratio.
        if used > self.cfg.high_watermark * cap:
            self.evicting = True
        if cap == 0 or used <= low or not self.evicting:
            self.evicting = False
            return 0
        return self.evict(used - low, self.cfg.offload_on_evict)

    def make_room(self, need: int) -> None:
        """A put_start found no space: a few eviction batches (bounded: not the whole table)
        towards ``need`` bytes, then the discarded ranges whose time has come. An object with
        a disk tier to go to is offloaded, never dropped (its put was acknowledged); the space
        comes once the node reports the copy done."""
        freed = 0
        for _ in range(SYNC_EVICT_STEPS):
            step = self.evict(need - freed, self.cfg.offload_on_evict, timed=False)
            freed += step
            if freed >= need or (step == 0 and self.barren > len(self.objects)):
                break
        self.reclaim()

    def evict(self, need: int, offload: bool, timed: bool = True) -> int:
        """Free (or start offloading) up to ``need`` memory bytes from the least recently used
        end, looking at no more than ``evict_batch`` objects (bounded work under the lock).

        Within the batch, memory copies of objects already on disk go first. An object that
        cannot be evicted now (leased, PROCESSING, pinned, in copy) is moved to the MRU end,
        out of the next batch's way; soft-pinned objects become eligible once a whole
        table's worth of objects was looked at without finding anything else. ``timed``: stop
        after ``evict_step_ms`` too (the housekeeper's steps; a put_start that needs the space
        now holds the lock across its steps anyway, so it is not time-bounded)."""
        done = 0
        evicted: list[str] = []
        budget = self.cfg.evict_step_ms / 1e3 if timed else 0.0
        # A time bound too: on a slow or loaded CPU a step of evict_batch objects can hold
        # the lock (and the GIL) for milliseconds, which is the readers' tail latency.
        deadline = time.perf_counter() + budget if budget else float("inf")
        try:
            head = list(itertools.islice(self.objects.values(), self.cfg.evict_batch))
            allow_soft = self.barren >= len(self.objects)
            on_disk = [o for o in head if any(r.complete for r in o.persistent())]
            seen = {id(o) for o in on_disk}
            for i, obj in enumerate(on_disk + [o for o in head if id(o) not in seen]):
                if done >= need or (i and time.perf_counter() > deadline):
                    break
                if self._evictable(obj, allow_soft):
                    done += self._evict_one(obj, offload, evicted)
                    self.barren = 0
                elif obj.key in self.objects:
                    self.objects.move_to_end(obj.key)
                    self.barren += 1
        finally:
            self.events.emit(StoreEventKind.EVICTED_MEMORY, evicted, Tier.MEMORY.value)
        return done

    def _evictable(self, obj: ObjectMeta, allow_soft: bool) -> bool:
        if obj.status is not Status.COMPLETE or obj.copying or obj.hard_pin:
            return False
        if not obj.memory() or self.table.leased(obj) or self.writing_file(obj):
            return False
        return allow_soft or obj.soft_pin_until <= self.clock()

    def _evict_one(self, obj: ObjectMeta, offload: bool, evicted: list[str]) -> int:
        self.changes.object(obj.key)
        mem = obj.memory()
        freed = sum(r.size for r in mem)
        # A file-tier copy alone does not stop an offload to the owner's SSD tier: Mooncake's
        # client offloads an evicted object to its local storage although root_fs_dir has it
        # too (LOCAL_DISK and DISK replicas), and its promotion-on-hit works from the former.
        if offload and not obj.disk() and self.start_offload(obj):
            pass  # memory freed when the offload completes
        elif any(r.complete for r in obj.persistent()):
            for rep in mem:
                self.table.free(rep)
            obj.replicas = obj.persistent()
            evicted.append(obj.key)
        else:
            self.table.drop(obj, None)
            evicted.append(obj.key)
        self.evicted_objects += 1
        self.evicted_bytes += freed
        return freed

    # --- tier movement -------------------------------------------------------------------------

    def start_offload(self, obj: ObjectMeta) -> bool:
        src = next((r for r in obj.memory() if r.complete), None)
        if src is None:
            return False
        owner = self.segs.segments[src.segment].client
        disk = self.segs.disk_of(owner)
        if disk is None:
            return False
        off = disk.allocator.allocate(obj.size)
        if off is None and self.evict_disk(disk, obj.size, obj.key):
            off = disk.allocator.allocate(obj.size)
        if off is None:
            return False
        obj.replicas.append(Replica(disk.name, off, obj.size, Tier.DISK, complete=False))
        obj.copying = True
        self.offloading[obj.key] = sum(r.size for r in obj.memory())
        self.segs.queue(owner, NodeTask("offload", obj.key, obj.size, src.offset, tuple(obj.sums)))
        self.offloads += 1
        return True

    def evict_disk(self, disk: Segment, need: int, keep: ObjectKey) -> int:
        """Make room on a full disk tier: drop the disk copies of the least recently used
        objects there (looking at no more than ``evict_batch`` of them, like a memory step).
        An object with a readable memory copy keeps it; a disk-only one is dropped. Returns
        the bytes freed; ``evicted_disk`` events name the keys."""
        freed = 0
        dropped: list[str] = []
        head = list(itertools.islice(self.objects.values(), self.cfg.evict_batch))
        for obj in head:
            if freed >= need:
                break
            if obj.key == keep or obj.copying or obj.hard_pin or obj.status is not Status.COMPLETE:
                continue
            rep = next((r for r in obj.disk() if r.segment == disk.name and r.complete), None)
            if rep is None or self.table.leased(obj):
                continue
            freed += rep.size
            dropped.append(obj.key)
            if any(r.complete for r in obj.memory()):
                self.table.drop_replica(obj, rep, publish=False)  # published with the batch
            else:
                self.table.drop(obj, None)
        self.evicted_disk_objects += len(dropped)
        self.events.emit(StoreEventKind.EVICTED_DISK, dropped, Tier.DISK.value)
        return freed

    def start_promotion(self, obj: ObjectMeta) -> None:
        if obj.copying or not obj.disk():  # the file tier is read in place, never promoted
            return
        owner = self.segs.segments[obj.disk()[0].segment].client
        mem = next((s for s in self.segs.memory() if s.client == owner), None)
        off = mem.allocator.allocate(obj.size) if mem is not None else None
        if mem is None or off is None:
            return
        rep = Replica(mem.name, off, obj.size, Tier.MEMORY, complete=False)
        self.segs.fence([rep])  # the node copies in place, but a stale writer must not
        obj.replicas.append(rep)
        obj.copying = True
        self.changes.writing(obj.key, 0)  # the node writes it: held (a read does not wait)
        self.segs.queue(owner, NodeTask("promote", obj.key, obj.size, off, tuple(obj.sums)))
        self.promotions += 1

    def copy_done(self, client: ClientId, kind: str, key: str, ok: bool) -> None:
        """A node reports an offload or promotion finished (``ok``) or failed; the replica
        becomes readable or is freed. A report for an object that is gone makes the node
        delete its disk copy."""
        if kind == "offload":
            self.offloading.pop(ObjectKey(key), None)
        obj = self.objects.get(ObjectKey(key))
        tier = Tier.DISK if kind == "offload" else Tier.MEMORY
        rep = None
        if obj is not None:
            rep = next((r for r in obj.replicas if r.tier is tier and not r.complete), None)
        if obj is None or rep is None:
            if kind == "offload" and ok:
                self.segs.queue(client, NodeTask("delete", ObjectKey(key), 0, 0))
            return
        obj.copying = False
        if not ok:
            self.table.free(rep)
            obj.replicas.remove(rep)
            return
        rep.complete = True
        visible = obj.status is Status.COMPLETE
        if visible:
            self.events.emit(StoreEventKind.STORED, (obj.key,), tier.value)
        if kind == "promote":
            obj.disk_hits = 0
        elif not self.table.leased(obj):  # the offload was for space: release the memory now
            self._release_memory(obj, visible)

    def _release_memory(self, obj: ObjectMeta, visible: bool) -> None:
        had_memory = any(r.complete for r in obj.memory())
        for mem in obj.memory():
            self.table.free(mem)
        obj.replicas = obj.persistent()
        if visible and had_memory:
            self.events.emit(StoreEventKind.EVICTED_MEMORY, (obj.key,), Tier.MEMORY.value)
