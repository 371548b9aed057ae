"""A :class:`MasterState` that notes what each request changed, so the change can be logged
before the request is acknowledged.

The state's parts report every mutation to their :class:`~kvcake.store.changes.Changes`; here
that is a :class:`Journal`, which marks the object key or segment name touched (and notes, per
calling thread, that it changed something). :class:`JournaledState` is a :class:`MasterState`
wired with a journal (it overrides none of its methods). :meth:`JournaledState.flush`, called after a
request, turns the dirty marks into records of the *current* state (see :mod:`.view`) under the
state lock, appends them to the log and returns the ticket the request must wait for: the end
of the log at that moment if this thread changed anything (its marks may have been logged by
another thread's flush; they are then in the same or an earlier group commit), else 0. Marks
made by housekeeping (eviction, client expiry) are flushed by the log's idle poll.

Replayed clients (segments known from the log; ``state.rejoin``) are told "unknown, remount" by
their heartbeat until they mount again: that makes them follow a moved Transfer Engine
directory and re-publish their segments in it (store/clients.py, store/segtable.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from kvcake.core.ids import ObjectKey, SegmentName
from kvcake.store.changes import Changes
from kvcake.store.config import MasterConfig
from kvcake.store.ha.oplog import OpLog
from kvcake.store.ha.view import ObjGone, ObjHeld, ObjRec, Record, SegGone, SegRec
from kvcake.store.master_state import MasterState
from kvcake.store.membership import OwnerDead
from kvcake.store.metadata import ObjectMeta, Segment, Status, Tier

MEMORY = Tier.MEMORY


# A PutStart's reply waits for its holds to be durable only from this many bytes (its batch
# in all): the copy after a smaller one ends long before a new leader could hand its ranges
# out (a take-over takes seconds), unless its writer pauses -- which the grace does not cover
# either. Waiting on every PutStart would add a log round trip to every HA put (issue 15).
HOLD_WAIT_BYTES = 16 << 20


class Journal(Changes):
    """The dirty marks (an ordered set of ("o"|"s", name)) and, per thread, whether that thread
    marked anything since its last flush. Called with the state lock held."""

    def __init__(self) -> None:
        self.dirty: dict[tuple[str, str], None] = {}
        self.local = threading.local()

    def object(self, key: str) -> None:
        self.dirty[("o", key)] = None
        self.local.changed = True

    def segment(self, name: str) -> None:
        self.dirty[("s", name)] = None
        self.local.changed = True

    def records(
        self,
        segments: Mapping[SegmentName, Segment],
        objects: Mapping[ObjectKey, ObjectMeta],
        held: Mapping[SegmentName, Mapping[int, int]],
    ) -> list[Record]:
        """Drain the marks into records of the current state (segments first)."""
        marks = list(self.dirty)
        self.dirty.clear()
        marks.sort(key=lambda m: m[0] != "s")
        out: list[Record] = []
        for kind, name in marks:
            if kind == "s":
                seg = SegmentName(name)
                out.append(seg_record(name, segments.get(seg), held.get(seg, {})))
            else:
                out.append(obj_record(name, objects.get(ObjectKey(name))))
        return out

    def writing(self, key: str, size: int) -> None:
        self.dirty[("o", key)] = None
        self.local.writing = getattr(self.local, "writing", 0) + size

    def take_changed(self) -> bool:
        """Whether the calling thread marked anything its reply must wait for since it last
        asked (and reset): a change, or puts of ``HOLD_WAIT_BYTES`` or more in all."""
        local = self.local
        writing, changed = getattr(local, "writing", 0), getattr(local, "changed", False)
        local.writing, local.changed = 0, False
        return changed or writing >= HOLD_WAIT_BYTES


def seg_record(name: str, seg: Segment | None, held: Mapping[int, int]) -> Record:
    if seg is None:
        return SegGone(name)
    cap = seg.allocator.capacity
    return SegRec(
        seg.name, seg.client, seg.host, seg.tier.value, cap, seg.endpoint, seg.host_id,
        sorted(held.items()),
    )  # fmt: skip


def obj_record(key: str, obj: ObjectMeta | None) -> Record:
    if obj is None:
        return ObjGone(key)
    if obj.status is not Status.COMPLETE:
        ranges = [(str(r.segment), r.offset, r.size) for r in obj.replicas if r.tier is MEMORY]
        return ObjHeld(key, ranges) if ranges else ObjGone(key)
    reps: list[tuple[str, int, str]] = [
        (r.segment, r.offset, r.tier.value) for r in obj.replicas if r.complete
    ]
    if not reps:
        return ObjGone(key)
    held = [(str(r.segment), r.offset) for r in obj.replicas if not r.complete and r.tier is MEMORY]
    return ObjRec(key, obj.size, obj.hard_pin, reps, obj.tenant, obj.sums, held)


class JournaledState(MasterState):
    """A :class:`MasterState` whose parts report to a :class:`Journal`."""

    def __init__(
        self,
        config: MasterConfig,
        clock: Callable[[], float] = time.monotonic,
        owner_dead: OwnerDead = lambda c, s: False,
    ):
        self.journal = Journal()
        super().__init__(config, clock, owner_dead, self.journal)

    def records(self) -> list[Record]:
        """Drain the dirty marks into records (segments first); caller holds the lock."""
        return self.journal.records(self.segments, self.objects, self.parts.segs.held)

    def flush(self, log: OpLog) -> int:
        """Log what changed; return the ticket covering everything this thread touched."""
        with self.lock:
            recs = self.records()
            if recs:
                log.append(recs)
            return log.appended if self.journal.take_changed() else 0
