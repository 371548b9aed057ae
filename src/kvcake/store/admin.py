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
