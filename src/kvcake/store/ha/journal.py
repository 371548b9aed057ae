"""A :class:`MasterState` that notes what each request changed, so the change can be logged
before the request is acknowledged.

Every mutation point marks the object key or segment name it touched (in the state and in the
calling thread notes that it changed something). :meth:`JournaledState.flush`, called after a
request, turns the dirty marks into records of the *current* state (see :mod:`.view`) under the
state lock, appends them to the log and returns the ticket the request must wait for: the end
of the log at that moment if this thread changed anything (its marks may have been logged by
another thread's flush; they are then in the same or an earlier group commit), else 0. Marks
made by housekeeping (eviction, client expiry) are flushed by the log's idle poll.

Replayed clients (segments known from the log) are told "unknown, remount" by their heartbeat
until they mount again: that makes them follow a moved Transfer Engine directory and re-publish
their segments in it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kvcake.core.ids import ClientId, SegmentName
from kvcake.store.config import MasterConfig
from kvcake.store.filetier import FILE_SEGMENT
from kvcake.store.ha.oplog import OpLog
from kvcake.store.ha.view import ObjGone, ObjRec, Record, SegGone, SegRec
from kvcake.store.master_state import MasterState
from kvcake.store.metadata import ObjectMeta, Segment, Status


class JournaledState(MasterState):
    def __init__(
        self, config: MasterConfig, clock: Callable[[], float] = time.monotonic, **kw: Any
    ):
        super().__init__(config, clock, **kw)
        self.rejoin: set[ClientId] = set()
        self._dirty: dict[tuple[str, str], None] = {}  # ordered set of ("o"|"s", name)
        self._local = threading.local()

    # --- marks --------------------------------------------------------------------------------

    def _mark(self, kind: str, name: str) -> None:
        self._dirty[(kind, name)] = None
        self._local.changed = True

    def records(self) -> list[Record]:
        """Drain the dirty marks into records (segments first); caller holds the lock."""
        marks = list(self._dirty)
        self._dirty.clear()
        marks.sort(key=lambda m: m[0] != "s")
        out: list[Record] = []
        for kind, name in marks:
            out.append(self._seg_record(name) if kind == "s" else self._obj_record(name))
        return out

    def _seg_record(self, name: str) -> Record:
        seg = self.segments.get(SegmentName(name))
        if seg is None:
            return SegGone(name)
        return SegRec(
            seg.name,
            seg.client,
            seg.host,
            seg.tier.value,
            seg.allocator.capacity,
            seg.endpoint,
            seg.host_id,
        )

    def _obj_record(self, key: str) -> Record:
        obj = self.objects.get(key)  # type: ignore[call-overload]
        if obj is None or obj.status is not Status.COMPLETE:
            return ObjGone(key)
        reps = [(r.segment, r.offset, r.tier.value) for r in obj.replicas if r.complete]
        if not reps:
            return ObjGone(key)
        return ObjRec(key, obj.size, obj.hard_pin, reps, obj.tenant, obj.sums)

    def flush(self, log: OpLog) -> int:
        """Log what changed; return the ticket covering everything this thread touched."""
        with self.lock:
            recs = self.records()
            if recs:
                log.append(recs)
            if not getattr(self._local, "changed", False):
                return 0
            self._local.changed = False
            return log.appended

    # --- mutation points (each calls the real one, then marks) --------------------------------

    def placeable_segments(self) -> list[Segment]:
        """Right after a take-over the replayed storage nodes are not yet in this leader's
        Transfer Engine directory (they re-publish on their next heartbeat): a writer given
        one of their ranges could not reach it. Place on re-registered nodes while any is."""
        segs = super().placeable_segments()
        if not self.rejoin:
            return segs
        return [s for s in segs if s.client not in self.rejoin] or segs

    def touch(self, client: ClientId, host: str) -> bool:
        known = super().touch(client, host)
        return known and client not in self.rejoin

    def mount(
        self, client: ClientId, host: str, name: SegmentName, *args: Any, **kw: Any
    ) -> list[str]:
        with self.lock:
            rejected = super().mount(client, host, name, *args, **kw)
            self.rejoin.discard(client)
            self._mark("s", name)
            return rejected

    def mount_file_tier(self, *args: Any, **kw: Any) -> None:
        with self.lock:
            super().mount_file_tier(*args, **kw)
            self._mark("s", FILE_SEGMENT)

    def _adopt(self, seg: Segment, key: str, *args: Any) -> bool:
        self._mark("o", key)
        return super()._adopt(seg, key, *args)

    # Overrides pass their arguments through untouched (*args): only the first ones, which
    # name what changed, are read here.

    def _drop_segment(self, seg: Segment, *args: Any, **kw: Any) -> None:
        self._mark("s", seg.name)
        for obj in self.objects.values():
            if any(r.segment == seg.name for r in obj.replicas):
                self._mark("o", obj.key)
        super()._drop_segment(seg, *args, **kw)

    def _drop_object(self, obj: ObjectMeta, *args: Any, **kw: Any) -> None:
        if obj.status is Status.COMPLETE:  # a PROCESSING object was never logged
            self._mark("o", obj.key)
        super()._drop_object(obj, *args, **kw)

    def _replace(self, obj: ObjectMeta, *args: Any, **kw: Any) -> ObjectMeta | None:
        if obj.status is Status.COMPLETE:
            self._mark("o", obj.key)
        return super()._replace(obj, *args, **kw)

    def put_end(self, client: ClientId, key: str, *args: Any, **kw: Any) -> None:
        with self.lock:
            super().put_end(client, key, *args, **kw)
            self._mark("o", key)

    def _evict_one(self, obj: ObjectMeta, *args: Any, **kw: Any) -> int:
        self._mark("o", obj.key)
        return super()._evict_one(obj, *args, **kw)

    def _finish_copy(self, obj: ObjectMeta, *args: Any, **kw: Any) -> None:
        self._mark("o", obj.key)
        super()._finish_copy(obj, *args, **kw)

    def _drop_replica(self, obj: ObjectMeta, *args: Any, **kw: Any) -> None:
        self._mark("o", obj.key)
        super()._drop_replica(obj, *args, **kw)

    def task_done(self, client: ClientId, kind: str, key: str, *args: Any, **kw: Any) -> None:
        with self.lock:
            super().task_done(client, kind, key, *args, **kw)
            self._mark("o", key)
