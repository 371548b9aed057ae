"""Read-only admin views of the master's state (mixed into :class:`MasterState`; same lock):
what the HTTP endpoints and metrics show, so no caller reads the records directly."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from kvcake.core.ids import ObjectKey, SegmentName
from kvcake.store.metadata import ObjectMeta, Segment


class AdminMixin:
    lock: threading.RLock
    segments: dict[SegmentName, Segment]
    objects: OrderedDict[ObjectKey, ObjectMeta]

    def leased(self, obj: ObjectMeta) -> bool:
        raise NotImplementedError

    def readable_keys(self, limit: int = 1_000_000) -> list[str]:
        """Keys of readable objects, least recently used first (at most ``limit``)."""
        out: list[str] = []
        with self.lock:
            for k, o in self.objects.items():
                if len(out) >= limit:
                    break
                if o.readable():
                    out.append(str(k))
        return out

    def describe_key(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self.objects.get(ObjectKey(key))
            if obj is None:
                return None
            return {
                "key": key,
                "size": obj.size,
                "status": obj.status.value,
                "hard_pin": obj.hard_pin,
                "leased": self.leased(obj),
                "replicas": [
                    {
                        "segment": r.segment,
                        "offset": r.offset,
                        "size": r.size,
                        "tier": r.tier.value,
                        "complete": r.complete,
                    }
                    for r in obj.replicas
                ],
            }

    def mooncake_gauges(self) -> dict[str, Any]:
        """The pool figures Mooncake's master exports (``master_metric_manager.cpp`` names):
        memory and file (disk tier) bytes, per-segment memory bytes, keys, clients, evictions,
        put-start allocation failures."""
        with self.lock:
            mem = [s for s in self.segments.values() if s.tier.value == "memory"]
            disk = [s for s in self.segments.values() if s.tier.value != "memory"]
            st: Any = self
            return {
                "master_key_count": len(self.objects),
                "master_allocated_bytes": sum(s.allocator.allocated for s in mem),
                "master_total_capacity_bytes": sum(s.allocator.capacity for s in mem),
                "master_allocated_file_size_bytes": sum(s.allocator.allocated for s in disk),
                "master_total_file_capacity_bytes": sum(s.allocator.capacity for s in disk),
                "master_active_clients": len(getattr(st, "clients", {})),
                "master_evicted_key_count": getattr(st, "evicted_objects", 0),
                "master_evicted_size_bytes": getattr(st, "evicted_bytes", 0),
                "master_put_start_failures": getattr(st, "put_start_alloc_failures", 0),
                "segment_allocated_bytes": {s.name: s.allocator.allocated for s in mem},
                "segment_total_capacity_bytes": {s.name: s.allocator.capacity for s in mem},
            }

    def segment_stats(self) -> list[dict[str, Any]]:
        with self.lock:
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

    def hottest(self, limit: int = 20) -> list[dict[str, Any]]:
        """The ``limit`` most recently used readable objects (the far end of the LRU order
        eviction works from), newest first, each with its replicas (for dashboards)."""
        out: list[dict[str, Any]] = []
        with self.lock:
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
                            "replicas": [
                                {"segment": r.segment, "tier": r.tier.value} for r in reps
                            ],
                        }
                    )
        return out
