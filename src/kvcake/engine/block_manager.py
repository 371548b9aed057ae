"""Block accounting and the local prefix cache.

Every block is in exactly one of three states:

* **used**   — ``refcount > 0``: owned by one or more requests; never evicted or reused.
* **cached** — ``refcount == 0`` but it holds the KV of a named (hashed) full block; it can be
  found by :meth:`BlockManager.lookup_prefix` and is evicted in LRU order when space is needed.
* **free**   — ``refcount == 0`` and unnamed; handed out first.

Invariant (checked by :meth:`check`): ``used + cached + free == capacity``. A block gets a name by
:meth:`register` once its KV is complete (computed locally, or written from outside, e.g. by a
Transfer Engine read from the pool). Names are unique: a hash maps to at most one block.
Registrations and evictions are recorded as :class:`~kvcake.core.api.KVEvent` s.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvcake.core.api import KVEvent, KVEventKind
from kvcake.core.errors import EngineError
from kvcake.core.ids import BlockHash, InstanceId


class KVCacheFull(EngineError):
    """Not enough free or evictable blocks for an allocation."""


class BlockManager:
    def __init__(
        self, capacity: int, instance_id: InstanceId = InstanceId("local"), max_events: int = 4096
    ) -> None:
        if capacity <= 0:
            raise EngineError("block capacity must be positive")
        self.capacity = capacity
        self.instance_id = instance_id
        self._ref = [0] * capacity
        self._free: list[int] = list(range(capacity - 1, -1, -1))  # pop() gives 0 first
        self._cached: OrderedDict[int, None] = OrderedDict()  # LRU: oldest first
        self._hash_of: dict[int, BlockHash] = {}
        self._block_of: dict[BlockHash, int] = {}
        self._events: list[KVEvent] = []
        self._seq = 0
        self._max_events = max_events

    # --- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks an allocation can get now (free + evictable cached)."""
        return len(self._free) + len(self._cached)

    @property
    def num_used(self) -> int:
        return self.capacity - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def refcount(self, block_id: int) -> int:
        return self._ref[block_id]

    def hash_of(self, block_id: int) -> BlockHash | None:
        return self._hash_of.get(block_id)

    def cached_prefix_len(self, hashes: Sequence[BlockHash]) -> int:
        """Leading blocks of ``hashes`` held here (no reference taken)."""
        n = 0
        for h in hashes:
            if h not in self._block_of:
                break
            n += 1
        return n

    # --- allocation ------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """``n`` blocks with refcount 1, unnamed. Evicts LRU cached blocks if needed."""
        if n < 0:
            raise EngineError("cannot allocate a negative number of blocks")
        if n > self.num_free:
            raise KVCacheFull(f"need {n} KV blocks, only {self.num_free} free")
        out: list[int] = []
        evicted: list[BlockHash] = []
        for _ in range(n):
            if self._free:
                b = self._free.pop()
            else:
                b, _ = self._cached.popitem(last=False)
                h = self._hash_of.pop(b)
                del self._block_of[h]
                evicted.append(h)
            self._ref[b] = 1
            out.append(b)
        if evicted:
            self._emit(KVEventKind.REMOVED, evicted)
        return out

    def acquire(self, block_ids: Sequence[int]) -> None:
        """Take one more reference on each (used or cached) block."""
        for b in block_ids:
            self._check_id(b)
            if self._ref[b] == 0:
                if b not in self._cached:
                    raise EngineError(f"block {b} is free; allocate it instead")
                del self._cached[b]
            self._ref[b] += 1

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block; named blocks stay cached, others become free."""
        for b in block_ids:
            self._check_id(b)
            if self._ref[b] <= 0:
                raise EngineError(f"block {b} freed more often than allocated")
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if b in self._hash_of:
                    self._cached[b] = None
                else:
                    self._free.append(b)

    def lookup_prefix(self, hashes: Sequence[BlockHash]) -> list[int]:
        """Blocks holding the longest cached prefix of ``hashes``, each with a reference taken
        for the caller (release with :meth:`free`)."""
        blocks: list[int] = []
        for h in hashes:
            b = self._block_of.get(h)
            if b is None:
                break
            blocks.append(b)
        self.acquire(blocks)
        return blocks

    def register(self, block_ids: Sequence[int], hashes: Sequence[BlockHash]) -> int:
        """Name complete blocks (``refcount > 0``) so later requests can reuse them. A hash that
        is already held by another block is skipped. Returns how many were newly named."""
        if len(block_ids) < len(hashes):
            raise EngineError("more hashes than blocks to register")
        named: list[BlockHash] = []
        for b, h in zip(block_ids, hashes, strict=False):
            self._check_id(b)
            if self._ref[b] <= 0:
                raise EngineError(f"block {b} is not allocated; cannot register it")
            if h in self._block_of or b in self._hash_of:
                continue
            self._block_of[h] = b
            self._hash_of[b] = h
            named.append(h)
        if named:
            self._emit(KVEventKind.STORED, named)
        return len(named)

    # --- events and checks ---------------------------------------------------------------
    def _emit(self, kind: KVEventKind, hashes: list[BlockHash]) -> None:
        self._seq += 1
        self._events.append(KVEvent(self._seq, self.instance_id, kind, tuple(hashes)))
        if len(self._events) > self._max_events:
            del self._events[: len(self._events) - self._max_events]

    def events(self, since_seq: int) -> list[KVEvent]:
        return [e for e in self._events if e.seq > since_seq]

    def cached_hashes(self) -> list[BlockHash]:
        """Every named block (used or cached): a full resync for a KV-event consumer."""
        return list(self._block_of)

    def _check_id(self, b: int) -> None:
        if not 0 <= b < self.capacity:
            raise EngineError(f"block id {b} outside [0, {self.capacity})")

    def check(self) -> None:
        """Assert the accounting invariants (used by tests)."""
        used = sum(1 for r in self._ref if r > 0)
        assert used + len(self._cached) + len(self._free) == self.capacity
        assert all(self._ref[b] == 0 for b in self._free)
        assert all(self._ref[b] == 0 and b in self._hash_of for b in self._cached)
        assert len(set(self._free)) == len(self._free)
        assert all(self._block_of[h] == b for b, h in self._hash_of.items())
        assert len(self._block_of) == len(self._hash_of)
