"""Rebuild a master's state from the durable view (a new leader, a restart with --state-dir).

Every recorded segment is re-created with its allocator holding exactly the ranges of the
recorded replicas; every recorded COMPLETE object comes back with those replicas (leases, soft
pins and LRU history reset). The owners of recorded segments get a client entry (so they are
expired after ``client_ttl_s`` if they never come back) and are asked to remount on their next
heartbeat. A replica on a segment the view does not know, or one overlapping another replica
(a log that lies), costs its object: the object is dropped, never served from a wrong range.

Every recorded *hold* (store/ha/view.py: a range a writer of the old leader may still be
writing into) is allocated too and released only after the writer's grace, counted from now:
a put still copying when its leader died cannot land in another object's range. A hold the
view cannot place (unknown segment, overlapping a replica) is skipped with a warning.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable
from typing import Any

from kvcake.core import integrity
from kvcake.core.ids import ClientId, ObjectKey, SegmentName
from kvcake.store.allocator import RangeAllocator, aligned
from kvcake.store.config import MasterConfig
from kvcake.store.fences import first_fence
from kvcake.store.ha.journal import JournaledState
from kvcake.store.ha.view import ObjHeld, ObjRec, View
from kvcake.store.metadata import ClientInfo, ObjectMeta, Replica, Segment, Status, Tier

log = logging.getLogger(__name__)


def restore_allocator(capacity: int, ranges: Iterable[tuple[int, int]]) -> RangeAllocator:
    """An allocator whose live ranges are exactly ``ranges`` ((offset, size), disjoint,
    64-aligned offsets), built with the public API: on a first-fit allocator whose only free
    range starts at the cursor, allocating the gap and then the range lands them in place."""
    alloc = RangeAllocator(capacity)
    gaps = []
    cursor = 0
    for offset, size in sorted(ranges):
        if offset > cursor:
            got = alloc.allocate(offset - cursor)
            assert got == cursor, (got, cursor)
            gaps.append(got)
        got = alloc.allocate(size)
        assert got == offset, (got, offset)
        cursor = offset + aligned(size)
    for gap in gaps:
        alloc.release(gap)
    return alloc


def _records(view: View) -> list[ObjRec]:
    return [o for o in view.objects.values() if isinstance(o, ObjRec)]


def _holds(view: View) -> list[tuple[str, int, int]]:
    """Every recorded hold: (segment, offset, size)."""
    out: list[tuple[str, int, int]] = []
    for rec in view.objects.values():
        if isinstance(rec, ObjHeld):
            out += rec.ranges
        else:
            out += [(seg, off, rec.size) for seg, off in rec.held]
    for seg in view.segments.values():
        out += [(seg.name, off, size) for off, size in seg.held]
    return out


def _placed_holds(view: View, live: dict[str, list[tuple[int, int]]]) -> list[tuple[str, int, int]]:
    """The holds that fit their segment and overlap no kept replica nor another hold (each
    checked against its neighbours in the segment's sorted ranges: a take-over replays every
    object, so no scan of all of them per hold)."""
    taken = {name: sorted(ranges) for name, ranges in live.items()}
    holds = sorted(set(_holds(view)))
    kept: list[tuple[str, int, int]] = []
    for seg_name, off, size in holds:
        seg = view.segments.get(seg_name)
        if seg is None or off % 64 or size <= 0 or off + aligned(size) > seg.capacity:
            continue
        ranges, end = taken[seg_name], off + aligned(size)
        i = bisect.bisect_left(ranges, (off, 0))
        if (i and sum(ranges[i - 1]) > off) or (i < len(ranges) and ranges[i][0] < end):
            continue
        ranges.insert(i, (off, aligned(size)))
        kept.append((seg_name, off, size))
    if len(kept) < len(holds):
        log.warning(
            "replay: %d writer holds skipped (outside or overlapping)", len(holds) - len(kept)
        )
    return kept


def _valid(view: View) -> tuple[list[ObjRec], dict[str, list[tuple[int, int]]]]:
    """Objects whose replicas all fit their segments without overlaps, and per segment the
    ranges they hold."""
    records = _records(view)
    # Logged before objects carried checksums (or put without them): no reader could verify
    # them, so they are discarded -- a cache misses them, it never serves them unverified.
    bad = {o.key for o in records if not integrity.well_formed(o.size, o.sums)}
    if bad:
        log.warning("replay: %d objects without valid checksums discarded", len(bad))
    unsummed = len(bad)
    per_seg: dict[str, list[tuple[int, int, str]]] = {name: [] for name in view.segments}
    for obj in records:
        for seg_name, offset, _tier in obj.replicas:
            seg = view.segments.get(seg_name)
            if seg is None or offset % 64 or offset + aligned(obj.size) > seg.capacity:
                bad.add(obj.key)
            else:
                per_seg[seg_name].append((offset, aligned(obj.size), obj.key))
    for ranges in per_seg.values():
        ranges.sort()
        end = 0
        for offset, size, key in ranges:
            if key in bad:
                continue
            if offset < end:
                bad.add(key)
                continue
            end = offset + size
    if len(bad) > unsummed:
        log.warning(
            "replay: %d objects dropped (replicas outside or overlapping)", len(bad) - unsummed
        )
    good = [o for o in records if o.key not in bad]
    live = {n: [(o, s) for o, s, k in r if k not in bad] for n, r in per_seg.items()}
    return good, live


def build_state(
    config: MasterConfig, view: View, clock: Callable[[], float] | None = None, **kw: Any
) -> JournaledState:
    """``kw`` goes to :class:`MasterState` (the hooks a :class:`Master` wires in)."""
    state = (
        JournaledState(config, clock, **kw) if clock is not None else JournaledState(config, **kw)
    )
    state.parts.segs.fences.restart_at(first_fence(view.fence))
    now = state.clock()
    objects, live = _valid(view)
    holds = _placed_holds(view, live)
    for seg_name, off, size in holds:
        live[seg_name].append((off, aligned(size)))
    for rec in view.segments.values():
        cid = ClientId(rec.client)
        alloc = restore_allocator(rec.capacity, live[rec.name])
        seg = Segment(
            SegmentName(rec.name), cid, rec.host, Tier(rec.tier), alloc, rec.endpoint, rec.host_id
        )
        state.parts.segs.add(seg)
        if seg.tier is Tier.FILE:  # the master's own (store/filetier.py): no client to expire
            continue
        info = state.clients.setdefault(cid, ClientInfo(cid, rec.host, now))
        info.segments.add(seg.name)
        state.rejoin.add(cid)
    for obj in objects:
        reps = [
            Replica(SegmentName(s), off, obj.size, Tier(t), complete=True)
            for s, off, t in obj.replicas
        ]
        key = ObjectKey(obj.key)
        meta = ObjectMeta(key, obj.size, Status.COMPLETE, ClientId(""), now, reps)
        meta.hard_pin = obj.hard_pin
        meta.tenant = obj.tenant  # its quota charge survives the failover
        meta.sums = list(obj.sums)
        state.tenants.charge(obj.tenant, obj.size)
        state.objects[key] = meta
    _keep_holds(state, view, holds, now + config.writer_grace_s)
    state.check()
    return state


def _keep_holds(
    state: JournaledState, view: View, holds: list[tuple[str, int, int]], until: float
) -> None:
    """The holds wait out the writer's grace as this state's own (logged with their segment);
    the records that carried them are logged again without them (a held put is gone here)."""
    for seg_name, off, size in holds:
        state.parts.segs.discard(until, SegmentName(seg_name), off, size)
    for rec in view.objects.values():
        if isinstance(rec, ObjHeld) or rec.held:
            state.journal.writing(rec.key, 0)  # marks it: its current record is logged
