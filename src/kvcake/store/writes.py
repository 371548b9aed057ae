"""The master's write path (a part of :class:`~kvcake.store.master_state.MasterState`:
:class:`Writes`): put_start places the replicas of a new object (PROCESSING), put_end makes
it readable, put_revoke drops it.

Invariants: called with the state lock held (takes no lock). Only COMPLETE objects are
visible; a PROCESSING object's space is owned by its writer until put_end / put_revoke /
pre-emption (a pre-empted writer may still write: its ranges are discarded, not freed). A put
that would take its tenant past its quota is refused before any allocation or eviction.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from kvcake.core import integrity
from kvcake.core.api import StoreEventKind
from kvcake.core.ids import ClientId, ObjectKey
from kvcake.store.changes import Changes
from kvcake.store.config import MasterConfig
from kvcake.store.errors import (
    InvalidParams,
    NoSpace,
    ObjectAlreadyExists,
    ObjectHasLease,
    ObjectNotFound,
    ReplicaNotReady,
    SpacePending,
)
from kvcake.store.events import EventLog
from kvcake.store.filetier import FileTier
from kvcake.store.metadata import ObjectMeta, Replica, Segment, Status, Tier
from kvcake.store.objtable import ObjectTable
from kvcake.store.protocol import PutOptions, ReplicaDesc
from kvcake.store.segtable import SegmentTable
from kvcake.store.strategy import make as make_strategy
from kvcake.store.tenants import TenantQuotas, check_tenant

MAX_KEY_LEN = 4096
MEMORY, MEMORY_V = Tier.MEMORY, Tier.MEMORY.value
_COMPLETE, _PROCESSING = Status.COMPLETE, Status.PROCESSING


def check_key(key: str) -> ObjectKey:
    if not key:
        raise InvalidParams("empty key")
    if len(key) > MAX_KEY_LEN:
        raise InvalidParams(f"key longer than {MAX_KEY_LEN} characters")
    return ObjectKey(key)


def check_put(cfg: MasterConfig, size: int, opts: PutOptions, tenant: str) -> None:
    check_tenant(tenant)
    if size <= 0:
        raise InvalidParams(f"object size must be > 0, got {size}")
    if opts.replica_num < 1 or opts.replica_num > 64:
        raise InvalidParams(f"replica_num must be in [1, 64], got {opts.replica_num}")
    if opts.soft_pin_ttl_ms < 0 or opts.soft_pin_ttl_ms > cfg.max_soft_pin_ttl_ms:
        raise InvalidParams(f"soft_pin_ttl_ms {opts.soft_pin_ttl_ms} out of range")


class Writes:
    def __init__(
        self,
        cfg: MasterConfig,
        table: ObjectTable,
        segs: SegmentTable,
        files: FileTier,
        tenants: TenantQuotas,
        placeable: Callable[[], list[Segment]],
        make_room: Callable[[int], None],
        events: EventLog,
        changes: Changes,
    ):
        self.cfg = cfg
        self.table = table
        self.objects = table.objects
        self.processing = table.processing
        self.segs = segs
        self.files = files
        self.tenants = tenants
        self.placeable = placeable  # memory segments a new replica may go to
        self.make_room = make_room  # evict towards that many bytes (bounded)
        self.events = events
        self.changes = changes
        self.clock = table.clock
        self.rng = random.Random(cfg.seed)
        self.strategy = make_strategy(cfg.allocation_strategy)
        self.put_start_alloc_failures = 0  # put_starts refused: no space even after evicting

    def put_start(
        self,
        client: ClientId,
        host: str,
        okey: ObjectKey,
        size: int,
        opts: PutOptions,
        upsert: bool,
        tenant: str,
        fence: int = 0,
    ) -> list[ReplicaDesc]:
        """Allocate replicas for ``okey`` (status PROCESSING); arguments already checked.
        ``fence``: the request's write fence (0: a new one)."""
        obj = self.objects.get(okey)
        if obj is not None:
            reuse = self._replace(obj, client, size, upsert)
            if reuse is not None:
                self._apply_pins(reuse, opts)
                self.files.reserve(reuse)
                self.segs.fence(reuse.replicas, fence)  # a new writer: the old one's are stale
                self.changes.writing(okey, size)  # rewritten in place: its ranges are held
                return [self.segs.describe(r) for r in reuse.replicas]
        self.tenants.admit(tenant, size)  # before _place: never evict for an over-quota put
        reps = self._place(size, opts, host)
        self.segs.fence(reps, fence)
        obj = ObjectMeta(okey, size, Status.PROCESSING, client, self.clock(), reps)
        obj.tenant = tenant
        self.tenants.charge(tenant, size)
        self._apply_pins(obj, opts)
        self.files.reserve(obj)
        self.objects[okey] = obj
        self.processing[okey] = obj
        self.changes.writing(okey, size)  # a new leader must not hand these ranges out at once
        return [self.segs.describe(r) for r in reps]

    def _replace(
        self, obj: ObjectMeta, client: ClientId, size: int, upsert: bool
    ) -> ObjectMeta | None:
        """Deal with an existing object; returns it when it is rewritten in place."""
        if obj.status is _COMPLETE:
            self.changes.object(obj.key)
        now = self.clock()
        if obj.status is _PROCESSING:
            if now - obj.put_started <= self.cfg.put_start_timeout_s:
                raise ObjectAlreadyExists(f"{obj.key!r} is being written")
            self.table.drop(obj)  # pre-empted: its space is reused only after the writer's grace
            return None
        if not upsert:
            raise ObjectAlreadyExists(f"{obj.key!r} exists (put never overwrites; use upsert)")
        if self.table.leased(obj):
            raise ObjectHasLease(f"{obj.key!r} is being read")
        if obj.copying:
            raise ReplicaNotReady(f"{obj.key!r} is being copied between tiers")
        mem = [r for r in obj.memory() if r.complete]
        if size == obj.size and mem:
            self.table.free_persistent(obj)
            obj.replicas = mem
            self.events.emit(StoreEventKind.REMOVED, (obj.key,))  # invisible while rewritten
            obj.status, obj.writer, obj.put_started = _PROCESSING, client, now
            self.processing[obj.key] = obj
            return obj
        self.table.drop(obj)
        return None

    def _apply_pins(self, obj: ObjectMeta, opts: PutOptions) -> None:
        obj.hard_pin = obj.hard_pin or opts.hard_pin
        if opts.soft_pin == "enable":
            ttl_ms = opts.soft_pin_ttl_ms or self.cfg.default_soft_pin_ttl_ms
            obj.soft_pin_ttl_s = ttl_ms / 1000
        elif opts.soft_pin == "disable":
            obj.soft_pin_ttl_s, obj.soft_pin_until = 0.0, 0.0

    def _place(self, size: int, opts: PutOptions, host: str) -> list[Replica]:
        if not self.segs.memory():
            raise NoSpace(
                "no memory segment is mounted in the pool: start a store-server "
                "(kvcake store-server --master ...) or give a client segment_size > 0"
            )
        reps = self._try_place(size, opts, host)
        if not reps:  # allocation failure: evict, retry once
            pool = sum(s.allocator.capacity for s in self.segs.memory())
            self.make_room(max(size * opts.replica_num, int(pool * self.cfg.eviction_ratio)))
            reps = self._try_place(size, opts, host)
        if not reps:
            self.put_start_alloc_failures += 1
            offloading, file_writes = self.table.offloading, self.files.writes
            if offloading or file_writes:
                raise SpacePending(
                    f"no segment has {size} free bytes yet: {len(offloading)} objects are "
                    f"being offloaded to disk, {len(file_writes)} written to the file tier "
                    "to make room (retry shortly)"
                )
            raise NoSpace(f"no segment has {size} free bytes (and nothing can be evicted)")
        return reps

    def _try_place(self, size: int, opts: PutOptions, host: str) -> list[Replica]:
        segs = self.placeable()
        order = self.strategy.order(segs, host, self.rng)
        if opts.preferred_segments:
            by_name: dict[str, Segment] = {s.name: s for s in segs}
            preferred = [by_name[n] for n in opts.preferred_segments if n in by_name]
            order = preferred + [s for s in order if s not in preferred]
        reps: list[Replica] = []
        for seg in order:
            if len(reps) == opts.replica_num:
                break
            off = seg.allocator.allocate(size)
            if off is not None:
                reps.append(Replica(seg.name, off, size, MEMORY, complete=True))
        return reps

    def put_end(self, client: ClientId, key: str, sums: list[int] | None) -> None:
        obj = self.writing(client, key)
        if sums and not integrity.well_formed(obj.size, sums):
            self.table.drop(obj)
            raise InvalidParams(
                f"{key!r}: {len(sums)} checksums for {obj.size} bytes, or one out of range "
                f"(want {integrity.chunk_count(obj.size)} unsigned 64-bit values)"
            )
        obj.sums = list(sums) if sums else []
        obj.status = _COMPLETE
        self.processing.pop(obj.key, None)
        if self.files.tier is not None:
            self.files.put_end(obj, client)
        self.events.emit(StoreEventKind.STORED, (obj.key,), MEMORY_V)
        obj.soft_pin_until = self.clock() + obj.soft_pin_ttl_s if obj.soft_pin_ttl_s else 0.0
        self.objects.move_to_end(obj.key)
        self.changes.object(key)

    def writing(self, client: ClientId, key: str) -> ObjectMeta:
        """The PROCESSING object ``key`` that ``client`` is writing."""
        obj = self.objects.get(check_key(key))
        if obj is None or obj.status is not _PROCESSING or obj.writer != client:
            raise ObjectNotFound(f"no put of {key!r} by this client in progress (pre-empted?)")
        return obj
