"""The prefill side of an instance: one prefill at a time on a dedicated thread.

For a task it (1) reuses the longest locally cached prefix, (2) reads further prefix blocks the
conductor named from the pool into fresh local blocks and keeps them (live replication: they are
registered, so the proxy's index learns this instance holds them too), (3) ships reused blocks
to the decode instance whole, (4) computes the rest — the backend chunks it — and streams each
layer's KV to the decode instance as soon as that layer is done, (5) names the new full blocks
and puts them into the pool in the background, (6) waits for every KV write before answering.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from kvcake.core.api import KVEventKind, PrefillResult, PrefillTask
from kvcake.core.errors import EngineError
from kvcake.core.hashing import block_hashes
from kvcake.core.ids import BlockHash, RequestId
from kvcake.serve.kvlink import KVSender, PoolLink
from kvcake.serve.wire import BadRequest, InstanceError

if TYPE_CHECKING:
    from kvcake.serve.instance import Instance

log = logging.getLogger(__name__)


class Aborted(InstanceError):
    def __init__(self, rid: RequestId):
        super().__init__(f"request {rid} was aborted", 409, "aborted")


class PrefillWorker:
    def __init__(self, inst: Instance, pool: PoolLink | None):
        self.inst = inst
        self.pool = pool
        self._exec = ThreadPoolExecutor(1, thread_name_prefix=f"prefill-{inst.instance_id}")
        self._put_exec = ThreadPoolExecutor(1, thread_name_prefix=f"put-{inst.instance_id}")
        self._queue: dict[RequestId, tuple[int, float]] = {}  # rid -> (tokens, predicted s)
        self._qlock = threading.Lock()
        self._kept: dict[RequestId, list[int]] = {}  # colocated: tables waiting for decode
        self.recent_s = 0.0

    def close(self) -> None:
        self._exec.shutdown(wait=False, cancel_futures=True)
        self._put_exec.shutdown(wait=True)

    def busy(self) -> bool:
        with self._qlock:
            return bool(self._queue)

    def queue_stats(self) -> tuple[int, int, float]:
        with self._qlock:
            vals = list(self._queue.values())
        return len(vals), sum(v[0] for v in vals), sum(v[1] for v in vals)

    def kept_table(self, rid: RequestId) -> list[int] | None:
        return self._kept.get(rid)

    def take_table(self, rid: RequestId) -> list[int] | None:
        return self._kept.pop(rid, None)

    async def submit(self, task: PrefillTask) -> PrefillResult:
        self._validate(task)
        cm = self.inst.backend.cost_model
        with self.inst.mu:
            local = self.inst.backend.blocks.cached_prefix_len(task.block_hashes)
        scale = float(getattr(getattr(self.inst.backend, "cfg", None), "time_scale", 1.0))
        cached = min(local * self.inst.backend.block_tokens, len(task.prompt_tokens) - 1)
        predicted = cm.prefill_time(len(task.prompt_tokens), cached) * scale
        with self._qlock:
            self._queue[task.request_id] = (len(task.prompt_tokens) - cached, predicted)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._exec, self._run, task, time.perf_counter())
        finally:
            with self._qlock:
                self._queue.pop(task.request_id, None)

    def _validate(self, task: PrefillTask) -> None:
        n, inst = len(task.prompt_tokens), self.inst
        if not 1 <= n <= inst.max_context:
            raise BadRequest(f"prompt of {n} tokens outside [1, {inst.max_context}]")
        if any(not 0 <= t < inst.vocab_size for t in task.prompt_tokens):
            raise BadRequest(f"token ids must be in [0, {inst.vocab_size})")
        if list(task.block_hashes) != block_hashes(task.prompt_tokens, inst.backend.block_tokens):
            raise BadRequest("block_hashes do not match the prompt (wrong kv_block_tokens?)")

    # --- on the prefill thread -------------------------------------------------------------
    def _run(self, task: PrefillTask, queued_at: float) -> PrefillResult:
        inst, be = self.inst, self.inst.backend
        t0 = time.perf_counter()
        if task.request_id in inst.aborted:
            raise Aborted(task.request_id)
        n_tokens = len(task.prompt_tokens)
        table, n_local, n_fetched = self._acquire_blocks(task)
        cached = (n_local + n_fetched) * be.block_tokens
        t_fetch = time.perf_counter()
        sender = None
        try:
            if task.decode is not None:
                sender = KVSender(inst.transfer, inst.segment, be.layout, table, task.decode)
                sender.send_blocks(0, cached // be.block_tokens)
            first_new = cached // be.block_tokens

            def on_layer(layer: int) -> None:
                if task.request_id in inst.aborted:  # the client went away: stop computing
                    raise Aborted(task.request_id)
                if sender is not None:
                    sender.send_layer(layer, first_new)

            with inst.compute():
                if task.request_id in inst.aborted:
                    raise Aborted(task.request_id)
                first = be.prefill(task.prompt_tokens, table, cached, task.sampling, on_layer)
            t_compute = time.perf_counter()
            stream = sender.finish() if sender is not None else {}
        except BaseException:
            if sender is not None:
                sender.cancel()
            with inst.mu:
                be.free_blocks(table)
            raise
        self._after(task, table, first_new)
        t_end = time.perf_counter()
        self.recent_s = t_end - queued_at
        inst.metrics.prefill_s.observe(t_compute - t_fetch)
        inst.metrics.cached_tokens.inc(cached)
        inst.metrics.computed_tokens.inc(n_tokens - cached)
        timings = {
            "queue_s": t0 - queued_at,
            "fetch_s": t_fetch - t0,
            "compute_s": t_compute - t_fetch,
            "kv_wait_s": t_end - t_compute,
            "fetched_blocks": float(n_fetched),
            **stream,
        }
        return PrefillResult(task.request_id, first, n_tokens, cached, n_tokens - cached, timings)

    def _acquire_blocks(self, task: PrefillTask) -> tuple[list[int], int, int]:
        """The request's block table: reused local blocks, then blocks read from the pool,
        then fresh blocks for the rest. Returns (table, local blocks, fetched blocks)."""
        be, n_tokens = self.inst.backend, len(task.prompt_tokens)
        need = be.blocks_needed(n_tokens)
        hashes = list(task.block_hashes)
        with self.inst.mu:
            local = be.lookup_prefix(hashes)
            if len(local) * be.block_tokens >= n_tokens:  # keep >= 1 token to compute
                be.free_blocks(local[-1:])
                local = local[:-1]
            try:
                rest = be.allocate_blocks(need - len(local))
            except EngineError:
                be.free_blocks(local)
                raise
        table = local + rest
        fetched = self._fetch(task, hashes, table, len(local))
        return table, len(local), fetched

    def _fetch(
        self, task: PrefillTask, hashes: Sequence[BlockHash], table: list[int], n: int
    ) -> int:
        """Read prefix blocks ``n..`` the conductor said exist elsewhere from the pool."""
        if self.pool is None or not task.fetch:
            return 0
        want = max(s.first_block + s.num_blocks for s in task.fetch)
        full_limit = (len(task.prompt_tokens) - 1) // self.inst.backend.block_tokens
        want = min(want, full_limit, len(hashes))
        if want <= n:
            return 0
        views = [self.inst.backend.memory.block_view(b) for b in table[n:want]]
        got = self.pool.get_into(hashes[n:want], views)
        if got:
            with self.inst.mu:  # replicate: this instance now holds them too
                self.inst.backend.register_blocks(table[n : n + got], hashes[n : n + got])
        return got

    def _after(self, task: PrefillTask, table: list[int], first_new: int) -> None:
        inst, be = self.inst, self.inst.backend
        hashes = list(task.block_hashes)
        with inst.mu:
            be.register_blocks(table[: len(hashes)], hashes)
            if task.decode is None:
                self._kept[task.request_id] = table  # colocated: decode uses these blocks
            else:
                put = table[first_new : len(hashes)]
                if self.pool is not None and put:
                    be.blocks.acquire(put)  # keep them from eviction until the put is done
                    self._put_exec.submit(self._put, hashes[first_new:], put)
                be.free_blocks(table)
        if task.decode is None and self.pool is not None and first_new < len(hashes):
            put = table[first_new : len(hashes)]
            with inst.mu:
                be.blocks.acquire(put)
            self._put_exec.submit(self._put, hashes[first_new:], put)

    def put_async(self, hashes: list[BlockHash], blocks: list[int]) -> None:
        """Put named blocks into the pool in the background (references held meanwhile)."""
        if self.pool is None or not blocks:
            return
        with self.inst.mu:
            self.inst.backend.blocks.acquire(blocks)
        self._put_exec.submit(self._put, hashes, blocks)

    def _put(self, hashes: list[BlockHash], blocks: list[int]) -> None:
        assert self.pool is not None
        try:
            views = [self.inst.backend.memory.block_view(b) for b in blocks]
            stored = self.pool.put(hashes, views)
            self.inst.pool_event(KVEventKind.STORED, stored)
        except Exception:
            log.exception("putting %d blocks into the pool failed", len(blocks))
        finally:
            with self.inst.mu:
                self.inst.backend.free_blocks(blocks)
