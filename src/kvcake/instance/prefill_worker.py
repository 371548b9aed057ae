"""The prefill side of an instance: one prefill at a time on a dedicated thread.

For a task it (0) reserves the decode instance's KV itself (``instance.peers``: the prompt goes
along, the reservation comes back here, neither through the proxy), (1) reuses the longest locally cached prefix, (2) reads further prefix blocks the
conductor named (``Accept.fetch``) from the **store pool** into fresh local blocks — the store
client picks the replica; the live system never reads another instance's memory, which is why
the conductor's ``BlockSource.holder`` for such blocks is the pool — and keeps them (live
replication: they are registered, so the proxy's index learns this instance holds them too),
(3) ships reused blocks to the decode instance whole, (4) computes the rest — the backend chunks
it — and streams each layer's KV to the decode instance as soon as that layer is done, (5) names
the new full blocks and puts them into the pool in the background, (6) waits for every KV write
before answering.

Abort: :meth:`PrefillWorker.abort` marks the request and returns only once the worker no longer
writes for it — a queued task is refused when it reaches the thread, a running one stops at the
next layer and waits for its in-flight writes (``KVSender.cancel``). The answer says whether
every write resolved (``True``), so the decode side may free the reserved blocks at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvcake.core.api import KVReservation, PrefillResult, PrefillTask
from kvcake.core.hashing import hash_block, salted_root
from kvcake.core.ids import BlockHash, RequestId
from kvcake.core.pools import started_pool
from kvcake.engine.backend import EngineBackend
from kvcake.instance.kvblocks import KVBlocks, Prompt
from kvcake.instance.kvlink import KVLink, KVSender, PoolLink
from kvcake.instance.peers import Peers, PendingReservation, reserve_waiting
from kvcake.instance.store_glue import PoolWriter
from kvcake.serve import attribution
from kvcake.serve.online_fit import OnlineFit
from kvcake.serve.wire import BadRequest, InstanceError, ReserveKV

ABORT_ACK_TIMEOUT_S = 70.0  # > KVSender's write timeout: the ack always comes


class Aborted(InstanceError):
    def __init__(self, rid: RequestId):
        super().__init__(f"request {rid} was aborted", 409, "aborted")


class AbortLog:
    """Ids of aborted requests, bounded (oldest forgotten first): an abort can arrive before
    the task it cancels, so ids are remembered for a while, not forever."""

    def __init__(self, max_ids: int = 4096):
        self.max_ids = max_ids
        self._ids: OrderedDict[RequestId, None] = OrderedDict()
        self._mu = threading.Lock()

    def add(self, rid: RequestId) -> None:
        with self._mu:
            self._ids[rid] = None
            self._ids.move_to_end(rid)
            while len(self._ids) > self.max_ids:
                self._ids.popitem(last=False)

    def discard(self, rid: RequestId) -> None:
        with self._mu:
            self._ids.pop(rid, None)

    def __contains__(self, rid: object) -> bool:
        return rid in self._ids

    def __len__(self) -> int:
        return len(self._ids)


@dataclass
class PrefillDeps:
    """What the prefill worker may touch of its instance (nothing else)."""

    name: str
    backend: EngineBackend  # compute (``prefill``) and KV memory views only
    kv: KVBlocks
    compute: Callable[[], contextlib.AbstractContextManager[Any]]
    aborted: AbortLog
    metrics: Any  # serve.instance._Metrics
    fit: OnlineFit
    max_context: int
    vocab_size: int
    time_scale: float = 1.0
    link: KVLink | None = None
    pool: PoolLink | None = None
    writer: PoolWriter | None = None
    peers: Peers | None = None  # reaches the decode instances (reservations)


class PrefillWorker:
    def __init__(self, deps: PrefillDeps):
        self.d = deps
        self._exec = _single_thread(f"prefill-{deps.name}")
        self._queue: dict[RequestId, tuple[int, float]] = {}  # rid -> (tokens, predicted s)
        self._active: dict[RequestId, threading.Event] = {}
        self._clean: dict[RequestId, bool] = {}  # did an aborted run's writes all resolve?
        self._qlock = threading.Lock()
        self.recent_s = 0.0

    def close(self) -> None:
        self._exec.shutdown(wait=False, cancel_futures=True)

    def busy(self) -> bool:
        with self._qlock:
            return bool(self._queue)

    def queue_stats(self) -> tuple[int, int, float]:
        with self._qlock:
            vals = list(self._queue.values())
        return len(vals), sum(v[0] for v in vals), sum(v[1] for v in vals)

    async def submit(self, task: PrefillTask) -> PrefillResult:
        self._validate(task)
        d = self.d
        local = d.kv.cached_prefix_len(task.block_hashes)
        cached = min(local * d.kv.block_tokens, len(task.prompt_tokens) - 1)
        predicted = (
            d.backend.cost_model.prefill_time(len(task.prompt_tokens), cached) * d.time_scale
        )
        with self._qlock:
            self._queue[task.request_id] = (len(task.prompt_tokens) - cached, predicted)
        loop = asyncio.get_running_loop()
        reserving, pending = None, None
        if task.decode is not None:  # asked for now, waited for at the first KV write
            reserving = asyncio.ensure_future(self._reserve(task))
            pending = PendingReservation(reserving, task.decode.wait_s + 60.0)
        try:
            return await loop.run_in_executor(
                self._exec, self._run, task, pending, time.perf_counter()
            )
        finally:
            if reserving is not None and not reserving.done():  # the prefill failed first
                reserving.cancel()
            with self._qlock:
                self._queue.pop(task.request_id, None)

    async def _reserve(self, task: PrefillTask) -> tuple[KVReservation, float]:
        """The decode instance's reservation, asked for when the prefill starts (the proxy's
        gate lets one prefill at a time reach this instance), and the wait for it."""
        assert task.decode is not None
        if self.d.peers is None:
            raise InstanceError("this instance has no decode peers (no Transfer Engine)")
        req = ReserveKV(
            task.request_id, task.decode.num_tokens, task.prompt_tokens, task.block_hashes,
            task.sampling,
        )  # fmt: skip
        return await reserve_waiting(
            self.d.peers, task.decode, req, lambda: task.request_id in self.d.aborted
        )

    async def abort(self, rid: RequestId) -> bool:
        """Mark ``rid`` aborted; returns once nothing writes for it any more (see module doc)."""
        self.d.aborted.add(rid)
        deadline = time.monotonic() + ABORT_ACK_TIMEOUT_S
        while (ev := self._active.get(rid)) is not None and not ev.is_set():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.005)
        with self._qlock:
            return self._clean.pop(rid, True)

    def _validate(self, task: PrefillTask) -> None:
        n, d = len(task.prompt_tokens), self.d
        if not 1 <= n <= d.max_context:
            raise BadRequest(f"prompt of {n} tokens outside [1, {d.max_context}]")
        if not tokens_in_vocab(task.prompt_tokens, d.vocab_size):
            raise BadRequest(f"token ids must be in [0, {d.vocab_size})")
        if not _hashes_fit(task, d.kv.block_tokens):
            raise BadRequest("block_hashes do not match the prompt (wrong kv_block_tokens?)")

    # --- on the prefill thread -------------------------------------------------------------
    def _run(
        self, task: PrefillTask, res: PendingReservation | None, queued_at: float
    ) -> PrefillResult:
        rid = task.request_id
        ev = threading.Event()
        self._active[rid] = ev
        try:
            if rid in self.d.aborted:
                raise Aborted(rid)
            result = self._prefill(task, res, queued_at)
            if res is not None:  # the proxy's service fit leaves the decode-KV wait out
                result.timings["decode_wait_s"] = res.blocked_s
            return result
        finally:
            ev.set()
            self._active.pop(rid, None)

    def _prefill(
        self, task: PrefillTask, res: PendingReservation | None, queued_at: float
    ) -> PrefillResult:
        d, be, rid = self.d, self.d.backend, task.request_id
        t0 = time.perf_counter()
        n_tokens = len(task.prompt_tokens)
        table, n_local, sources = self._acquire_blocks(task)
        n_fetched = sum(v for k, v in sources.items() if k.startswith(("memory:", "disk:")))
        cached = (n_local + n_fetched) * d.kv.block_tokens
        first_new = cached // d.kv.block_tokens
        t_fetch = time.perf_counter()
        sender: KVSender | None = None
        try:

            def on_layer(layer: int) -> None:
                nonlocal sender
                if rid in d.aborted:  # stop computing and writing at the next layer
                    raise Aborted(rid)
                if res is not None and sender is None:  # the first write: needs the blocks
                    sender = self._sender(table, res, first_new)
                if sender is not None:
                    sender.send_layer(layer, first_new)

            with d.compute():
                if rid in d.aborted:
                    raise Aborted(rid)
                first = be.prefill(task.prompt_tokens, table, cached, task.sampling, on_layer)
            if res is not None and sender is None:  # a prefill that reported no layer
                sender = self._sender(table, res, first_new)
            t_compute = time.perf_counter()
            stream = sender.finish() if sender is not None else {}
        except BaseException:
            clean = sender.cancel() if sender is not None else True
            with self._qlock:
                if rid in d.aborted:
                    self._clean[rid] = clean
                    while len(self._clean) > 1024:  # acks nobody came for
                        self._clean.pop(next(iter(self._clean)))
            d.kv.free(table)
            raise
        self._after(task, table, first_new)
        t_end = time.perf_counter()
        self.recent_s = t_end - queued_at
        blocked = res.blocked_s if res is not None else 0.0  # waiting for the decode's KV
        d.fit.add_prefill(n_tokens, cached, t_compute - t_fetch - blocked)
        d.metrics.prefill_s.observe(t_compute - t_fetch - blocked)
        d.metrics.cached_tokens.inc(cached)
        d.metrics.computed_tokens.inc(n_tokens - cached)
        timings = {
            "queue_s": t0 - queued_at,
            "fetch_s": t_fetch - t0,
            "compute_s": t_compute - t_fetch - blocked,
            "kv_wait_s": t_end - t_compute,
            "fetched_blocks": float(n_fetched),
            **stream,
        }
        return PrefillResult(rid, first, n_tokens, cached, n_tokens - cached, timings, sources)

    def _sender(self, table: list[int], res: PendingReservation, first_new: int) -> KVSender:
        """The KV stream into the decode's reservation (waited for here), starting with the
        reused prefix blocks, whole."""
        if self.d.link is None:
            raise InstanceError("this instance has no Transfer Engine")
        sender = self.d.link.sender(table, res.get())
        sender.send_blocks(0, first_new)
        return sender

    def _acquire_blocks(self, task: PrefillTask) -> tuple[list[int], int, dict[str, int]]:
        """The request's block table: reused local blocks, then blocks read from the pool,
        then fresh blocks for the rest. Returns (table, local blocks, ``kv_sources``: blocks
        per source, serve.attribution)."""
        kv, n_tokens = self.d.kv, len(task.prompt_tokens)
        hashes = list(task.block_hashes)
        local = kv.lookup_prefix(hashes, keep_tokens=n_tokens)
        try:
            rest = kv.allocate(kv.blocks_for(n_tokens) - len(local))
        except BaseException:
            kv.free(local)
            raise
        table = local + rest
        try:
            fetched = self._fetch(task, hashes, table, len(local))
        except BaseException:
            kv.free(table)
            raise
        return table, len(local), {attribution.LOCAL: len(local), **fetched}

    def _fetch(
        self, task: PrefillTask, hashes: Sequence[BlockHash], table: list[int], n: int
    ) -> dict[str, int]:
        """Read prefix blocks ``n..`` the conductor said exist elsewhere from the pool.
        Returns blocks per source and per failure (``kv_sources`` keys)."""
        d = self.d
        if d.pool is None or not task.fetch:
            return {}
        want = max(s.first_block + s.num_blocks for s in task.fetch)
        full_limit = (len(task.prompt_tokens) - 1) // d.kv.block_tokens
        want = min(want, full_limit, len(hashes))
        if want <= n or task.request_id in d.aborted:
            return {}
        views = [d.backend.memory.block_view(b) for b in table[n:want]]
        read, missed = d.pool.read_prefix(hashes[n:want], views)
        got = sum(read.values())
        if got:  # replicate: this instance now holds them too
            d.kv.register(table[n : n + got], hashes[n : n + got])
        return {**read, **missed}

    def _after(self, task: PrefillTask, table: list[int], first_new: int) -> None:
        d = self.d
        hashes = list(task.block_hashes)
        d.kv.register(table[: len(hashes)], hashes)
        if d.writer is not None and first_new < len(hashes):
            d.writer.put(hashes[first_new:], table[first_new : len(hashes)], block=True,
                         tenant=task.sampling.tenant)  # fmt: skip
        if task.decode is None:  # colocated: the decode loop takes these blocks
            d.kv.keep(task.request_id, table,
                      Prompt(task.prompt_tokens, task.block_hashes, task.sampling))  # fmt: skip
        else:
            d.kv.free(table)


def tokens_in_vocab(tokens: Sequence[int], vocab_size: int) -> bool:
    """Every id in ``[0, vocab_size)``, with ``min``/``max`` (C loops: half the time of a
    Python loop over the ids, measured; this runs inside the prefill gate)."""
    return not tokens or (min(tokens) >= 0 and max(tokens) < vocab_size)


def _hashes_fit(task: PrefillTask, bt: int) -> bool:
    """The proxy's block hashes against the prompt, cheaply: one per full block, the first
    chained on the request's salted root (block size and tenant agree) and the last on the
    one before it (the prompt's end agrees). The proxy is trusted (its calls are signed): this
    catches a misconfigured block size or salt, not a forger, and costs two hashes instead of
    the whole chain."""
    toks, hs = task.prompt_tokens, task.block_hashes
    n = len(toks) // bt
    if len(hs) != n:
        return False
    if n == 0:
        return True
    if hash_block(salted_root(task.sampling.cache_salt), toks[:bt]) != hs[0]:
        return False
    return n == 1 or hash_block(hs[-2], toks[(n - 1) * bt : n * bt]) == hs[-1]


def _single_thread(name: str) -> Any:
    return started_pool(1, name)
