"""Write fences on the master's side (the owner's side, which refuses stale writes, is
``transfer/fences.py``; docs/store.md, "Write fences").

Every memory range the master hands to a writer -- a put's replicas, a copy's or a promotion's
target -- gets a fence, one per request (a batch put's ranges share one), and every later
allocation a higher one. The writer sends it with its writes. A range's owner refuses a write
whose fence is older than what it has been told, in two ways:

- **Floors.** Every segment has the fence its master took when it first knew it (mounted, or
  replayed by a new leader): no writer of an earlier master or an earlier mount of that
  segment can still be legitimate (their puts and copies are gone with them), so the owner
  refuses every write with an older fence. The heartbeat and mount replies carry the floors.
- **Notes of tainted reuse.** Within one master's term the only stale writers are those whose
  put or copy was revoked, pre-empted or expired: their ranges wait out the writer's grace
  (segtable.py), then are *tainted* here. An allocation that overlaps a tainted range is noted
  for the owner (heartbeat reply; acknowledged by the next heartbeat), which then refuses older
  fences over those bytes. Other allocations need no note: no stale writer can reach them.

Why fences only grow, across restarts and leaders: a master starts at :func:`first_fence` of
the floor its log remembers -- at least the wall clock in nanoseconds and at least
``FENCE_GAP`` above the floor the last leader logged before it handed out any fence
(``store/ha``). A leader hands out fewer than ``FENCE_GAP`` (2**40) fences in a term, so the next
one starts above all of them, whatever its clock says; without a log the clock alone orders a
restarted master after the one before it.

A writer's lease complements the fences where no server stands between the writer and the
memory (a same-host copy through a mapping) and in the heartbeat interval before an owner has
heard of a reuse: a writer does not start a copy later than :func:`write_deadline`.

Bounds: ``MAX_TAINTS`` per segment (beyond, the oldest taint is dropped: that reuse goes
unnoted), ``MAX_NOTES`` unacknowledged notes per owner, ``MAX_REPLY`` per reply. Called with the
state lock held.
"""

from __future__ import annotations

import bisect
import time
from collections import deque

from kvcake.core.ids import ClientId

FENCE_GAP = 1 << 40
MAX_TAINTS = 4096
MAX_NOTES = 1 << 16
MAX_REPLY = 4096
# A writer stops starting copies this share of its lease early: its clock and the master's
# run at slightly different rates, and the lease is counted from the request's send.
LEASE_SHARE = 0.95

Note = tuple[str, int, int, int]  # (segment, offset, size, fence)


def write_deadline(sent: float, lease_ms: int) -> float:
    """The ``core.clocks.boottime`` after which a writer must not start a copy into the ranges
    a ``PutStart`` or ``ReplicaCopyStart`` sent at ``sent`` gave it. The master reuses such a
    range no sooner than ``lease_ms`` (its writer's grace) after it allocated it, hence after
    ``sent``; 0: the master sets no lease (older masters)."""
    return sent + lease_ms / 1000 * LEASE_SHARE if lease_ms > 0 else float("inf")


def first_fence(floor: int) -> int:
    """Where a master's fences start, given the highest floor its log remembers (0: none)."""
    return max(time.time_ns(), floor + FENCE_GAP)


class Fences:
    def __init__(self, base: int | None = None) -> None:
        self.base = first_fence(0) if base is None else base
        self.last = self.base
        self._notes: dict[ClientId, deque[Note]] = {}
        self._taints: dict[str, deque[tuple[int, int]]] = {}  # segment -> (start, end)

    def restart_at(self, base: int) -> None:
        """Start above ``base`` (a replayed log's :func:`first_fence`); before any fence."""
        self.base = self.last = max(self.last, base)

    def next(self) -> int:
        self.last += 1
        return self.last

    def taint(self, segment: str, offset: int, size: int) -> None:
        """A range a stale writer may still write into was freed."""
        taints = self._taints.get(segment)
        if taints is None:
            taints = self._taints[segment] = deque(maxlen=MAX_TAINTS)
        taints.append((offset, offset + size))

    def untaint(self, segment: str, offset: int, size: int) -> bool:
        """Whether ``[offset, offset + size)`` overlaps a tainted range (those it overlaps are
        untainted: the allocation's note covers their bytes from now on, and the part of a
        larger taint outside it stays tainted)."""
        taints = self._taints.get(segment)
        if not taints:
            return False
        end = offset + size
        hit = False
        keep: list[tuple[int, int]] = []
        for lo, hi in taints:
            if lo < end and offset < hi:
                hit = True
                keep += [(a, b) for a, b in ((lo, offset), (end, hi)) if a < b]
            else:
                keep.append((lo, hi))
        if hit:
            taints.clear()
            taints.extend(keep)
        return hit

    def note(self, owner: ClientId, note: Note) -> None:
        """Queue ``note`` in fence order: an owner acknowledges the highest fence it applied,
        which must not drop a lower one it was not sent yet (two requests' fences are taken
        in one order and their allocations may be noted in the other)."""
        notes = self._notes.get(owner)
        if notes is None:
            notes = self._notes[owner] = deque(maxlen=MAX_NOTES)
        if len(notes) == MAX_NOTES:
            notes.popleft()  # the oldest goes unnoted (module docstring: bounds)
        notes.insert(bisect.bisect_right(notes, note[3], key=lambda n: n[3]), note)

    def take(self, owner: ClientId, acked: int) -> list[Note]:
        """The notes for ``owner`` it has not acknowledged (``acked``: the highest fence it
        noted); acknowledged ones are dropped. In fence order."""
        notes = self._notes.get(owner)
        if not notes:
            return []
        while notes and notes[0][3] <= acked:
            notes.popleft()
        return [notes[i] for i in range(min(len(notes), MAX_REPLY))]

    def forget(self, owner: ClientId) -> None:
        self._notes.pop(owner, None)

    def forget_segment(self, segment: str) -> None:
        self._taints.pop(segment, None)

    def pending(self) -> int:
        return sum(len(n) for n in self._notes.values())

    def tainted(self, segment: str) -> list[tuple[int, int]]:
        return list(self._taints.get(segment, ()))
