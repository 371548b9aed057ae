"""Write fences: which allocation each range of this process's segments was last handed to.

The store's master gives every memory range it allocates a *fence*, a number that only grows
(across leaders too: store/fences.py), and tells the range's owner, by its heartbeat and mount
replies, each segment's *floor* (``floor``: writes with an older fence come from an earlier
master or mount of the segment) and the allocations that reused a range a stale writer may
still write into (``note``). A writer sends its allocation's fence with each write; the transfer
server refuses (``StaleWrite``) one below its segment's floor or into bytes that a noted range
with a *newer* fence covers: a writer that was paused or cut off past its writer's grace, whose
range the master gave to another put meanwhile, cannot overwrite that put. A write with fence
0 is not fenced (other users of the engine).

Invariants: ranges noted for one segment never overlap (a newer note drops the ranges it
overlaps; the master never hands out overlapping live ranges); ``newest`` is the highest fence
noted or floor, so a write whose fence is at least that passes without a lookup (the usual
case: notes are rare and arrive after the writes they cover). Bounded: at most
``max_ranges`` per segment; beyond, the oldest half is forgotten (a range's protection then
lapses; the notes arrive seconds after the allocation, so the dropped ones are long written).
Thread-safe (one lock; heartbeat thread notes, server threads check).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable

from kvcake.transfer.errors import StaleWrite

MAX_RANGES = 1 << 20


class _Ranges:
    """One segment's noted ranges: sorted starts, start -> (end, fence)."""

    __slots__ = ("spans", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.spans: dict[int, tuple[int, int]] = {}

    def overlapping(self, lo: int, hi: int) -> list[int]:
        """Starts of the ranges that overlap ``[lo, hi)``."""
        i = bisect.bisect_right(self.starts, lo) - 1
        if i >= 0 and self.spans[self.starts[i]][0] <= lo:
            i += 1
        i = max(i, 0)
        out = []
        while i < len(self.starts) and self.starts[i] < hi:
            out.append(self.starts[i])
            i += 1
        return out

    def put(self, lo: int, hi: int, fence: int) -> None:
        over = self.overlapping(lo, hi)
        if any(self.spans[s][1] > fence for s in over):
            return  # a late repeat of an older note: the newer range stands
        for start in over:
            self.starts.remove(start)  # (a note overlaps one or two old ranges: O(n) is fine)
            del self.spans[start]
        bisect.insort(self.starts, lo)
        self.spans[lo] = (hi, fence)

    def newest_over(self, lo: int, hi: int) -> int:
        return max((self.spans[s][1] for s in self.overlapping(lo, hi)), default=0)

    def forget_oldest(self) -> None:
        by_age = sorted(self.starts, key=lambda s: self.spans[s][1])
        for start in by_age[: len(by_age) // 2]:
            del self.spans[start]
        self.starts = sorted(self.spans)


class FenceBook:
    def __init__(self, max_ranges: int = MAX_RANGES) -> None:
        self._lock = threading.Lock()
        self._segs: dict[str, _Ranges] = {}
        self._floors: dict[str, int] = {}
        self.max_ranges = max_ranges
        self.newest = 0  # the highest fence noted (what a heartbeat acknowledges)
        self.refused = 0

    def note(self, notes: Iterable[tuple[str, int, int, int]]) -> None:
        """``(segment, offset, size, fence)`` of ranges the master allocated."""
        with self._lock:
            for segment, offset, size, fence in notes:
                if size <= 0 or offset < 0 or fence <= 0:
                    continue
                ranges = self._segs.setdefault(segment, _Ranges())
                ranges.put(offset, offset + size, fence)
                if len(ranges.starts) > self.max_ranges:
                    ranges.forget_oldest()
                self.newest = max(self.newest, fence)

    def floor(self, floors: Iterable[tuple[str, int]]) -> None:
        """``(segment, fence)``: writes with an older fence are stale (never lowered)."""
        with self._lock:
            for segment, fence in floors:
                if fence > self._floors.get(segment, 0):
                    self._floors[segment] = fence
                    self.newest = max(self.newest, fence)

    def check(self, segment: str, offset: int, length: int, fence: int) -> None:
        """Raise :class:`StaleWrite` when the write's fence is below its segment's floor or a
        newer allocation covers any byte of it."""
        if fence <= 0 or fence >= self.newest:
            return
        with self._lock:
            floor = self._floors.get(segment, 0)
            if fence < floor:
                self.refused += 1
                raise StaleWrite(
                    f"write into {segment!r} with fence {fence}: allocated before the segment's "
                    f"current master or mount (floor {floor}); its put is gone"
                )
            ranges = self._segs.get(segment)
            newer = ranges.newest_over(offset, offset + length) if ranges is not None else 0
            if newer <= fence:
                return
            self.refused += 1
        raise StaleWrite(
            f"write of [{offset}, {offset + length}) in {segment!r} with fence {fence}: "
            f"the master has since given those bytes to a newer allocation (fence {newer})"
        )

    def forget(self, segment: str) -> None:
        """A segment unregistered here: its ranges mean nothing any more."""
        with self._lock:
            self._segs.pop(segment, None)
            self._floors.pop(segment, None)

    def ranges(self, segment: str) -> int:
        with self._lock:
            ranges = self._segs.get(segment)
            return len(ranges.starts) if ranges is not None else 0
