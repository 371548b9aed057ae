"""The master's segments and what is queued for their nodes (part of
:class:`~kvcake.store.master_state.MasterState`).

Invariants: called with the state lock held. Owns ``segments`` (each with the allocator of its
ranges: the memory of a replica belongs to its segment's allocator), ``tasks`` (node tasks per
client, drained by the node's heartbeat), ``discarded`` (ranges a pre-empted writer or a
leased reader may still touch: released only once their time has come) and ``held`` (those of
them a writer may still write into, per segment: offset -> size; logged with the segment so a
new leader keeps them out of use too, store/ha/view.py).
"""

from __future__ import annotations

from collections.abc import Callable

from kvcake.core.ids import ClientId, SegmentName
from kvcake.store.changes import Changes
from kvcake.store.fences import Fences
from kvcake.store.filetier import file_path
from kvcake.store.metadata import NodeTask, Replica, Segment, Tier
from kvcake.store.protocol import ReplicaDesc

MEMORY, DISK, FILE = Tier.MEMORY, Tier.DISK, Tier.FILE


class SegmentTable:
    def __init__(self, changes: Changes | None = None) -> None:
        self.segments: dict[SegmentName, Segment] = {}
        self.tasks: dict[ClientId, list[NodeTask]] = {}
        self.discarded: list[tuple[float, SegmentName, int]] = []  # (free at, segment, offset)
        self.held: dict[SegmentName, dict[int, int]] = {}  # in the writer's grace: offset -> size
        self.changes = changes if changes is not None else Changes()
        self.fences = Fences()
        self._memory: list[Segment] | None = None

    def add(self, seg: Segment) -> None:
        if seg.name not in self.segments:  # (a new mount, or replayed: no writer of ours yet)
            seg.fence_floor = self.fences.next()
        self.segments[seg.name] = seg
        self._memory = None

    def remove(self, seg: Segment) -> None:
        """Forget ``seg`` and the ranges of it waiting to be released."""
        del self.segments[seg.name]
        self._memory = None
        self.discarded[:] = [d for d in self.discarded if d[1] != seg.name]
        self.held.pop(seg.name, None)
        self.fences.forget_segment(seg.name)
        if not any(s.client == seg.client for s in self.segments.values()):
            self.fences.forget(seg.client)

    def fence(self, reps: list[Replica], fence: int = 0) -> None:
        """Give the memory ranges of ``reps`` the request's ``fence`` (0: a new one); a range
        that overlaps one a stale writer may still write into is noted for its owner
        (store/fences.py)."""
        fence = fence or self.fences.next()
        for rep in reps:
            seg = self.segments.get(rep.segment)
            if rep.tier is MEMORY and seg is not None:
                rep.fence = fence
                if self.fences.untaint(rep.segment, rep.offset, rep.size):
                    self.fences.note(seg.client, (rep.segment, rep.offset, rep.size, fence))

    def floors(self, client: ClientId) -> list[tuple[str, int]]:
        """The fence floor of each of ``client``'s segments (store/fences.py)."""
        return [(s.name, s.fence_floor) for s in self.segments.values() if s.client == client]

    def memory(self) -> list[Segment]:
        """Memory-tier segments (cached: rebuilt only when a segment is mounted/unmounted)."""
        if self._memory is None:
            self._memory = [s for s in self.segments.values() if s.tier is MEMORY]
        return self._memory

    def placeable(self, rejoin: set[ClientId]) -> list[Segment]:
        """Memory segments a new replica may go to. Right after a take-over the replayed
        storage nodes (``rejoin``) are not yet in this leader's Transfer Engine directory (they
        re-publish on their next heartbeat): a writer given one of their ranges could not reach
        it. Place on re-registered nodes while any is."""
        segs = self.memory()
        if not rejoin:
            return segs
        return [s for s in segs if s.client not in rejoin] or segs

    def check(self) -> None:
        """Assert every allocator's invariants (allocated + free == capacity)."""
        for seg in self.segments.values():
            seg.allocator.check()

    def disk_of(self, client: ClientId) -> Segment | None:
        segs = [s for s in self.segments.values() if s.client == client and s.tier is DISK]
        return segs[0] if segs else None

    def queue_task(self, segment: SegmentName, task: NodeTask) -> None:
        """Queue ``task`` for the node owning ``segment`` (if it is still mounted)."""
        seg = self.segments.get(segment)
        if seg is not None:
            self.tasks.setdefault(seg.client, []).append(task)

    def queue(self, client: ClientId, task: NodeTask) -> None:
        self.tasks.setdefault(client, []).append(task)

    def take_tasks(self, client: ClientId) -> list[NodeTask]:
        return self.tasks.pop(client, [])

    def describe(self, rep: Replica) -> ReplicaDesc:
        seg = self.segments[rep.segment]
        where = seg.endpoint if rep.tier is not FILE else file_path(seg.endpoint, rep.offset)
        return ReplicaDesc(
            rep.segment, seg.host, rep.offset, rep.size, rep.tier._value_, where, rep.fence
        )

    def release(self, rep: Replica) -> None:
        """Give the range of a memory or disk replica back to its segment (if still mounted)."""
        seg = self.segments.get(rep.segment)
        if seg is not None:
            seg.allocator.release(rep.offset)

    def discard(self, free_at: float, segment: SegmentName, offset: int, held: int = 0) -> None:
        """Release the range at ``offset`` of ``segment`` once ``free_at`` has passed; ``held``:
        its size, when a writer may still write into it (the hold is logged)."""
        self.discarded.append((free_at, segment, offset))
        if held:
            self.held.setdefault(segment, {})[offset] = held
            self.changes.segment(segment)

    def reclaim(self, now: float, force: bool, file_unlink: Callable[[int], None]) -> None:
        """Release the discarded ranges whose time has come (all with ``force``); a file-tier
        range goes to ``file_unlink`` instead (its file, if written, goes before its range)."""
        keep = []
        for free_at, seg_name, off in self.discarded:
            seg = self.segments.get(seg_name)
            if seg is not None and (force or free_at <= now):
                if seg.tier is FILE:
                    file_unlink(off)
                else:
                    seg.allocator.release(off)
                    size = self._unhold(seg_name, off)
                    if size:  # a writer may still write into it: its next user is noted
                        self.fences.taint(seg_name, off, size)
            elif seg is not None:
                keep.append((free_at, seg_name, off))
        self.discarded[:] = keep

    def _unhold(self, segment: SegmentName, offset: int) -> int:
        """Forget the hold at ``offset``; its size (0: none)."""
        held = self.held.get(segment)
        size = held.pop(offset, 0) if held is not None else 0
        if size:
            self.changes.segment(segment)
            if not held:
                del self.held[segment]
        return size
