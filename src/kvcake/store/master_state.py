"""The master's state machine: segments, objects, leases, pins, tiers. Pure logic (no I/O, an
injectable clock) so it is unit-testable; the server wraps it with sockets and threads.

Invariants:
- Locking: every public method takes ``self.lock``; records are never touched outside it.
- Only COMPLETE objects are visible (get/exist); a PROCESSING object's space is owned by its writer
  until put_end / put_revoke / pre-emption.
- Never evicted or removed without ``force``: leased (a reader may be copying), PROCESSING, or
  being copied between tiers. Hard-pinned objects are never evicted (remove still deletes them);
  soft-pinned ones only when nothing else can be.
- Per segment, allocated + free == capacity (:meth:`check`).
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from kvcake.core import integrity
from kvcake.core.api import StoreEventKind, StoreSnapshot
from kvcake.core.ids import ClientId, ObjectKey, SegmentName
from kvcake.store.admin import AdminMixin
from kvcake.store.allocator import RangeAllocator
from kvcake.store.config import MasterConfig
from kvcake.store.dedup import DedupTable
from kvcake.store.errors import (
    InvalidParams,
    NoSpace,
    ObjectAlreadyExists,
    ObjectHasLease,
    ObjectNotFound,
    ReplicaNotReady,
    SegmentNotFound,
    SpacePending,
)
from kvcake.store.events import EventLog
from kvcake.store.filetier import FILE_SEGMENT, FileTierMixin, file_path
from kvcake.store.metadata import ClientInfo, NodeTask, ObjectMeta, Replica, Segment, Status, Tier
from kvcake.store.patterns import match_regex, matcher
from kvcake.store.protocol import PutOptions, ReplicaDesc, ReqId
from kvcake.store.replica_ops import ReplicaOpsMixin
from kvcake.store.strategy import make as make_strategy
from kvcake.store.tenants import TenantQuotas, check_tenant, parse_quotas
from kvcake.store.tiering import TieringMixin

MAX_KEY_LEN = 4096
SYNC_EVICT_STEPS = 4  # eviction batches a put_start may run when allocation fails
MEMORY = Tier.MEMORY  # module constant: enum attribute lookups are slow on hot paths
FILE = Tier.FILE
MEMORY_V = MEMORY.value
_COMPLETE, _PROCESSING = Status.COMPLETE, Status.PROCESSING
_STORED, _REMOVED = StoreEventKind.STORED, StoreEventKind.REMOVED
R = TypeVar("R")


def readable_tiers(obj: ObjectMeta) -> set[Tier]:
    if obj.status is not Status.COMPLETE:
        return set()
    return {r.tier for r in obj.replicas if r.complete}


def check_key(key: str) -> ObjectKey:
    if not key:
        raise InvalidParams("empty key")
    if len(key) > MAX_KEY_LEN:
        raise InvalidParams(f"key longer than {MAX_KEY_LEN} characters")
    return ObjectKey(key)


class MasterState(TieringMixin, FileTierMixin, AdminMixin, ReplicaOpsMixin):
    def __init__(
        self,
        config: MasterConfig,
        clock: Callable[[], float] = time.monotonic,
        owner_dead: Callable[[ClientId, SegmentName], bool] = lambda c, s: False,
    ):
        self.cfg = config
        self.clock = clock
        # Whether the process of ``client`` (holding ``segment``) is known to be gone, e.g. its
        # pid no longer exists on this host: its segments are then released to a new owner.
        self.owner_dead = owner_dead
        self.dedup: DedupTable[object] = DedupTable(config.dedup_sessions, config.dedup_pending)
        # PROCESSING objects in put_start order (the clock is monotonic): the sweep reads the head.
        self.processing: OrderedDict[ObjectKey, ObjectMeta] = OrderedDict()
        self.swept = 0
        self.events = EventLog(config.events_buffer)
        self._barren = 0
        self._evicting = False
        self.lock = threading.RLock()
        self.rng = random.Random(config.seed)
        self.strategy = make_strategy(config.allocation_strategy)
        self.segments: dict[SegmentName, Segment] = {}
        self._mem_segments: list[Segment] | None = None
        self.objects: OrderedDict[ObjectKey, ObjectMeta] = OrderedDict()  # LRU order
        self.clients: dict[ClientId, ClientInfo] = {}
        self.tasks: dict[ClientId, list[NodeTask]] = {}
        self.discarded: list[tuple[float, SegmentName, int]] = []  # (free at, segment, offset)
        self.evicted_objects = 0
        self.offloading: dict[ObjectKey, int] = {}
        self.evicted_bytes = 0
        self.evicted_disk_objects = 0
        self.copies: dict[ObjectKey, tuple[ClientId, float]] = {}  # replica_ops
        self.offloads = 0
        self.promotions = 0
        self.put_start_alloc_failures = 0  # put_starts refused: no space even after evicting
        self.tenants = TenantQuotas(parse_quotas(config.tenant_quotas), config.tenant_quota)
        self._init_file_tier()

    def check(self) -> None:
        """The tiering invariants, and each tenant's charge == the sizes of its objects."""
        super().check()
        with self.lock:
            self.tenants.check(self.objects.values())

    # --- the mutation entry point ------------------------------------------------------------

    def once(self, client: ClientId, rid: ReqId | None, apply: Callable[..., R], *args: Any) -> R:
        """Run one mutating request at most once: a duplicate of ``rid`` (a retry after a lost
        reply) gets the first outcome back without running ``apply`` again; a duplicate the
        client already acknowledged raises :class:`~kvcake.store.dedup.StaleRequest`.
        ``apply`` runs under the lock and must return its outcome (errors included) rather
        than raise, so that the outcome can be replayed. This is the one place every state
        change passes through (the HA operation log hooks in here). ``args`` are passed to
        ``apply`` (saves the RPC path a closure per request)."""
        with self.lock:
            if rid is None:
                return apply(*args)
            return self.dedup.run(client, rid.session, rid.seq, rid.ack, apply, *args)  # type: ignore[return-value]

    # --- clients and segments ---------------------------------------------------------------

    def touch(self, client: ClientId, host: str) -> bool:
        """Record a sign of life; False when the client was unknown (it must remount)."""
        with self.lock:
            info = self.clients.get(client)
            if info is None:
                self.clients[client] = ClientInfo(client, host, self.clock())
                return False
            info.last_seen = self.clock()
            return True

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
        with self.lock:
            self.touch(client, host)
            seg = self.segments.get(name)
            if seg is not None and seg.client != client and self._gone(seg.client, name):
                # The old owner's process is gone (killed and restarted under the same name):
                # release its segments now instead of after its client TTL.
                self._drop_client(seg.client)
                seg = None
            if seg is not None and seg.client != client:
                raise InvalidParams(
                    f"segment {name!r} is mounted by another client ({seg.client}), which is alive"
                )
            if seg is not None:
                return []  # idempotent remount
            seg = Segment(name, client, host, tier, RangeAllocator(capacity), endpoint, host_id)
            self.segments[name] = seg
            self._mem_segments = None
            self.clients[client].segments.add(name)
            sums = existing_sums or []
            rejected = [
                k
                for i, (k, size) in enumerate(existing or [])
                if not self._adopt(seg, k, size, sums[i] if i < len(sums) else [])
            ]
            if existing:
                bad = set(rejected)
                adopted = [k for k, _ in existing if k not in bad]
                self.events.emit(StoreEventKind.STORED, adopted, Tier.DISK.value)
            return rejected

    def _gone(self, client: ClientId, name: SegmentName) -> bool:
        return self.lease_expired(client) or self.owner_dead(client, name)

    def lease_expired(self, client: ClientId) -> bool:
        """A known client that has been silent for longer than ``client_ttl_s`` (the
        housekeeper has not expired it yet)."""
        with self.lock:
            info = self.clients.get(client)
            return info is not None and info.last_seen < self.clock() - self.cfg.client_ttl_s

    def _adopt(self, seg: Segment, key: str, size: int, sums: list[int]) -> bool:
        """A verified disk copy joins the pool only with well-formed checksums that are the
        object's own (a copy of an older version of the key never does)."""
        obj = self.objects.get(ObjectKey(key))
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
            self.objects[obj.key] = obj
            self.objects.move_to_end(obj.key, last=False)  # restored copies are coldest
        obj.replicas.append(rep)
        return True

    def unmount(self, client: ClientId, name: SegmentName) -> None:
        with self.lock:
            seg = self.segments.get(name)
            if seg is None or seg.client != client:
                raise SegmentNotFound(f"segment {name!r} is not mounted by this client")
            self._drop_segment(seg)

    def _drop_segment(self, seg: Segment) -> None:
        """Forget a segment and every replica on it; objects left without replicas vanish."""
        del self.segments[seg.name]
        self._mem_segments = None
        info = self.clients.get(seg.client)
        if info is not None:
            info.segments.discard(seg.name)
        lost: list[str] = []
        for key in list(self.objects):
            obj = self.objects[key]
            if not any(r.segment == seg.name for r in obj.replicas):
                continue
            had = seg.tier in readable_tiers(obj)
            obj.replicas = [r for r in obj.replicas if r.segment != seg.name]
            if obj.status is Status.PROCESSING or not obj.readable():
                self._drop_object(obj, None)
            if had and seg.tier not in readable_tiers(obj):
                lost.append(key)
        self.discarded = [d for d in self.discarded if d[1] != seg.name]
        self.events.emit(StoreEventKind.SEGMENT_LOST, lost, seg.tier.value, seg.name)

    def _drop_client(self, cid: ClientId) -> None:
        """Forget a client: its segments, its unfinished puts, its dedup sessions, its tasks."""
        info = self.clients.pop(cid, None)
        for name in sorted(info.segments if info else ()):
            if name in self.segments:
                self._drop_segment(self.segments[name])
        for obj in [o for o in self.processing.values() if o.writer == cid]:
            self._drop_object(obj)
        if self.file_writes:
            self.abandon_file_writes(cid, 0.0)
        self.tasks.pop(cid, None)
        self.dedup.forget_client(cid)

    def sweep_processing(self) -> int:
        """Drop puts left PROCESSING longer than ``put_start_timeout_s + put_start_discard_s``
        (a writer that slow may be pre-empted anyway, and its space is reusable by then).
        Puts of dead writers go in :meth:`expire_clients`. Bounded: only the stale head of
        the put_start-ordered index is read."""
        limit = self.clock() - self.cfg.put_start_timeout_s - self.cfg.put_start_discard_s
        n = 0
        with self.lock:
            while self.processing:
                obj = next(iter(self.processing.values()))
                if obj.put_started > limit:
                    break
                self._drop_object(obj)
                n += 1
            if self.file_writes:  # writers silent as long are given up too
                self.abandon_file_writes(None, limit)
            self.swept += n
        return n

    def expire_clients(self) -> list[ClientId]:
        """Unmount the segments of clients silent for longer than ``client_ttl_s``."""
        with self.lock:
            deadline = self.clock() - self.cfg.client_ttl_s
            dead = [c for c, info in self.clients.items() if info.last_seen < deadline]
            for cid in dead:
                self._drop_client(cid)
            return dead

    # --- replica helpers ----------------------------------------------------------------------

    def _free(self, rep: Replica) -> None:
        if rep.tier is FILE:
            self._free_file(rep)
            return
        seg = self.segments.get(rep.segment)
        if seg is not None:
            seg.allocator.release(rep.offset)

    def _drop_object(
        self, obj: ObjectMeta, event: StoreEventKind | None = StoreEventKind.REMOVED
    ) -> None:
        """Forget ``obj`` and free its replicas; ``event`` is published if it was readable
        (``None``: the caller publishes)."""
        if event is not None and obj.status is _COMPLETE and obj.readable():
            self.events.emit(event, (obj.key,), MEMORY_V if event is not _REMOVED else "")
        self.offloading.pop(obj.key, None)
        for rep in obj.replicas:
            self._free(rep)
            if rep.tier is Tier.DISK:
                self._queue_task(rep.segment, NodeTask("delete", obj.key, obj.size, 0))
        obj.replicas = []
        gone = self.objects.pop(obj.key, None)
        if gone is not None:
            self.tenants.release(gone.tenant, gone.size)
        self.processing.pop(obj.key, None)

    def _queue_task(self, segment: SegmentName, task: NodeTask) -> None:
        seg = self.segments.get(segment)
        if seg is not None:
            self.tasks.setdefault(seg.client, []).append(task)

    def describe(self, rep: Replica) -> ReplicaDesc:
        seg = self.segments[rep.segment]
        where = seg.endpoint if rep.tier is not FILE else file_path(seg.endpoint, rep.offset)
        return ReplicaDesc(rep.segment, seg.host, rep.offset, rep.size, rep.tier._value_, where)

    def leased(self, obj: ObjectMeta) -> bool:
        return obj.lease_until > self.clock()

    def memory_segments(self) -> list[Segment]:
        """Memory-tier segments (cached: rebuilt only when a segment is mounted/unmounted)."""
        if self._mem_segments is None:
            self._mem_segments = [s for s in self.segments.values() if s.tier is MEMORY]
        return self._mem_segments

    # --- writes -------------------------------------------------------------------------------

    def put_start(
        self,
        client: ClientId,
        host: str,
        key: str,
        size: int,
        opts: PutOptions = PutOptions(),
        upsert: bool = False,
        tenant: str = "",
    ) -> list[ReplicaDesc]:
        """Allocate replicas for ``key`` (status PROCESSING) and return where to write them.
        A put that would take ``tenant`` past its quota is refused before any allocation."""
        okey = check_key(key)
        check_tenant(tenant)
        if size <= 0:
            raise InvalidParams(f"object size must be > 0, got {size}")
        if opts.replica_num < 1 or opts.replica_num > 64:
            raise InvalidParams(f"replica_num must be in [1, 64], got {opts.replica_num}")
        if opts.soft_pin_ttl_ms < 0 or opts.soft_pin_ttl_ms > self.cfg.max_soft_pin_ttl_ms:
            raise InvalidParams(f"soft_pin_ttl_ms {opts.soft_pin_ttl_ms} out of range")
        with self.lock:
            self.touch(client, host)
            obj = self.objects.get(okey)
            if obj is not None:
                reuse = self._replace(obj, client, size, upsert)
                if reuse is not None:
                    self._apply_pins(reuse, opts)
                    self._reserve_file(reuse)
                    return [self.describe(r) for r in reuse.replicas]
            self.tenants.admit(tenant, size)  # before _place: never evict for an over-quota put
            reps = self._place(size, opts, host)
            obj = ObjectMeta(okey, size, Status.PROCESSING, client, self.clock(), reps)
            obj.tenant = tenant
            self.tenants.charge(tenant, size)
            self._apply_pins(obj, opts)
            self._reserve_file(obj)
            self.objects[okey] = obj
            self.processing[okey] = obj
            return [self.describe(r) for r in reps]

    def _replace(
        self, obj: ObjectMeta, client: ClientId, size: int, upsert: bool
    ) -> ObjectMeta | None:
        """Deal with an existing object; returns it when it is rewritten in place."""
        now = self.clock()
        if obj.status is Status.PROCESSING:
            if now - obj.put_started <= self.cfg.put_start_timeout_s:
                raise ObjectAlreadyExists(f"{obj.key!r} is being written")
            # Pre-empt the abandoned writer; it may still write, so its space is reused later.
            for rep in obj.replicas:
                self.discarded.append((now + self.cfg.put_start_discard_s, rep.segment, rep.offset))
            obj.replicas = []
            self.objects.pop(obj.key)
            self.tenants.release(obj.tenant, obj.size)
            self.processing.pop(obj.key, None)
            return None
        if not upsert:
            raise ObjectAlreadyExists(f"{obj.key!r} exists (put never overwrites; use upsert)")
        if self.leased(obj):
            raise ObjectHasLease(f"{obj.key!r} is being read")
        if obj.copying:
            raise ReplicaNotReady(f"{obj.key!r} is being copied between tiers")
        mem = [r for r in obj.memory() if r.complete]
        if size == obj.size and mem:
            for rep in obj.persistent():
                self._free(rep)
                if rep.tier is Tier.DISK:
                    self._queue_task(rep.segment, NodeTask("delete", obj.key, obj.size, 0))
            obj.replicas = mem
            self.events.emit(StoreEventKind.REMOVED, (obj.key,))  # invisible while rewritten
            obj.status, obj.writer, obj.put_started = Status.PROCESSING, client, now
            self.processing[obj.key] = obj
            return obj
        self._drop_object(obj)
        return None

    def _apply_pins(self, obj: ObjectMeta, opts: PutOptions) -> None:
        obj.hard_pin = obj.hard_pin or opts.hard_pin
        if opts.soft_pin == "enable":
            ttl_ms = opts.soft_pin_ttl_ms or self.cfg.default_soft_pin_ttl_ms
            obj.soft_pin_ttl_s = ttl_ms / 1000
        elif opts.soft_pin == "disable":
            obj.soft_pin_ttl_s, obj.soft_pin_until = 0.0, 0.0

    def _place(self, size: int, opts: PutOptions, host: str) -> list[Replica]:
        if not self.memory_segments():
            raise NoSpace(
                "no memory segment is mounted in the pool: start a store-server "
                "(kvcake store-server --master ...) or give a client segment_size > 0"
            )
        reps = self._try_place(size, opts, host)
        if not reps:  # allocation failure: evict, retry once
            pool = sum(s.allocator.capacity for s in self.memory_segments())
            need = max(size * opts.replica_num, int(pool * self.cfg.eviction_ratio))
            freed = 0
            for _ in range(SYNC_EVICT_STEPS):  # bounded: a few batches, not the whole table
                # An object with a disk tier to go to is offloaded, never dropped (its put was
                # acknowledged); the space comes once the node reports the copy done.
                step = self.evict(need - freed, self.cfg.offload_on_evict, timed=False)
                freed += step
                if freed >= need or (step == 0 and self._barren > len(self.objects)):
                    break
            self._reclaim_discarded(force=False)
            reps = self._try_place(size, opts, host)
        if not reps:
            self.put_start_alloc_failures += 1
            if self.offloading or self.file_writes:
                raise SpacePending(
                    f"no segment has {size} free bytes yet: {len(self.offloading)} objects are "
                    f"being offloaded to disk, {len(self.file_writes)} written to the file tier "
                    "to make room (retry shortly)"
                )
            raise NoSpace(f"no segment has {size} free bytes (and nothing can be evicted)")
        return reps

    def placeable_segments(self) -> list[Segment]:
        """Memory segments a new replica may go to (the HA journal leaves out replayed nodes
        that have not re-registered yet)."""
        return self.memory_segments()

    def _try_place(self, size: int, opts: PutOptions, host: str) -> list[Replica]:
        segs = self.placeable_segments()
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

    def put_end(self, client: ClientId, key: str, sums: list[int] | None = None) -> None:
        """``sums``: the writer's checksums of the value (None or [] = none); malformed ones
        (count, range) fail the put with InvalidParams and free its space."""
        with self.lock:
            obj = self._writing(client, key)
            if sums and not integrity.well_formed(obj.size, sums):
                self._drop_object(obj)
                raise InvalidParams(
                    f"{key!r}: {len(sums)} checksums for {obj.size} bytes, or one out of range "
                    f"(want {integrity.chunk_count(obj.size)} unsigned 64-bit values)"
                )
            obj.sums = list(sums) if sums else []
            obj.status = _COMPLETE
            self.processing.pop(obj.key, None)
            if self.file_tier is not None:
                self._file_put_end(obj, client)
            self.events.emit(_STORED, (obj.key,), MEMORY_V)
            obj.soft_pin_until = self.clock() + obj.soft_pin_ttl_s if obj.soft_pin_ttl_s else 0.0
            self.objects.move_to_end(obj.key)

    def put_revoke(self, client: ClientId, key: str) -> None:
        with self.lock:
            self._drop_object(self._writing(client, key))

    def _writing(self, client: ClientId, key: str) -> ObjectMeta:
        obj = self.objects.get(check_key(key))
        if obj is None or obj.status is not _PROCESSING or obj.writer != client:
            raise ObjectNotFound(f"no put of {key!r} by this client in progress (pre-empted?)")
        return obj

    # --- reads and removal --------------------------------------------------------------------

    def get_replicas(self, client: ClientId, key: str) -> tuple[int, list[ReplicaDesc]]:
        """Readable replicas of ``key`` and a fresh read lease on it."""
        size, reps, _ = self.lookup(client, key)
        return size, reps

    def lookup(self, client: ClientId, key: str) -> tuple[int, list[ReplicaDesc], list[int]]:
        """:meth:`get_replicas` plus the object's checksums."""
        okey = check_key(key)
        with self.lock:
            obj = self.objects.get(okey)
            reps = obj.readable() if obj is not None else []
            if obj is None or not reps:
                raise ObjectNotFound(f"{key!r} not found")
            obj.lease_until = max(obj.lease_until, self.clock() + self.cfg.lease_ttl_s)
            self.objects.move_to_end(okey)
            for r in reps:
                if r.tier is MEMORY:
                    break
            else:
                obj.disk_hits += 1
                if obj.disk_hits >= self.cfg.promote_after_hits:
                    self._start_promotion(obj)
            return obj.size, [self.describe(r) for r in reps], obj.sums

    def exist(self, client: ClientId, key: str) -> bool:
        try:
            self.get_replicas(client, key)
        except ObjectNotFound:
            return False
        return True

    def remove(self, key: str, force: bool = False) -> None:
        with self.lock:
            obj = self.objects.get(check_key(key))
            if obj is None:
                raise ObjectNotFound(f"{key!r} not found")
            if not force and self.leased(obj):
                raise ObjectHasLease(f"{key!r} has a read lease")
            if not force and (obj.status is Status.PROCESSING or obj.copying):
                raise ReplicaNotReady(f"{key!r} is being written")
            self._drop_object(obj)

    def kv_snapshot(self) -> StoreSnapshot:
        """What is readable now, as of the last published event (for subscribers' resync)."""
        with self.lock:
            keys = {}
            for k, o in self.objects.items():
                tiers = readable_tiers(o)
                if tiers:
                    keys[str(k)] = tuple(sorted(t.value for t in tiers))
            return StoreSnapshot(self.events.publisher, self.events.seq, keys)

    def match_keys(self, pattern: str = "", regex: str = "") -> list[str]:
        """Keys matching a prefix/glob ``pattern`` or a ``regex`` (store/patterns.py). Only the
        key list is copied under the lock; matching runs off it."""
        match = matcher(pattern)  # validates before the copy
        with self.lock:
            keys: list[str] = list(self.objects)
        if regex:
            return match_regex(regex, keys)
        return keys if not pattern else [k for k in keys if match(k)]

    def remove_keys(self, keys: list[str], force: bool = False) -> int:
        """Remove what is still there of ``keys``; leased/busy ones are skipped unless
        ``force``. Work under the lock is proportional to ``len(keys)``."""
        removed = 0
        with self.lock:
            for key in keys:
                try:
                    self.remove(key, force)
                    removed += 1
                except (ObjectNotFound, ObjectHasLease, ReplicaNotReady):
                    continue
        return removed

    def remove_all(self, force: bool = False, pattern: str = "", regex: str = "") -> int:
        return self.remove_keys(self.match_keys(pattern, regex), force)
