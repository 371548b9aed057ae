"""KV events of the connector in vLLM's own types (docs/integrations/routers.md): each block a
worker saved into the pool becomes a ``BlockStored`` (kvcake's chained block hash, the parent
block's hash — None for a prompt's first block — its token ids, block size, medium ``CPU``: the
pool's memory). vLLM gathers them from the workers (``get_kv_connector_kv_cache_events``, after
each step), hands them to the scheduler connector (``update_connector_output``) and publishes
what ``take_events`` yields on its own KV-event stream (``--kv-events-config``).

A block is published once every tensor-parallel rank reported it: each rank saves its own share,
in its own background thread, so the ranks' reports of one block may come in different steps.
vLLM's per-step aggregation (``KVOutputAggregator``) only sums what the workers reported in that
step, so the scheduler side counts ranks across steps itself. Each worker reports a block once
per step (two requests saving the same block in one step: one event), so a step's count of an
event is the number of ranks that reported it.

The lineage comes from the scheduler (the planner knows the prompt's tokens) with each save run
and is also announced to the master, so the master's vLLM-format stream can publish the block
too (``store/vllm_events.py``). Bounded: at most ``MAX_PENDING`` events wait per side; beyond,
the oldest are dropped (a router misses a block, it never mis-scores one).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator, Sequence
from typing import Any

from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    BlockStored,
    KVCacheEvent,
    KVConnectorKVEvents,
    KVEventAggregator,
)

from kvcake.store.protocol import BlockMeta

MAX_PENDING = 16384


def stored(blocks: Sequence[BlockMeta]) -> list[KVCacheEvent]:
    return [
        BlockStored(
            block_hashes=[b.hash],
            parent_block_hash=b.parent,
            token_ids=list(b.tokens),
            block_size=len(b.tokens),
            lora_id=None,
            medium=MEDIUM_CPU,
            lora_name=None,
        )
        for b in blocks
    ]


class KvcakeKVEvents(KVConnectorKVEvents):
    """vLLM's container of connector events (as LMCache's): an aggregator over workers."""

    def __init__(self, num_workers: int = 1, events: list[KVCacheEvent] | None = None):
        self._agg = KVEventAggregator(num_workers)
        if events:
            self._agg.add_events(events)

    def add_events(self, events: list[KVCacheEvent]) -> None:
        self._agg.add_events(events)

    def aggregate(self) -> KvcakeKVEvents:
        """Keep the events every worker reported (a block is pooled once all ranks saved)."""
        common = self._agg.get_common_events()
        self._agg.clear_events()
        self._agg.add_events(common)
        self._agg.reset_workers()
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._agg.increment_workers(count)

    def get_all_events(self) -> list[KVCacheEvent]:
        return self._agg.get_all_events()

    def get_number_of_workers(self) -> int:
        return self._agg.get_number_of_workers()

    def clear_events(self) -> None:
        self._agg.clear_events()
        self._agg.reset_workers()


class SavedBlocks:
    """Worker side: events of blocks saved since the last step (the saver thread adds)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._q: deque[KVCacheEvent] = deque(maxlen=MAX_PENDING)

    def add(self, blocks: Sequence[BlockMeta]) -> None:
        with self._lock:
            self._q.extend(stored(blocks))

    def take(self) -> KvcakeKVEvents | None:
        with self._lock:
            events, self._q = list(self._q), deque(maxlen=MAX_PENDING)
        # Once per step: the scheduler reads an event's count as the ranks that reported it.
        return KvcakeKVEvents(1, list(dict.fromkeys(events))) if events else None


class SchedulerEvents:
    """Scheduler side: events every one of ``ranks`` workers reported, until ``take_events``;
    the ranks' reports may arrive in different steps (module doc)."""

    def __init__(self, ranks: int = 1) -> None:
        if ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {ranks}")
        self._ranks = ranks
        self._partial: OrderedDict[KVCacheEvent, int] = OrderedDict()  # reported by fewer
        self._ready: deque[KVCacheEvent] = deque(maxlen=MAX_PENDING)  # nobody takes: oldest go

    def add(self, output: Any) -> None:
        got = getattr(output, "kv_cache_events", None)
        if not isinstance(got, KvcakeKVEvents):
            return
        for event, n in Counter(got.get_all_events()).items():
            total = self._partial.pop(event, 0) + n
            if total >= self._ranks:
                self._ready.append(event)
                continue
            self._partial[event] = total
            if len(self._partial) > MAX_PENDING:  # a rank that never reports: forget the oldest
                self._partial.popitem(last=False)

    def take(self) -> Iterator[KVCacheEvent]:
        ready, self._ready = self._ready, deque(maxlen=MAX_PENDING)
        yield from ready
