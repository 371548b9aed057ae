"""Continuous batching with chunked prefill and local prefix caching, over any backend.

Each :meth:`Scheduler.step` runs at most one prefill chunk (``prefill_chunk`` tokens of the
oldest waiting request) and then one decode iteration over every running request, so requests
join and leave the batch between iterations and a long prompt never stalls decoding for more
than one chunk. When KV blocks run out during decode, the newest running request is preempted
(its blocks freed; it is recomputed later from its prompt plus the tokens it already produced).

Block ownership: a request holds one reference on every block of its table from admission until
it finishes; full blocks are registered under their ``core.hashing`` key as soon as their KV is
complete, so later requests reuse them (and they stay cached, LRU-evictable, after release).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from kvcake.core.api import FinishReason, SamplingParams
from kvcake.core.errors import EngineError
from kvcake.core.ids import RequestId
from kvcake.engine.backend import DecodeSeq, EngineBackend
from kvcake.engine.block_manager import KVCacheFull
from kvcake.engine.sampling import finish_reason


@dataclass
class Request:
    request_id: RequestId
    prompt: list[int]
    sampling: SamplingParams
    arrival: float = field(default_factory=time.perf_counter)
    output: list[int] = field(default_factory=list)
    table: list[int] = field(default_factory=list)
    done_tokens: int = 0  # prompt positions whose KV is computed (during prefill)
    cached_tokens: int = 0
    seq: DecodeSeq | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def tokens(self) -> list[int]:
        """What must be in the KV before decoding: the prompt plus output kept over preemption."""
        return self.prompt + self.output


class Scheduler:
    def __init__(
        self,
        backend: EngineBackend,
        max_batch: int = 32,
        prefill_chunk: int = 1024,
        prefix_caching: bool = True,
    ) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.prefix_caching = prefix_caching
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[Request] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> list[Request]:
        """One iteration; returns the requests that finished in it."""
        done: list[Request] = []
        if self.waiting and len(self.running) < self.max_batch:
            self._prefill_chunk(self.waiting[0], done)
        if self.running:
            self._decode(done)
        self.finished.extend(done)
        return done

    # --- prefill ---------------------------------------------------------------------------
    def _admit(self, req: Request) -> bool:
        """Take cached prefix blocks and allocate the rest; False if memory is short now."""
        be, toks = self.backend, req.tokens
        hashes = be.block_hashes(toks) if self.prefix_caching else []
        cached = be.lookup_prefix(hashes)
        need = be.blocks_needed(len(toks)) - len(cached)
        try:
            fresh = be.allocate_blocks(need)
        except KVCacheFull:
            be.free_blocks(cached)
            if not self.running:
                raise
            return False
        req.table = cached + fresh
        req.cached_tokens = req.done_tokens = min(len(cached) * be.block_tokens, len(toks))
        return True

    def _prefill_chunk(self, req: Request, done: list[Request]) -> None:
        be = self.backend
        if not req.table:
            try:
                if not self._admit(req):
                    return
            except (KVCacheFull, EngineError) as exc:
                self.waiting.popleft()
                self._finish(req, FinishReason.ERROR, done, str(exc))
                return
        toks = req.tokens
        end = min(len(toks), req.done_tokens + self.prefill_chunk)
        try:
            tok = be.prefill(toks[:end], req.table, req.done_tokens, req.sampling)
        except EngineError as exc:
            self.waiting.popleft()
            self._finish(req, FinishReason.ERROR, done, str(exc))
            return
        req.done_tokens = end
        if end < len(toks):
            return
        self.waiting.popleft()
        self._register(req, len(toks))
        if req.first_token_time is None:
            req.first_token_time = time.perf_counter()
        req.seq = DecodeSeq(req.request_id, req.table, len(toks), tok, req.sampling)
        self.running.append(req)
        self._emit(req, tok, done)

    def _register(self, req: Request, num_tokens: int) -> None:
        if self.prefix_caching:
            toks = req.tokens[:num_tokens]
            self.backend.register_blocks(req.table, self.backend.block_hashes(toks))

    # --- decode ----------------------------------------------------------------------------
    def _decode(self, done: list[Request]) -> None:
        be = self.backend
        batch: list[Request] = []
        for req in list(self.running):
            if req not in self.running:
                continue  # preempted below to make room for an earlier request
            assert req.seq is not None
            while True:
                try:
                    be.ensure_capacity(req.seq.block_table, req.seq.num_computed + 1)
                    break
                except KVCacheFull:
                    victim = self.running[-1]
                    if victim is req:
                        self._preempt(req)
                        break
                    self._preempt(victim)
            if req in self.running:
                batch.append(req)
        if not batch:
            return
        seqs = [r.seq for r in batch if r.seq is not None]
        tokens = be.decode(seqs)
        for req, tok in zip(batch, tokens, strict=True):
            self._emit(req, tok, done)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.backend.free_blocks(req.table)
        req.table, req.seq, req.done_tokens = [], None, 0
        self.waiting.appendleft(req)

    def _emit(self, req: Request, tok: int, done: list[Request]) -> None:
        req.output.append(tok)
        eos = () if self.backend.eos_token_id is None else (self.backend.eos_token_id,)
        reason = finish_reason(tok, len(req.output), req.sampling, eos)
        if reason is not None:
            self._finish(req, reason, done)

    def _finish(
        self, req: Request, reason: FinishReason, done: list[Request], error: str | None = None
    ) -> None:
        if req in self.running:
            self.running.remove(req)
        if req.seq is not None:
            self._register(req, req.seq.num_computed)
        if req.table:
            self.backend.free_blocks(req.table)
        req.table, req.seq = [], None
        req.finish_reason, req.error = reason, error
        req.finish_time = time.perf_counter()
        done.append(req)

    def abort(self, request_id: RequestId) -> None:
        for req in [*self.running, *self.waiting]:
            if req.request_id == request_id:
                if req in self.waiting:
                    self.waiting.remove(req)
                self._finish(req, FinishReason.ABORT, self.finished)
