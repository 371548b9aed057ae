"""Back-to-back frames for submitted one-frame batches (layer-by-layer streaming).

A caller that ``submit()``s one batch per layer as the layers come would otherwise hand each
batch to its own worker thread and pooled connection: on a small machine those threads fight
over the GIL and the CPUs. Here the one-frame batches of one ``(target segment, op)`` queue up
and a single drainer (a worker task) sends whatever is queued as back-to-back frames on one
connection, then reads the replies in order, as Mooncake's workers pipeline a peer's slices.

Invariants:
- at most one drainer per key runs at a time (``_active``), so one key uses one connection;
- each queued batch is settled exactly once: by its reply, by the general path after its
  path failed (which fails over), or with the error that aborted the round;
- a round carries at most ``window`` frames and ``window_bytes`` bytes; a queue holds at most
  as many batches as the engine's batch table (``max_batches``), which ``submit`` bounds.
- Only one op per key: a round of writes gets tiny replies and a round of reads sends tiny
  requests, so neither side can block on a full socket buffer while the other does too.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvcake.transfer.batch import Batch
from kvcake.transfer.tcp_transport import Outcome, VectorPlan
from kvcake.transfer.types import Op, TransferRequest

Key = tuple[str, Op]


@dataclass(frozen=True, slots=True)
class PipeItem:
    batch: Batch
    requests: Sequence[TransferRequest]
    plan: VectorPlan


# Settle one item with its frame's outcome (the engine's: results, or the general path).
Finish = Callable[[PipeItem, Outcome], None]
# Settle one item with the error that aborted its round.
Abort = Callable[[PipeItem, BaseException], None]


class FramePipeline:
    def __init__(self, window: int, window_bytes: int, finish: Finish, abort: Abort):
        if window < 1 or window_bytes < 1:
            raise ValueError("window and window_bytes must be >= 1")
        self._window = window
        self._window_bytes = window_bytes
        self._finish = finish
        self._abort = abort
        self._lock = threading.Lock()
        self._queues: dict[Key, collections.deque[PipeItem]] = {}
        self._active: set[Key] = set()

    def add(self, item: PipeItem) -> Callable[[], None] | None:
        """Queue ``item``; returns the drainer to start when none runs for its key yet."""
        key = (item.plan.target.name, item.plan.op)
        with self._lock:
            self._queues.setdefault(key, collections.deque()).append(item)
            if key in self._active:
                return None
            self._active.add(key)
        return lambda: self._drain(key)

    def queued(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._queues.values())

    def _drain(self, key: Key) -> None:
        while True:
            items = self._take(key)
            if not items:
                return
            try:
                outs = items[0].plan.transport.run_vectors([it.plan for it in items])
            except BaseException as exc:  # settle every item, then let a non-Exception go on
                for it in items:
                    self._abort(it, exc)
                if not isinstance(exc, Exception):
                    self._release(key)
                    raise
                continue
            for it, out in zip(items, outs, strict=True):
                try:
                    self._finish(it, out)
                except Exception as exc:  # the general path's fallback broke: never hang
                    self._abort(it, exc)

    def _take(self, key: Key) -> list[PipeItem]:
        """The next round's items; an empty list (and the key released) when none is left."""
        with self._lock:
            q = self._queues.get(key)
            if not q:
                self._queues.pop(key, None)
                self._active.discard(key)
                return []
            items = [q.popleft()]
            size = items[0].plan.total
            while q and len(items) < self._window and size + q[0].plan.total <= self._window_bytes:
                size += q[0].plan.total
                items.append(q.popleft())
            return items

    def _release(self, key: Key) -> None:
        """Abort what is still queued for ``key`` and free it (the drainer is going away)."""
        with self._lock:
            left = list(self._queues.pop(key, ()))
            self._active.discard(key)
        for it in left:
            self._abort(it, RuntimeError("transfer drainer stopped"))
