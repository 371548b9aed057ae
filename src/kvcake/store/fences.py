"""Write fences on the master's side (the owner's side, which refuses stale writes, is
``transfer/fences.py``).

Every memory range the master hands to a writer -- a put's replicas, a copy's or a promotion's
target -- gets a fence, one per request (a batch put's ranges share one), and every later
allocation a higher one. The writer sends it with its writes; the range's owner learns of the
allocation from its next heartbeat reply (``take``) and from then on refuses writes into those
bytes that carry an older fence: a writer that was paused or cut off past the writer's grace
cannot overwrite the put its range was given to meanwhile (docs/store.md, "Write fences").

Why fences only grow, across restarts and leaders too: a master starts at
:func:`first_fence` of the floor its log remembers -- at least the wall clock in nanoseconds and
at least ``FENCE_GAP`` above the floor the last leader logged before it handed out any fence
(``store/ha``). A leader hands out fewer than ``FENCE_GAP`` (2**40) fences in a term, so the next
one starts above all of them, whatever its clock says; without a log the clock alone orders a
restarted master after the one before it.

A writer's lease complements the fences where no server stands between the writer and the
memory (a same-host copy through a mapping) and in the heartbeat interval before an owner has
noted a new allocation: a writer does not start a copy later than :func:`write_deadline`.

Bounds: at most ``MAX_NOTES`` unacknowledged notes per owner (an owner that does not heartbeat
for that long loses the oldest: they were handed out long ago), ``MAX_REPLY`` per reply.
Called with the state lock held.
"""

from __future__ import annotations

import time
from collections import deque

from kvcake.core.ids import ClientId

FENCE_GAP = 1 << 40
MAX_NOTES = 1 << 16
MAX_REPLY = 4096

Note = tuple[str, int, int, int]  # (segment, offset, size, fence)


# A writer stops starting copies this share of its lease early: its clock and the master's
# run at slightly different rates, and the lease is counted from the request's send.
LEASE_SHARE = 0.95


def write_deadline(sent: float, lease_ms: int) -> float:
    """The ``core.clocks.boottime`` after which a writer must not start a copy into the ranges a
    ``PutStart`` or ``ReplicaCopyStart`` sent at ``sent`` gave it. The master reuses such a
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

    def restart_at(self, base: int) -> None:
        """Start above ``base`` (a replayed log's :func:`first_fence`); before any fence."""
        self.base = self.last = max(self.last, base)

    def next(self) -> int:
        self.last += 1
        return self.last

    def note(self, owner: ClientId, note: Note) -> None:
        notes = self._notes.get(owner)
        if notes is None:
            notes = self._notes[owner] = deque(maxlen=MAX_NOTES)
        notes.append(note)

    def take(self, owner: ClientId, acked: int) -> list[Note]:
        """The notes for ``owner`` it has not acknowledged (``acked``: the highest fence it
        applied); acknowledged ones are dropped. In fence order."""
        notes = self._notes.get(owner)
        if not notes:
            return []
        while notes and notes[0][3] <= acked:
            notes.popleft()
        return [notes[i] for i in range(min(len(notes), MAX_REPLY))]

    def forget(self, owner: ClientId) -> None:
        self._notes.pop(owner, None)

    def pending(self) -> int:
        return sum(len(n) for n in self._notes.values())
