"""Read-only views of the master's records (a part of
:class:`~kvcake.store.master_state.MasterState`: :class:`AdminViews`): what the HTTP endpoints,
metrics and KV-event subscribers see, so no caller reads the records directly.

Invariants: called with the state lock held; reads, never changes, the object and segment
tables it is given.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from kvcake.core.api import StoreSnapshot
from kvcake.core.ids import ObjectKey, SegmentName
from kvcake.store.events import EventLog
from kvcake.store.metadata import ObjectMeta, Segment, Status, Tier


def readable_tiers(obj: ObjectMeta) -> set[Tier]:
    if obj.status is not Status.COMPLETE:
        return set()
    return {r.tier for r in obj.replicas if r.complete}


class ReplicaView(TypedDict):
    segment: str
    offset: int
    size: int
    tier: str
    complete: bool


class KeyView(TypedDict):
    """One object as the HTTP API's ``/query_key`` shows it."""

    key: str
    size: int
    status: str
    hard_pin: bool
    leased: bool
    replicas: list[ReplicaView]


class SegmentView(TypedDict):
    name: str
    client: str
    host: str
    tier: str
    capacity: int
    used: int
    fragmentation: float


class HotReplica(TypedDict):
    segment: str
    tier: str


class HotKey(TypedDict):
    key: str
    size: int
    disk_hits: int
    replicas: list[HotReplica]


def _replica_view(obj: ObjectMeta) -> list[ReplicaView]:
    return [
        {
            "segment": r.segment,
            "offset": r.offset,
            "size": r.size,
            "tier": r.tier.value,
            "complete": r.complete,
        }
        for r in obj.replicas
    ]


class AdminViews:
    def __init__(
        self,
        objects: OrderedDict[ObjectKey, ObjectMeta],
        segments: Mapping[SegmentName, Segment],
        leased: Callable[[ObjectMeta], bool],
        events: EventLog,
    ):
        self.objects = objects  # in LRU order
        self.segments = segments
        self.leased = leased
        self.events = events

    def readable_keys(self, limit: int = 1_000_000) -> list[str]:
        """Keys of readable objects, least recently used first (at most ``limit``)."""
        out: list[str] = []
        for k, o in self.objects.items():
            if len(out) >= limit:
                break
            if o.readable():
                out.append(str(k))
        return out

    def describe_key(self, key: str) -> KeyView | None:
        obj = self.objects.get(ObjectKey(key))
        if obj is None:
            return None
        return {
            "key": key,
            "size": obj.size,
            "status": obj.status.value,
            "hard_pin": obj.hard_pin,
            "leased": self.leased(obj),
            "replicas": _replica_view(obj),
        }

    def mooncake_gauges(self, counters: Mapping[str, int]) -> dict[str, Any]:
        """The pool figures Mooncake's master exports (``master_metric_manager.cpp`` names):
        memory and file (disk tier) bytes, per-segment memory bytes, keys; ``counters`` (the
        clients, evictions, put-start allocation failures) go in the middle."""
        mem = [s for s in self.segments.values() if s.tier.value == "memory"]
        disk = [s for s in self.segments.values() if s.tier.value != "memory"]
        return {
            "master_key_count": len(self.objects),
            "master_allocated_bytes": sum(s.allocator.allocated for s in mem),
            "master_total_capacity_bytes": sum(s.allocator.capacity for s in mem),
            "master_allocated_file_size_bytes": sum(s.allocator.allocated for s in disk),
            "master_total_file_capacity_bytes": sum(s.allocator.capacity for s in disk),
            **counters,
            "segment_allocated_bytes": {s.name: s.allocator.allocated for s in mem},
            "segment_total_capacity_bytes": {s.name: s.allocator.capacity for s in mem},
        }

    def segment_stats(self) -> list[SegmentView]:
        return [
            {
                "name": s.name,
                "client": s.client,
                "host": s.host,
                "tier": s.tier.value,
                "capacity": s.allocator.capacity,
                "used": s.allocator.allocated,
                "fragmentation": round(s.allocator.fragmentation(), 4),
            }
            for s in self.segments.values()
        ]

    def hottest(self, limit: int = 20) -> list[HotKey]:
        """The ``limit`` most recently used readable objects (the far end of the LRU order
        eviction works from), newest first, each with its replicas (for dashboards)."""
        out: list[HotKey] = []
        for key in reversed(self.objects):
            if len(out) >= limit:
                break
            obj = self.objects[key]
            reps = obj.readable()
            if reps:
                out.append(
                    {
                        "key": str(key),
                        "size": obj.size,
                        "disk_hits": obj.disk_hits,
                        "replicas": [{"segment": r.segment, "tier": r.tier.value} for r in reps],
                    }
                )
        return out

    def kv_snapshot(self) -> StoreSnapshot:
        """What is readable now, as of the last published event (for subscribers' resync)."""
        keys = {}
        for k, o in self.objects.items():
            tiers = readable_tiers(o)
            if tiers:
                keys[str(k)] = tuple(sorted(t.value for t in tiers))
        return StoreSnapshot(self.events.publisher, self.events.seq, keys)
