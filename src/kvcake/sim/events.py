"""The event core: a heap of small events ordered by ``(time, priority, sequence)``.

Invariants: events pop in non-decreasing time; at equal times the lower :class:`Prio` runs
first (completions free resources before new work claims them); at equal time and priority the
event scheduled first runs first (``seq``), so a run is fully deterministic. An event is a tuple,
not an object, because the simulator pushes hundreds of thousands of them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from enum import IntEnum
from typing import Any, TypeVar, overload

P = TypeVar("P")
# Stored type-erased: one heap holds every kind of event; ``schedule`` checks each pair.
Handler = Callable[[float, Any], None]


class Prio(IntEnum):
    """Order of events that share a timestamp."""

    FINISH = 0  # a running piece of work ends (frees capacity)
    BATCH = 1  # a decode batch reaches an iteration boundary
    READY = 2  # KV arrived, a request may join a batch
    ARRIVAL = 3  # a new request reaches the conductor
    SAMPLE = 4  # monitoring (observes the state after everything else at that instant)


class EventQueue:
    """A deterministic event loop. Handlers receive ``(now, payload)`` and may schedule more."""

    __slots__ = ("_heap", "_seq", "now", "processed")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Handler, Any]] = []
        self._seq = 0
        self.now = 0.0
        self.processed = 0

    @overload
    def schedule(self, time: float, prio: int, handler: Callable[[float, None], None]) -> None: ...

    @overload
    def schedule(
        self, time: float, prio: int, handler: Callable[[float, P], None], payload: P
    ) -> None: ...

    def schedule(self, time: float, prio: int, handler: Handler, payload: object = None) -> None:
        if time < self.now:
            raise ValueError(f"cannot schedule into the past ({time} < {self.now})")
        self._seq += 1
        heapq.heappush(self._heap, (time, prio, self._seq, handler, payload))

    def __len__(self) -> int:
        return len(self._heap)

    def run(self, until: float = float("inf")) -> int:
        """Process events with ``time <= until``; returns how many were processed."""
        heap, pop = self._heap, heapq.heappop
        n = 0
        while heap and heap[0][0] <= until:
            time, _, _, handler, payload = pop(heap)
            self.now = time
            handler(time, payload)
            n += 1
        self.processed += n
        return n
