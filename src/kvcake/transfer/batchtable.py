"""The bounded table of submitted batches that ``status`` and ``wait`` look up."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from kvcake.core.ids import BatchId
from kvcake.transfer.batch import Batch
from kvcake.transfer.errors import TooManyBatches, UnknownBatch

SWEEP_EVERY_S = 1.0  # an add() sweeps expired batches at most this often (or when full)


class BatchTable:
    """Submitted batches by id, at most ``max_batches`` of them.

    Invariants: a batch stays until ``discard`` (its ``wait`` returned) or until it has been
    finished for longer than ``ttl_s`` (nobody collected it, e.g. after a ``wait`` timed out)
    and an ``add`` sweeps it. A full table drops its oldest finished batches first; a table
    full of running batches refuses the new one with TooManyBatches, so the table never holds
    more than ``max_batches``. One lock, held only for the dictionary work, never while a
    batch runs or is waited for."""

    def __init__(self, max_batches: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        if max_batches < 1 or ttl_s <= 0:
            raise ValueError(f"need max_batches >= 1 and ttl_s > 0, got {max_batches}, {ttl_s}")
        self.max_batches = max_batches
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._table: dict[BatchId, Batch] = {}
        self._swept_at = clock()

    def add(self, batch: Batch) -> None:
        now = self._clock()
        with self._lock:
            table = self._table
            if len(table) >= self.max_batches or now - self._swept_at > SWEEP_EVERY_S:
                self._swept_at = now
                for bid in [
                    b for b, x in table.items() if x.done_at and now - x.done_at > self.ttl_s
                ]:
                    del table[bid]
            if len(table) >= self.max_batches:
                finished = sorted((x.done_at, b) for b, x in table.items() if x.done_at)
                for _, bid in finished[: len(table) - self.max_batches + 1]:
                    del table[bid]
            if len(table) >= self.max_batches:
                raise TooManyBatches(
                    f"{len(table)} batches are still running (transfer.max_batches); "
                    "wait() for some first"
                )
            table[batch.id] = batch

    def get(self, batch_id: BatchId) -> Batch:
        with self._lock:
            batch = self._table.get(batch_id)
        if batch is None:
            raise UnknownBatch(f"unknown batch {batch_id}")
        return batch

    def discard(self, batch_id: BatchId) -> None:
        with self._lock:
            self._table.pop(batch_id, None)

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._table

    def __iter__(self) -> Iterator[BatchId]:
        with self._lock:
            return iter(list(self._table))
