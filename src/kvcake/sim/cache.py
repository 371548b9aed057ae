"""A prefill node's local DRAM KV cache: LRU over whole blocks, published to the KV index.

Invariants: ``len(self) <= capacity_blocks``; every block held here is registered in ``index``
under ``holder`` and removed from it on eviction (the index is the conductor's view, the cache
is the ground truth). Blocks touched by the request being computed are the most recently used,
so one request never evicts its own prefix (capacity permitting).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Protocol, cast

from kvcake.core.ids import BlockHash, InstanceId


class IndexSink(Protocol):
    """Where a cache publishes its blocks: the conductor's index (or a lagged front of it)."""

    def add(self, holder: InstanceId, blocks: Iterable[BlockHash]) -> None: ...

    def remove(self, holder: InstanceId, blocks: Iterable[BlockHash]) -> None: ...


class LRUBlockCache:
    __slots__ = ("_blocks", "capacity_blocks", "evictions", "holder", "index", "inserted")

    def __init__(self, capacity_blocks: int, holder: InstanceId, index: IndexSink | None) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        self.capacity_blocks = capacity_blocks
        self.holder = holder
        self.index = index
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0
        self.inserted = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def prefix_len(self, blocks: Sequence[int]) -> int:
        """Leading blocks of ``blocks`` held here."""
        n = 0
        for b in blocks:
            if b not in self._blocks:
                break
            n += 1
        return n

    def touch(self, blocks: Sequence[int]) -> None:
        """Mark held blocks most recently used, head newest (see :meth:`insert`)."""
        mte = self._blocks.move_to_end
        for b in reversed(blocks):
            if b in self._blocks:
                mte(b)

    def insert(self, blocks: Sequence[int]) -> None:
        """Add (or refresh) ``blocks`` — one request's prefix — and evict least recently used
        blocks beyond capacity. Within the request the *head* ends up most recent, so at equal
        recency the deepest block goes first (evicting a head block would orphan its whole
        chain; vLLM's prefix cache breaks ties the same way)."""
        if self.capacity_blocks == 0:
            return
        d = self._blocks
        mte = d.move_to_end
        new: list[int] = []
        for b in reversed(blocks):
            if b in d:
                mte(b)
            else:
                d[b] = None
                new.append(b)
        self.inserted += len(new)
        evicted: list[int] = []
        over = len(d) - self.capacity_blocks
        if over > 0:
            pop = d.popitem
            evicted = [pop(last=False)[0] for _ in range(over)]
            self.evictions += over
        if self.index is not None:
            # BlockHash is a NewType over int: the ints are the hashes
            if new:
                self.index.add(self.holder, cast(list[BlockHash], new))
            if evicted:
                self.index.remove(self.holder, cast(list[BlockHash], evicted))
