"""Continuous-batching decode on a dedicated thread.

A request joins once its prompt KV is complete (the proxy calls ``stream_tokens`` only after the
prefill instance confirmed every KV write). Each iteration takes up to ``max_batch`` running
sequences, grows their block tables when a new block is needed, runs one backend decode step and
hands every new token to the request's asyncio queue. Requests leave between iterations when they
finish (max_tokens, EOS, a stop id), are aborted, or cannot get a KV block (error).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvcake.core.api import FinishReason, SamplingParams, TokenChunk
from kvcake.core.errors import EngineError
from kvcake.core.hashing import block_hashes
from kvcake.core.ids import RequestId
from kvcake.engine.backend import DecodeSeq

if TYPE_CHECKING:
    from kvcake.serve.instance import Instance


@dataclass
class _Running:
    seq: DecodeSeq
    queue: asyncio.Queue[TokenChunk]
    loop: asyncio.AbstractEventLoop
    sampling: SamplingParams
    generated: int = 1  # the first token came from prefill
    tokens: list[int] | None = None  # prompt + output, when the proxy sent the prompt


class DecodeLoop:
    def __init__(self, inst: Instance, max_batch: int):
        self.inst = inst
        self.max_batch = max_batch
        self._cv = threading.Condition()
        self._joining: deque[_Running] = deque()
        self._running: dict[RequestId, _Running] = {}
        self._aborts: set[RequestId] = set()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.recent_tbt_s = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._main, name=f"decode-{self.inst.instance_id}", daemon=True
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
            return bool(self._joining or self._running)

    def stats(self) -> tuple[int, int]:
        with self._cv:
            rs = list(self._running.values()) + list(self._joining)
        return len(rs), sum(r.seq.context_len for r in rs)

    def join(
        self,
        rid: RequestId,
        table: list[int],
        prompt_len: int,
        first_token: int,
        sampling: SamplingParams,
        prompt_tokens: tuple[int, ...] = (),
    ) -> asyncio.Queue[TokenChunk]:
        queue: asyncio.Queue[TokenChunk] = asyncio.Queue()
        seq = DecodeSeq(rid, table, prompt_len, first_token, sampling)
        run = _Running(seq, queue, asyncio.get_running_loop(), sampling)
        if prompt_tokens:
            run.tokens = [*prompt_tokens, first_token]
        reason = self._finish_reason(run, first_token)
        if reason is not None:  # the prefill's token already ends it
            self._release(run.seq)
            queue.put_nowait(TokenChunk(rid, (), reason))
            return queue
        with self._cv:
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
                while not self._stop and not self._joining and not self._running:
                    self._cv.wait(0.5)
                if self._stop:
                    break
                while self._joining and len(self._running) < self.max_batch:
                    r = self._joining.popleft()
                    self._running[r.seq.request_id] = r
                for rid in self._aborts & set(self._running):
                    self._end(self._running[rid], FinishReason.ABORT, None)
                for r in [r for r in self._joining if r.seq.request_id in self._aborts]:
                    self._joining.remove(r)
                    self._end(r, FinishReason.ABORT, None)
                self._aborts.clear()
                batch = list(self._running.values())
            if batch:
                self._step(batch)
        with self._cv:
            for r in [*self._running.values(), *self._joining]:
                self._end(r, FinishReason.ERROR, "instance shutting down")

    def _step(self, batch: list[_Running]) -> None:
        inst = self.inst
        ok: list[_Running] = []
        with inst.mu:
            for r in batch:
                try:
                    inst.backend.ensure_capacity(r.seq.block_table, r.seq.num_computed + 1)
                    ok.append(r)
                except EngineError as exc:
                    with self._cv:
                        self._end(r, FinishReason.ERROR, f"out of KV memory: {exc}")
        if not ok:
            return
        t0 = time.perf_counter()
        try:
            with inst.compute():
                tokens = inst.backend.decode([r.seq for r in ok])
        except Exception as exc:
            with self._cv:
                for r in ok:
                    self._end(r, FinishReason.ERROR, f"decode failed: {exc!r}")
            return
        dt = time.perf_counter() - t0
        self.recent_tbt_s = 0.8 * self.recent_tbt_s + 0.2 * dt if self.recent_tbt_s else dt
        inst.metrics.step_s.observe(dt)
        inst.metrics.generated.inc(len(ok))
        with self._cv:
            for r, tok in zip(ok, tokens, strict=True):
                r.seq.last_token = tok
                r.generated += 1
                if r.tokens is not None:
                    r.tokens.append(tok)
                reason = self._finish_reason(r, tok)
                if reason is FinishReason.STOP:  # the stop token itself is not output
                    self._end(r, reason, None)
                elif reason is not None:
                    self._end(r, reason, None, (tok,))
                else:
                    self._emit(r, TokenChunk(r.seq.request_id, (tok,)))

    def _finish_reason(self, r: _Running, tok: int) -> FinishReason | None:
        s = r.sampling
        if not s.ignore_eos and (tok in self.inst.eos_token_ids or tok in s.stop_token_ids):
            return FinishReason.STOP
        if r.generated >= s.max_tokens:
            return FinishReason.LENGTH
        if r.seq.num_computed + 1 >= self.inst.max_context:
            return FinishReason.LENGTH
        return None

    def _end(
        self, r: _Running, reason: FinishReason, error: str | None, toks: tuple[int, ...] = ()
    ) -> None:
        """Caller holds ``_cv``."""
        self._running.pop(r.seq.request_id, None)
        if error is None and reason is not FinishReason.ABORT and r.tokens is not None:
            self._keep_kv(r)
        self._release(r.seq)
        self._emit(r, TokenChunk(r.seq.request_id, toks, reason, error))

    def _keep_kv(self, r: _Running) -> None:
        """Name the full blocks of prompt + answer (KV computed for ``num_computed`` tokens) so
        they stay cached here, and put the answer's blocks into the pool: the next turn of the
        conversation starts with this whole exchange as its prefix."""
        assert r.tokens is not None
        be = self.inst.backend
        hashes = block_hashes(r.tokens[: r.seq.num_computed], be.block_tokens)
        table = r.seq.block_table[: len(hashes)]
        with self.inst.mu:
            be.register_blocks(table, hashes)
        first_new = len(r.tokens) - r.generated  # prompt length
        self.inst.prefill.put_async(hashes[first_new // be.block_tokens :],
                                    table[first_new // be.block_tokens :])  # fmt: skip

    def _release(self, seq: DecodeSeq) -> None:
        with self.inst.mu:
            self.inst.backend.free_blocks(seq.block_table)
        seq.block_table = []

    @staticmethod
    def _emit(r: _Running, chunk: TokenChunk) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone (shutdown)
            r.loop.call_soon_threadsafe(r.queue.put_nowait, chunk)
