"""The live path's KV pool, as the simulator models it with ``fetch_source = "pool"``.

The live prefill worker reads the prefix blocks it does not hold locally from the *store pool*
(store nodes' DRAM, then SSD; the store client picks the replica), never from another prefill
instance; the conductor's ``BlockSource.holder`` for such blocks is the pool. Every node of the
cluster — prefill *and* decode — contributes ``pool_tokens_per_node`` of DRAM (and
``ssd_tokens_per_node`` of SSD) to the pool.

Model:
- One replica per block, on store node ``block % nodes`` (the store spreads objects by key).
- Capacity: one LRU over the whole DRAM tier (capacity = per-node DRAM x nodes; with the
  hash placement the per-node shares are balanced, so one global LRU is a close stand-in for
  per-node LRUs). DRAM evictions are demoted to the SSD tier (LRU too) when it exists; SSD
  evictions leave the pool. A read of an SSD block promotes it back to DRAM.
- Within one put (a request's prefix), the head is the most recently used: at equal recency
  the deepest block is evicted first (as in :class:`~kvcake.sim.cache.LRUBlockCache`).
- The pool is one holder (``InstanceId("pool")``) in the conductor's KV index: a block is
  registered when it enters the pool (either tier) and removed when it leaves both.

Every node has a full-duplex :class:`Nic` (separate transmit and receive FIFOs): a fetch uses
the store node's TX and the prefill node's RX; a put uses the prefill node's TX and the store
node's RX; the KV stream to decode uses the prefill node's TX and the decode node's RX.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import cast

from kvcake.core.api import KVIndex
from kvcake.core.ids import BlockHash, InstanceId
from kvcake.sim.cache import IndexSink
from kvcake.sim.events import EventQueue, Prio

POOL_HOLDER = InstanceId("pool")


class Nic:
    """One node's network interface: when its transmit and receive sides are next free."""

    __slots__ = ("bw", "rx_free", "tx_free")

    def __init__(self, bw: float) -> None:
        self.bw = bw
        self.tx_free = 0.0
        self.rx_free = 0.0


class LaggedIndex:
    """A :class:`KVIndex` front that delivers ``add``/``remove`` events ``lag_s`` after they
    happen (the live index learns about blocks from store/engine events that travel over the
    network), in the order they happened. Reads go to the underlying index at once."""

    def __init__(self, index: KVIndex, eq: EventQueue, lag_s: float) -> None:
        self.index = index
        self.eq = eq
        self.lag_s = lag_s

    def _apply(self, _now: float, ev: tuple[bool, InstanceId, Iterable[BlockHash]]) -> None:
        add, holder, blocks = ev
        (self.index.add if add else self.index.remove)(holder, blocks)

    def add(self, holder: InstanceId, blocks: Iterable[BlockHash]) -> None:
        self.eq.schedule(self.eq.now + self.lag_s, Prio.FINISH, self._apply, (True, holder, blocks))

    def remove(self, holder: InstanceId, blocks: Iterable[BlockHash]) -> None:
        ev = (False, holder, blocks)
        self.eq.schedule(self.eq.now + self.lag_s, Prio.FINISH, self._apply, ev)


class StorePool:
    """Two-tier (DRAM, SSD) block pool over ``nodes`` store nodes. Invariants:
    ``len(dram) <= dram_capacity``, ``len(ssd) <= ssd_capacity``, a block is in at most one
    tier, and the index holds exactly the blocks of both tiers under :data:`POOL_HOLDER`."""

    def __init__(
        self, dram_blocks: int, ssd_blocks: int, nodes: int, index: IndexSink | None
    ) -> None:
        if dram_blocks < 0 or ssd_blocks < 0 or nodes < 1:
            raise ValueError("pool capacities must be >= 0 and nodes >= 1")
        self.dram_capacity = dram_blocks
        self.ssd_capacity = ssd_blocks
        self.nodes = nodes
        self.index = index
        self.dram: OrderedDict[int, None] = OrderedDict()
        self.ssd: OrderedDict[int, None] = OrderedDict()
        self.puts = self.evictions = self.ssd_reads = 0

    def __contains__(self, block: int) -> bool:
        return block in self.dram or block in self.ssd

    def __len__(self) -> int:
        return len(self.dram) + len(self.ssd)

    @property
    def enabled(self) -> bool:
        return self.dram_capacity > 0

    def node_of(self, block: int) -> int:
        return block % self.nodes

    def run(self, blocks: Sequence[int], start: int, end: int) -> int:
        """How many blocks of ``blocks[start:end]`` the pool holds, from ``start`` on."""
        i = start
        while i < end and (blocks[i] in self.dram or blocks[i] in self.ssd):
            i += 1
        return i - start

    def read(self, blocks: Sequence[int]) -> tuple[dict[int, int], dict[int, int]]:
        """Read ``blocks`` (all held): per store node, how many came from DRAM and from SSD.
        SSD blocks are promoted to DRAM; read blocks become most recently used."""
        dram: dict[int, int] = {}
        ssd: dict[int, int] = {}
        for b in blocks:
            s = self.node_of(b)
            if b in self.ssd:
                ssd[s] = ssd.get(s, 0) + 1
                self.ssd_reads += 1
            else:
                dram[s] = dram.get(s, 0) + 1
        self.put(blocks)
        return dram, ssd

    def missing(self, blocks: Sequence[int]) -> list[int]:
        return [b for b in blocks if b not in self.dram and b not in self.ssd]

    def put(self, blocks: Sequence[int]) -> None:
        """Insert or refresh ``blocks`` in DRAM (head most recent); demote/evict beyond
        capacity."""
        if not self.dram_capacity:
            return
        d, s = self.dram, self.ssd
        new: list[int] = []
        for b in reversed(blocks):
            if b in d:
                d.move_to_end(b)
                continue
            if b in s:
                del s[b]
            else:
                new.append(b)
                self.puts += 1
            d[b] = None
        gone: list[int] = []
        while len(d) > self.dram_capacity:
            b = d.popitem(last=False)[0]
            if self.ssd_capacity:
                s[b] = None
            else:
                gone.append(b)
        while len(s) > self.ssd_capacity:
            gone.append(s.popitem(last=False)[0])
        self.evictions += len(gone)
        if self.index is not None:
            if new:
                self.index.add(POOL_HOLDER, cast(list[BlockHash], new))
            if gone:
                self.index.remove(POOL_HOLDER, cast(list[BlockHash], gone))
