"""A first-fit range allocator over one segment with coalescing free list.

Invariant (checked by :meth:`check`): the free ranges are sorted, disjoint, non-adjacent, and
``allocated + free == capacity``. The allocator only does bookkeeping; the memory it describes
belongs to the process that mounted the segment.
"""

from __future__ import annotations

import bisect

ALIGN = 64  # cache-line aligned offsets: memcpy into a replica never straddles a line needlessly


def aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


class RangeAllocator:
    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {capacity}")
        self.capacity = capacity
        self._starts: list[int] = [0]  # free range starts, sorted
        self._sizes: dict[int, int] = {0: capacity}
        self._live: dict[int, int] = {}  # offset -> aligned size of allocated ranges
        self.allocated = 0

    @property
    def free(self) -> int:
        return self.capacity - self.allocated

    def largest_free(self) -> int:
        return max(self._sizes.values(), default=0)

    def fragmentation(self) -> float:
        """1 - largest free range / total free: 0 when the free space is one range."""
        free = self.free
        return 0.0 if free == 0 else 1.0 - self.largest_free() / free

    def allocate(self, size: int) -> int | None:
        """Offset of a new range of ``size`` bytes, or ``None`` when no free range is big enough."""
        if size <= 0:
            raise ValueError(f"size must be > 0, got {size}")
        need = aligned(size)
        for i, start in enumerate(self._starts):
            have = self._sizes[start]
            if have < need:
                continue
            del self._sizes[start]
            if have == need:
                self._starts.pop(i)
            else:
                self._starts[i] = start + need
                self._sizes[start + need] = have - need
            self._live[start] = need
            self.allocated += need
            return start
        return None

    def release(self, offset: int) -> None:
        """Free the range that :meth:`allocate` returned at ``offset`` (coalescing neighbours)."""
        size = self._live.pop(offset, None)
        if size is None:
            raise ValueError(f"offset {offset} is not allocated")
        self.allocated -= size
        i = bisect.bisect_left(self._starts, offset)
        start, end = offset, offset + size
        if i < len(self._starts) and self._starts[i] == end:  # merge with the next range
            end += self._sizes.pop(self._starts.pop(i))
        if i > 0 and self._starts[i - 1] + self._sizes[self._starts[i - 1]] == start:
            start = self._starts[i - 1]  # merge into the previous range
            self._sizes[start] = end - start
        else:
            self._starts.insert(i, start)
            self._sizes[start] = end - start

    def check(self) -> None:
        """Assert the invariants (used by tests and the master's debug checks)."""
        free = sum(self._sizes.values())
        assert free + self.allocated == self.capacity, (free, self.allocated, self.capacity)
        assert sorted(self._starts) == self._starts and set(self._starts) == set(self._sizes)
        for a, b in zip(self._starts, self._starts[1:], strict=False):
            assert a + self._sizes[a] < b, "free ranges overlap or touch"
        assert sum(self._live.values()) == self.allocated
