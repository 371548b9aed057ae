"""An instance's KV event log as the proxy sees it.

Two sources merge into one sequence (``seq`` +1 per event, as ``core.api.KVEvent`` requires):
the engine's block manager (blocks cached / evicted in this instance's memory) and blocks this
instance wrote to the pool (holder :data:`POOL`). ``since(-1)`` answers a full resync: one STORED
event with every block the instance holds now, stamped with the current sequence number.
Not thread-safe: the instance calls it under its ``mu`` lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from kvcake.core.api import KVEvent, KVEventKind
from kvcake.core.ids import BlockHash, InstanceId
from kvcake.engine.block_manager import BlockManager

POOL = InstanceId("pool")  # the holder name of blocks in the store


class EventLog:
    def __init__(self, instance_id: InstanceId, blocks: BlockManager, max_events: int = 8192):
        self.instance_id = instance_id
        self.blocks = blocks
        self._engine_seq = 0
        self._seq = 0
        self._log: deque[KVEvent] = deque(maxlen=max_events)

    def _pull(self) -> None:
        for ev in self.blocks.events(self._engine_seq):
            self._engine_seq = ev.seq
            self._append(self.instance_id, ev.kind, ev.block_hashes)

    def _append(self, holder: InstanceId, kind: KVEventKind, hashes: Iterable[BlockHash]) -> None:
        hs = tuple(hashes)
        if hs:
            self._seq += 1
            self._log.append(KVEvent(self._seq, holder, kind, hs))

    def pool(self, kind: KVEventKind, hashes: Iterable[BlockHash]) -> None:
        self._pull()
        self._append(POOL, kind, hashes)

    def since(self, seq: int) -> list[KVEvent]:
        self._pull()
        if seq < 0:
            held = tuple(self.blocks.cached_hashes())
            return [KVEvent(self._seq, self.instance_id, KVEventKind.STORED, held)] if held else []
        return [e for e in self._log if e.seq > seq]

    def bounds(self) -> tuple[int, int]:
        self._pull()
        first = self._log[0].seq if self._log else self._seq + 1
        return first, self._seq
