"""Simulated instances: a Mooncake prefill node (FIFO prefill, DRAM KV cache, NIC) and a
decode node (continuous batch with a KV-memory limit).

Memory accounting of a decode node: ``kv_used`` counts the prompt+output tokens reserved by the
requests in its batch; a request joins only if its reservation fits (``kv_used + need <=
capacity``) and waits in ``waiting`` otherwise. ``kv_used + free == capacity`` always.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvcake.core.api import Accept
from kvcake.core.costmodel import DecodeCoefficients
from kvcake.core.ids import InstanceId
from kvcake.sim.batch import DecodeBatch, FinishFn
from kvcake.sim.cache import IndexSink, LRUBlockCache
from kvcake.sim.events import EventQueue
from kvcake.sim.request import SimRequest


@dataclass(slots=True)
class Job:
    req: SimRequest
    accept: Accept
    predicted: float  # predicted prefill seconds, counted in the node's queue estimate


class PrefillNode:
    __slots__ = (
        "batch",
        "busy_s",
        "busy_until",
        "cache",
        "current",
        "idx",
        "iid",
        "nic_free",
        "queue",
        "queued_pred",
    )

    def __init__(self, idx: int, iid: InstanceId, cache_blocks: int, index: IndexSink) -> None:
        self.idx = idx
        self.iid = iid
        self.cache = LRUBlockCache(cache_blocks, iid, index)
        self.queue: deque[Job] = deque()
        self.queued_pred = 0.0
        self.current: SimRequest | None = None
        self.batch: list[SimRequest] = []  # batched with ``current`` (pool model), same end
        self.busy_until = 0.0
        self.nic_free = 0.0
        self.busy_s = 0.0

    def queued_seconds(self, now: float) -> float:
        return max(self.busy_until - now, 0.0) + self.queued_pred

    @property
    def queued_requests(self) -> int:
        return len(self.queue) + (self.current is not None) + len(self.batch)


class DecodeNode:
    __slots__ = (
        "batch",
        "capacity",
        "idx",
        "iid",
        "kv_used",
        "pending_ctx",
        "pending_reqs",
        "waiting",
    )

    def __init__(
        self,
        idx: int,
        iid: InstanceId,
        capacity: int,
        eq: EventQueue,
        coeffs: DecodeCoefficients,
        on_finish: FinishFn,
    ) -> None:
        self.idx = idx
        self.iid = iid
        self.capacity = capacity
        self.kv_used = 0
        self.batch = DecodeBatch(eq, coeffs, on_finish)
        self.waiting: deque[SimRequest] = deque()
        self.pending_reqs = 0  # accepted, not yet in the batch (prefill or KV transfer)
        self.pending_ctx = 0

    @staticmethod
    def need(req: SimRequest) -> int:
        return req.prompt_len + req.output_len

    def offer(self, now: float, req: SimRequest) -> None:
        """KV of ``req`` has arrived: join now if memory allows, else wait (FIFO)."""
        self.waiting.append(req)
        self.admit(now)

    def admit(self, now: float) -> None:
        while self.waiting and self.kv_used + self.need(self.waiting[0]) <= self.capacity:
            self._join_next(now)
        if self.waiting and not self.batch.size and self.kv_used == 0:
            # a single request larger than the whole memory: run it alone rather than deadlock
            self._join_next(now)

    def _join_next(self, now: float) -> None:
        req = self.waiting.popleft()
        self.kv_used += self.need(req)
        self.pending_reqs -= 1
        self.pending_ctx -= req.prompt_len
        self.batch.add(now, req)

    def release(self, req: SimRequest) -> None:
        self.kv_used -= self.need(req)
        assert self.kv_used >= 0, "decode KV accounting went negative"
