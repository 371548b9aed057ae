"""Continuous-batching decode on a dedicated thread.

A request joins once its prompt KV is complete (the proxy calls ``stream_tokens`` only after the
prefill instance confirmed every KV write), holding the blocks reserved for its prompt plus a
small margin and the prompt the prefill instance handed over with the reservation. The prompt's
block hashes came with it (the proxy's); the loop extends that chain as the answer fills blocks,
so every block is hashed once (``_chain``). Each iteration takes up to ``max_batch`` running sequences, **grows** their block
tables by one block when the next token needs it, runs one backend decode step and hands every
new token to the request's asyncio queue.

When the KV memory runs out while growing, the newest running request is **preempted** (as the
offline ``engine.scheduler`` does): its full blocks are named (so they stay cached while memory
allows), its blocks are freed and it waits; when memory frees up it is **recomputed** from its
prompt plus the tokens it already produced (reusing whatever of it is still cached) and
continues. Its client sees a longer gap, not an error; only a request that cannot get memory for
``PREEMPT_WAIT_S`` ends with an error. Requests leave between iterations when they finish (the
one stop rule, :func:`kvcake.engine.sampling.finish_reason`) or are aborted.

Locks: ``_cv`` guards the loop's queues; the KV block owner's lock is a leaf taken inside it
(``_cv`` -> KV), never the other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvcake.core.api import FinishReason, SamplingParams, TokenChunk
from kvcake.core.hashing import block_hashes
from kvcake.core.ids import BlockHash, RequestId
from kvcake.engine.backend import DecodeSeq, EngineBackend
from kvcake.engine.sampling import finish_reason
from kvcake.instance.kvblocks import KVBlocks, Prompt
from kvcake.instance.store_glue import PoolWriter
from kvcake.serve.online_fit import OnlineFit

PREEMPT_WAIT_S = 60.0  # a preempted request that cannot get memory back for this long fails


@dataclass
class DecodeDeps:
    """What the decode loop may touch of its instance (nothing else)."""

    name: str
    backend: EngineBackend  # compute only (``decode``; ``prefill`` to recompute a preempted one)
    kv: KVBlocks
    compute: Callable[[], contextlib.AbstractContextManager[Any]]
    metrics: Any  # serve.instance._Metrics
    fit: OnlineFit
    eos_token_ids: tuple[int, ...]
    max_context: int
    writer: PoolWriter | None = None


@dataclass
class _Running:
    seq: DecodeSeq
    queue: asyncio.Queue[TokenChunk]
    loop: asyncio.AbstractEventLoop
    sampling: SamplingParams
    tokens: list[int]  # prompt + output
    hashes: list[BlockHash]  # of the full blocks of ``tokens`` named so far (``_chain``)
    generated: int = 1  # the first token came from prefill
    preempted_at: float = 0.0


class DecodeLoop:
    def __init__(self, deps: DecodeDeps, max_batch: int):
        self.d = deps
        self.max_batch = max_batch
        self._cv = threading.Condition()
        self._joining: deque[_Running] = deque()
        self._running: dict[RequestId, _Running] = {}
        self._preempted: deque[_Running] = deque()
        self._aborts: set[RequestId] = set()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.recent_tbt_s = 0.0
        self.preemptions = 0

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._main, name=f"decode-{self.d.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def busy(self) -> bool:
        with self._cv:
            return bool(self._joining or self._running or self._preempted)

    def stats(self) -> tuple[int, int]:
        with self._cv:
            rs = [*self._running.values(), *self._joining, *self._preempted]
        return len(rs), sum(r.seq.context_len for r in rs)

    def join(
        self, rid: RequestId, table: list[int], prompt: Prompt, first_token: int
    ) -> asyncio.Queue[TokenChunk]:
        queue: asyncio.Queue[TokenChunk] = asyncio.Queue()
        seq = DecodeSeq(rid, table, len(prompt.tokens), first_token, prompt.sampling)
        run = _Running(seq, queue, asyncio.get_running_loop(), prompt.sampling,
                       [*prompt.tokens, first_token], list(prompt.hashes))  # fmt: skip
        with self._cv:
            if self._reason(run, first_token) is not None:  # the prefill's token ends it
                self._end(run, self._reason(run, first_token), None)  # type: ignore[arg-type]
                return queue
            self._aborts.discard(rid)
            self._joining.append(run)
            self._cv.notify_all()
        return queue

    def abort(self, rid: RequestId) -> None:
        with self._cv:
            self._aborts.add(rid)
            self._cv.notify_all()

    # --- decode thread ---------------------------------------------------------------------
    def _main(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not (self._joining or self._running or self._preempted):
                    self._cv.wait(0.5)
                if self._stop:
                    break
                self._apply_aborts()
                while self._joining and len(self._running) < self.max_batch:
                    r = self._joining.popleft()
                    self._running[r.seq.request_id] = r
                resume = self._preempted[0] if self._preempted else None
                if resume is not None and len(self._running) >= self.max_batch:
                    resume = None
            if resume is not None:
                self._resume(resume)
            with self._cv:
                batch = list(self._running.values())
            if batch:
                self._step(batch)
            elif self._preempted:
                time.sleep(0.01)  # waiting for memory: do not spin
        with self._cv:
            for r in [*self._running.values(), *self._joining, *self._preempted]:
                self._end(r, FinishReason.ERROR, "instance shutting down")

    def _apply_aborts(self) -> None:
        """Caller holds ``_cv``."""
        for r in [*self._running.values(), *self._joining, *self._preempted]:
            if r.seq.request_id in self._aborts:
                self._end(r, FinishReason.ABORT, None)
        self._aborts.clear()

    def _step(self, batch: list[_Running]) -> None:
        d = self.d
        ok: list[_Running] = []
        with self._cv:
            for r in batch:
                if r.seq.request_id in self._running and self._make_room(r):
                    ok.append(r)
        if not ok:
            return
        t0 = time.perf_counter()
        ctx = sum(r.seq.context_len for r in ok)
        try:
            with d.compute():
                tokens = d.backend.decode([r.seq for r in ok])
        except Exception as exc:
            with self._cv:
                for r in ok:
                    self._end(r, FinishReason.ERROR, f"decode failed: {exc!r}")
            return
        dt = time.perf_counter() - t0
        self.recent_tbt_s = 0.8 * self.recent_tbt_s + 0.2 * dt if self.recent_tbt_s else dt
        d.fit.add_decode(len(ok), ctx, dt)
        d.metrics.step_s.observe(dt)
        d.metrics.generated.inc(len(ok))
        with self._cv:
            for r, tok in zip(ok, tokens, strict=True):
                if r.seq.request_id not in self._running:
                    continue  # aborted meanwhile (its blocks are already released)
                r.generated += 1
                r.tokens.append(tok)
                reason = self._reason(r, tok)
                if reason is FinishReason.STOP:  # the stop token itself is not output
                    self._end(r, reason, None)
                elif reason is not None:
                    self._end(r, reason, None, (tok,))
                else:
                    self._emit(r, TokenChunk(r.seq.request_id, (tok,)))

    def _reason(self, r: _Running, tok: int) -> FinishReason | None:
        return finish_reason(
            tok, r.generated, r.sampling, self.d.eos_token_ids, r.seq.num_computed + 1,
            self.d.max_context,
        )  # fmt: skip

    def _make_room(self, r: _Running) -> bool:
        """Grow ``r``'s table for its next token, preempting the newest running requests when
        the KV is full. False if ``r`` itself was preempted. Caller holds ``_cv``."""
        while not self.d.kv.grow(r.seq.block_table, r.seq.num_computed + 1):
            victim = next(reversed(self._running.values()))
            self._preempt(victim)
            if victim is r:
                return False
        return True

    def _preempt(self, r: _Running) -> None:
        """Caller holds ``_cv``."""
        self._running.pop(r.seq.request_id, None)
        self.preemptions += 1
        hashes = self._chain(r, r.seq.num_computed)
        self.d.kv.register(r.seq.block_table[: len(hashes)], hashes)
        self.d.kv.free(r.seq.block_table)
        r.seq.block_table = []
        r.preempted_at = time.monotonic()
        self._preempted.append(r)

    def _resume(self, r: _Running) -> None:
        """Recompute a preempted request's KV (prompt + output so far), if memory allows."""
        d, n = self.d, r.seq.num_computed
        toks = r.tokens[:n]
        table = d.kv.lookup_prefix(self._chain(r, n), keep_tokens=n)
        cached = len(table) * d.kv.block_tokens
        if not d.kv.grow(table, n + 1):
            d.kv.free(table)
            if time.monotonic() - r.preempted_at > PREEMPT_WAIT_S:
                with self._cv:
                    self._end(r, FinishReason.ERROR, f"out of KV memory for {PREEMPT_WAIT_S} s")
            return
        try:
            with d.compute():
                d.backend.prefill(toks, table, cached, r.sampling)  # its token is known already
        except Exception as exc:
            d.kv.free(table)
            with self._cv:
                self._end(r, FinishReason.ERROR, f"recompute after preemption failed: {exc!r}")
            return
        with self._cv:
            if r not in self._preempted:  # aborted meanwhile
                d.kv.free(table)
                return
            self._preempted.remove(r)
            r.seq.block_table = table
            self._running[r.seq.request_id] = r

    def _end(
        self, r: _Running, reason: FinishReason, error: str | None, toks: tuple[int, ...] = ()
    ) -> None:
        """The one exit of a request from the loop. Caller holds ``_cv``."""
        rid = r.seq.request_id
        self._running.pop(rid, None)
        if r in self._joining:
            self._joining.remove(r)
        if r in self._preempted:
            self._preempted.remove(r)
        if error is None and reason is not FinishReason.ABORT:
            self._keep_kv(r)
        self.d.kv.free(r.seq.block_table)
        r.seq.block_table = []
        self._emit(r, TokenChunk(rid, toks, reason, error))

    def _keep_kv(self, r: _Running) -> None:
        """Name the full blocks of prompt + answer (KV computed for ``num_computed`` tokens) so
        they stay cached here, and put the answer's blocks into the pool: the next turn of the
        conversation starts with this whole exchange as its prefix."""
        kv, bt = self.d.kv, self.d.kv.block_tokens
        hashes = self._chain(r, r.seq.num_computed)
        table = r.seq.block_table[: len(hashes)]
        kv.register(table, hashes)
        first_new = (len(r.tokens) - r.generated) // bt  # the prompt's full blocks
        if self.d.writer is not None and first_new < len(hashes):
            # Never stall the batch on the pool: skipped when the put queue is full.
            self.d.writer.put(
                hashes[first_new:], table[first_new:], block=False, tenant=r.sampling.tenant
            )

    def _chain(self, r: _Running, n: int) -> list[BlockHash]:
        """Hashes of the full blocks of ``r``'s first ``n`` tokens: the prompt's came with it,
        each later block is hashed once, when first needed after it filled."""
        bt, have = self.d.kv.block_tokens, len(r.hashes)
        full = n // bt
        if full > have:
            parent = r.hashes[-1] if have else None  # no block yet: the salted root
            salt = "" if have else r.sampling.cache_salt
            r.hashes.extend(block_hashes(r.tokens[have * bt : full * bt], bt, parent, salt))
        return r.hashes[:full]

    @staticmethod
    def _emit(r: _Running, chunk: TokenChunk) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone (shutdown)
            r.loop.call_soon_threadsafe(r.queue.put_nowait, chunk)
