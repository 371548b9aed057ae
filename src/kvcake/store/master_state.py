"""The master's state machine: segments, objects, leases, pins, tiers. Pure logic (no I/O, an
injectable clock) so it is unit-testable; the server wraps it with sockets and threads.

:class:`MasterState` owns the lock and its parts (``self.parts``, wired in
:mod:`kvcake.store.master_parts`); each part owns one kind of record, is called with the lock
held, takes no lock and never calls the state back: ``ClientTable`` (clients, who must remount),
``SegmentTable`` (segments and their allocators, node tasks, discarded ranges), ``ObjectTable``
(the LRU-ordered objects; freeing and dropping them), ``FileTier``, ``Tiering`` (eviction,
offload, promotion), ``ReplicaOps`` (copy, drop), ``Writes`` (put_start / put_end),
``Lookups`` (reads, removal), ``Membership`` (mount, unmount, expiry), ``AdminViews``
(read-only views); beside them the tenants' quotas, the dedup table, the KV event log and a
:class:`~kvcake.store.changes.Changes` that hears every mutation (the HA journal). The public
methods below take the lock and delegate.

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

import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, TypeVarTuple

from kvcake.core.api import StoreSnapshot
from kvcake.core.ids import ClientId, SegmentName
from kvcake.store.admin import HotKey, KeyView, SegmentView
from kvcake.store.changes import Changes
from kvcake.store.config import MasterConfig
from kvcake.store.errors import ObjectNotFound, SegmentNotFound
from kvcake.store.filetier import FILE_SEGMENT, REAP_BATCH, reap_files
from kvcake.store.master_parts import PartCounter, wire
from kvcake.store.membership import OwnerDead
from kvcake.store.metadata import NodeTask, Tier
from kvcake.store.patterns import match_regex, matcher
from kvcake.store.protocol import PutOptions, ReplicaDesc, ReqId
from kvcake.store.writes import check_key, check_put

R = TypeVar("R")
Ts = TypeVarTuple("Ts")


class MasterState:
    def __init__(
        self,
        config: MasterConfig,
        clock: Callable[[], float] = time.monotonic,
        owner_dead: OwnerDead = lambda c, s: False,
        changes: Changes | None = None,
    ):
        self.cfg = config
        self.clock = clock
        self.lock = threading.RLock()  # the one lock: every part is called with it held
        p = self.parts = wire(config, clock, owner_dead, changes or Changes())
        self.changes, self.dedup = p.changes, p.dedup
        self.events, self.tenants = p.events, p.tenants
        # The records, for the server, metrics, replay and tests (read them under the lock).
        self.objects, self.processing = p.table.objects, p.table.processing
        self.offloading, self.copies = p.table.offloading, p.replicas.copies
        self.segments, self.tasks = p.segs.segments, p.segs.tasks
        self.clients, self.rejoin = p.clients.clients, p.clients.rejoin
        self.file_writes, self.file_unlinks = p.files.writes, p.files.unlinks
        self.file_orphans = p.files.orphans

    def check(self) -> None:
        """Assert allocator invariants, that every replica lies in a mounted segment, and each
        tenant's charge == the sizes of its objects."""
        with self.lock:
            self.parts.segs.check()
            self.parts.table.check()
            self.tenants.check(self.objects.values())

    def once(self, client: ClientId, rid: ReqId | None, apply: Callable[[*Ts], R], *args: *Ts) -> R:
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

    def touch(self, client: ClientId, host: str) -> bool:
        """Record a sign of life; False when the client was unknown (it must remount)."""
        with self.lock:
            return self.parts.clients.touch(client, host)

    def heard(self, client: ClientId, host: str) -> int:
        """A heartbeat: :meth:`ClientTable.heard <kvcake.store.clients.ClientTable.heard>`."""
        with self.lock:
            return self.parts.clients.heard(client, host)

    def fence_notes(
        self, client: ClientId, acked: int
    ) -> tuple[list[tuple[str, int, int, int]], list[tuple[str, int]]]:
        """The noted allocations in ``client``'s segments it has not acknowledged, and its
        segments' fence floors (store/fences.py)."""
        with self.lock:
            segs = self.parts.segs
            return segs.fences.take(client, acked), segs.floors(client)

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
        """:meth:`Membership.mount <kvcake.store.membership.Membership.mount>`."""
        with self.lock:
            return self.parts.members.mount(
                client, host, name, capacity, tier, endpoint, existing, existing_sums, host_id
            )

    def lease_expired(self, client: ClientId) -> bool:
        """A known client that has been silent for longer than ``client_ttl_s`` (the
        housekeeper has not expired it yet)."""
        with self.lock:
            return self.parts.clients.expired(client)

    def unmount(self, client: ClientId, name: SegmentName) -> None:
        with self.lock:
            seg = self.segments.get(name)
            if seg is None or seg.client != client:
                raise SegmentNotFound(f"segment {name!r} is not mounted by this client")
            self.parts.members.drop_segment(seg)

    def sweep_processing(self) -> int:
        with self.lock:
            return self.parts.members.sweep_processing()

    def expire_clients(self) -> list[ClientId]:
        with self.lock:
            return self.parts.members.expire_clients()

    def put_start(
        self,
        client: ClientId,
        host: str,
        key: str,
        size: int,
        opts: PutOptions = PutOptions(),
        upsert: bool = False,
        tenant: str = "",
        fence: int = 0,
    ) -> list[ReplicaDesc]:
        """Allocate replicas for ``key`` (status PROCESSING) and return where to write them.
        A put that would take ``tenant`` past its quota is refused before any allocation.
        ``fence``: its ranges' write fence (:meth:`new_fence`: one per request; 0: a new one)."""
        okey = check_key(key)
        check_put(self.cfg, size, opts, tenant)
        with self.lock:
            self.parts.clients.touch(client, host)
            writes = self.parts.writes
            return writes.put_start(client, host, okey, size, opts, upsert, tenant, fence)

    def fence_floors(self, client: ClientId) -> list[tuple[str, int]]:
        """``client``'s segments' fence floors (store/fences.py): a mount's reply."""
        with self.lock:
            return self.parts.segs.floors(client)

    def new_fence(self) -> int:
        """A write fence for one request's allocations (store/fences.py)."""
        with self.lock:
            return self.parts.segs.fences.next()

    def put_end(self, client: ClientId, key: str, sums: list[int] | None = None) -> None:
        """``sums``: the writer's checksums of the value (None or [] = none); malformed ones
        (count, range) fail the put with InvalidParams and free its space."""
        with self.lock:
            self.parts.writes.put_end(client, key, sums)

    def put_revoke(self, client: ClientId, key: str) -> None:
        with self.lock:
            self.parts.table.drop(self.parts.writes.writing(client, key))

    def get_replicas(self, client: ClientId, key: str) -> tuple[int, list[ReplicaDesc]]:
        """Readable replicas of ``key`` and a fresh read lease on it."""
        size, reps, _ = self.lookup(client, key)
        return size, reps

    def lookup(self, client: ClientId, key: str) -> tuple[int, list[ReplicaDesc], list[int]]:
        """:meth:`get_replicas` plus the object's checksums."""
        okey = check_key(key)
        with self.lock:
            return self.parts.lookups.lookup(okey)

    def exist(self, client: ClientId, key: str) -> bool:
        try:
            self.get_replicas(client, key)
        except ObjectNotFound:
            return False
        return True

    def remove(self, key: str, force: bool = False) -> None:
        with self.lock:
            self.parts.lookups.remove(key, force)

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
        with self.lock:
            return self.parts.lookups.remove_keys(keys, force)

    def remove_all(self, force: bool = False, pattern: str = "", regex: str = "") -> int:
        return self.remove_keys(self.match_keys(pattern, regex), force)

    def used_ratio(self) -> float:
        with self.lock:
            return self.parts.tiering.used_ratio()

    def maybe_evict(self) -> int:
        with self.lock:
            return self.parts.tiering.maybe_evict()

    def evict(self, need: int, offload: bool, timed: bool = True) -> int:
        with self.lock:
            return self.parts.tiering.evict(need, offload, timed)

    def take_tasks(self, client: ClientId) -> list[NodeTask]:
        with self.lock:
            return self.parts.segs.take_tasks(client)

    def task_done(self, client: ClientId, kind: str, key: str, ok: bool, offset: int = -1) -> None:
        """A node reports a copy finished (``ok``) or failed; the replica becomes readable or
        is freed. A report for an object that is gone makes the node delete its disk copy.
        ``persist``: a client wrote (or failed to write) the file replica at ``offset``."""
        with self.lock:
            if kind == "persist":
                self.parts.files.done(client, key, offset, ok)
            else:
                self.parts.tiering.copy_done(client, kind, key, ok)
            self.changes.object(key)

    def mount_file_tier(self, directory: str, capacity: int) -> None:
        with self.lock:
            self.parts.files.mount(directory, capacity)
            self.changes.segment(FILE_SEGMENT)

    def reap_files(self, limit: int = REAP_BATCH, unlink: Callable[[str], None] = os.unlink) -> int:
        """Unlink up to ``limit`` dropped files (outside the lock), then release their ranges."""
        return reap_files(self.parts.files, self.lock, limit, unlink)

    def copy_start(self, client: ClientId, key: str, targets: list[str]) -> list[ReplicaDesc]:
        with self.lock:
            return self.parts.replicas.copy_start(client, key, targets)

    def copy_end(self, client: ClientId, key: str, ok: bool) -> None:
        with self.lock:
            self.parts.replicas.copy_end(client, key, ok)

    def drop_replica(self, client: ClientId, key: str, segment: str) -> None:
        with self.lock:
            self.parts.replicas.drop_replica(key, segment)

    def replica_bad(self, key: str, segment: str, offset: int, sums: list[int]) -> bool:
        with self.lock:
            return self.parts.replicas.replica_bad(key, segment, offset, sums)

    def sweep_copies(self, live: Callable[[ClientId], bool]) -> int:
        with self.lock:
            return self.parts.replicas.sweep_copies(live)

    def readable_keys(self, limit: int = 1_000_000) -> list[str]:
        with self.lock:
            return self.parts.admin.readable_keys(limit)

    def describe_key(self, key: str) -> KeyView | None:
        with self.lock:
            return self.parts.admin.describe_key(key)

    def segment_stats(self) -> list[SegmentView]:
        with self.lock:
            return self.parts.admin.segment_stats()

    def hottest(self, limit: int = 20) -> list[HotKey]:
        with self.lock:
            return self.parts.admin.hottest(limit)

    def kv_snapshot(self) -> StoreSnapshot:
        with self.lock:
            return self.parts.admin.kv_snapshot()

    def mooncake_gauges(self) -> dict[str, Any]:
        with self.lock:
            counters = {
                "master_active_clients": len(self.clients),
                "master_evicted_key_count": self.evicted_objects,
                "master_evicted_size_bytes": self.evicted_bytes,
                "master_put_start_failures": self.put_start_alloc_failures,
            }
            return self.parts.admin.mooncake_gauges(counters)

    # Counters of the parts, read by metrics.py (a read of an int needs no lock).
    evicted_objects = PartCounter("tiering", "evicted_objects")
    evicted_bytes = PartCounter("tiering", "evicted_bytes")
    offloads = PartCounter("tiering", "offloads")
    promotions = PartCounter("tiering", "promotions")
    file_full = PartCounter("files", "full")
    file_failed = PartCounter("files", "failed")
    swept = PartCounter("members", "swept")
    put_start_alloc_failures = PartCounter("writes", "put_start_alloc_failures")
