"""One inference instance: ``core.api.InstanceAPI`` over an engine backend.

Threads and ownership: the asyncio loop answers RPCs; one *prefill thread* runs prefills one at a
time; one *decode thread* runs continuous-batching iterations. The backend's compute is called by
those two threads only, and never concurrently on a colocated (``both``) instance — there they
share ``compute_lock``, so a prefill stalls decoding exactly as in a vLLM-like server.

The KV blocks have one owner, :class:`~kvcake.instance.kvblocks.KVBlocks` (its own leaf lock,
reservations, fences, KV events); the prefill worker and the decode loop get narrow
dependencies (``PrefillDeps`` / ``DecodeDeps``), never the instance. KV memory is owned by the
backend (a Transfer Engine segment when a directory is configured); blocks reserved for a
request stay allocated until it finishes, is aborted (and its writer has stopped) or its
reservation expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvcake.core.api import (
    InstanceAPI,
    KVEvent,
    KVEventKind,
    KVReservation,
    LoadReport,
    PrefillResult,
    PrefillTask,
    Role,
    SamplingParams,
    TokenChunk,
    segment_of,
)
from kvcake.core.errors import EngineError
from kvcake.core.ids import BlockHash, InstanceId, RequestId
from kvcake.engine.backend import DecodeSeq, EngineBackend
from kvcake.engine.block_manager import KVCacheFull
from kvcake.instance.decode_loop import DecodeDeps, DecodeLoop
from kvcake.instance.kvblocks import KVBlocks, Prompt
from kvcake.instance.kvlink import KVLink
from kvcake.instance.peers import HttpPeers
from kvcake.instance.prefill_worker import AbortLog, PrefillDeps, PrefillWorker, tokens_in_vocab
from kvcake.instance.store_glue import PoolWriter
from kvcake.serve.online_fit import OnlineFit
from kvcake.serve.wire import BadRequest, InstanceError, InstanceInfo, InstanceUnavailable

FIRST_WARMUP_TOKEN = 300  # an ordinary token id in every vocabulary the backends use


class _Metrics:
    def __init__(self, role: Role) -> None:
        r = self.registry = CollectorRegistry()
        self.prefill_s = Histogram("kvcake_instance_prefill_seconds", "Prefill compute", registry=r)
        self.step_s = Histogram(
            "kvcake_instance_decode_step_seconds", "Decode iteration", registry=r,
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
        )  # fmt: skip
        self.cached_tokens = Counter("kvcake_instance_cached_tokens", "Reused", registry=r)
        self.computed_tokens = Counter("kvcake_instance_computed_tokens", "Computed", registry=r)
        self.generated = Counter("kvcake_instance_generated_tokens", "Decoded", registry=r)
        self.kv_used = Gauge("kvcake_instance_kv_blocks_used", "KV blocks in use", registry=r)
        self.running = Gauge("kvcake_instance_running_requests", "Decoding", registry=r)
        self.queued = Gauge("kvcake_instance_queued_requests", "Waiting for prefill", registry=r)
        self.role = role


class Instance(InstanceAPI):
    def __init__(
        self,
        instance_id: InstanceId,
        role: Role,
        backend: EngineBackend,
        *,
        transfer: Any = None,  # kvcake.transfer.TransferEngine, None = no KV streaming
        pool: Any = None,  # kvcake.instance.kvlink.PoolLink, None = no store
        max_batch: int = 32,
        max_context: int = 8192,
        vocab_size: int = 49152,
        eos_token_ids: tuple[int, ...] = (),
        model_name: str = "",
        dtype: str = "float32",
    ):
        self.instance_id = instance_id
        self.role = role
        self.backend = backend
        self.transfer = transfer
        self.segment = segment_of(instance_id)
        self.max_context = max_context
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.model_name = model_name or backend.model_name
        self.dtype = dtype
        self.compute_lock = threading.Lock() if role is Role.BOTH else None
        self.metrics = _Metrics(role)
        self.metrics_registry = self.metrics.registry
        self.kv = KVBlocks(backend.blocks, backend.block_tokens, instance_id)
        self.time_scale = float(getattr(getattr(backend, "cfg", None), "time_scale", 1.0))
        cm, ts = backend.cost_model, self.time_scale
        self.fit = OnlineFit(
            type(cm.prefill)(cm.prefill.c0 * ts, cm.prefill.c1 * ts, cm.prefill.c2 * ts),
            type(cm.decode)(cm.decode.d0 * ts, cm.decode.d1 * ts, cm.decode.d2 * ts),
        )
        self.aborted = AbortLog()
        self.draining = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.writer = None
        if pool is not None:
            self.writer = PoolWriter(
                pool, self.kv, backend.memory.block_view, backend.layout.num_blocks // 4,
                name=f"put-{instance_id}",
            )  # fmt: skip
        link = None
        if transfer is not None:
            link = KVLink(transfer, self.segment, backend.layout)
        self.link = link
        self.prefill = PrefillWorker(PrefillDeps(
            str(instance_id), backend, self.kv, self.compute, self.aborted, self.metrics,
            self.fit, max_context, vocab_size, self.time_scale, link, pool, self.writer,
            HttpPeers() if link is not None else None,
        ))  # fmt: skip
        self.decoder = DecodeLoop(DecodeDeps(
            str(instance_id), backend, self.kv, self.compute, self.metrics, self.fit,
            eos_token_ids, max_context, self.writer,
        ), max_batch)  # fmt: skip

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self.role is not Role.PREFILL:
            self.decoder.start()

    def close(self) -> None:
        self.decoder.stop()
        self.prefill.close()
        if self.writer is not None:
            self.writer.close()
        if self.link is not None:
            self.link.close()

    def warm_up(self, max_tokens: int) -> None:
        """Measure this machine: a few prefills of growing length (up to ``max_tokens``) and
        decode steps of growing batch, recorded as the online fit's first samples. Blocks are
        unnamed and freed again; nothing is cached."""
        n_max = min(
            max_tokens, self.max_context - 1, (self.kv.capacity // 2) * self.kv.block_tokens
        )
        if n_max < 8:
            return
        sizes = sorted({max(8, n_max // 16), max(8, n_max // 4), max(8, n_max // 2), n_max})
        sp = SamplingParams(max_tokens=1)
        self._timed_prefill(8, sp, record=False)  # first call pays one-off costs
        for n in sizes:
            self._timed_prefill(n, sp, record=True)
        if self.role is not Role.PREFILL:
            # Batch and context varied independently, so the fit can tell the two terms apart.
            small, large = max(8, n_max // 8), max(8, n_max // 2)
            for batch, ctx in ((1, small), (4, small), (8, small), (2, large), (1, large)):
                self._timed_decode(batch, ctx, sp)

    def _timed_prefill(self, n: int, sp: SamplingParams, record: bool) -> None:
        table = self.kv.allocate(self.kv.blocks_for(n))
        try:
            t0 = time.perf_counter()
            with self.compute():
                self.backend.prefill([FIRST_WARMUP_TOKEN] * n, table, 0, sp)
            if record:
                self.fit.add_prefill(n, 0, time.perf_counter() - t0)
        finally:
            self.kv.free(table)

    def _timed_decode(self, batch: int, ctx: int, sp: SamplingParams) -> None:
        seqs = []
        try:
            for i in range(batch):
                table = self.kv.allocate(self.kv.blocks_for(ctx + 1))
                seqs.append(DecodeSeq(RequestId(f"warmup-{i}"), table, ctx, FIRST_WARMUP_TOKEN, sp))
            t0 = time.perf_counter()
            with self.compute():
                self.backend.decode(seqs)
            self.fit.add_decode(batch, sum(s.context_len for s in seqs), time.perf_counter() - t0)
        except EngineError:
            pass  # not enough memory for this batch: fewer samples
        finally:
            for s in seqs:
                self.kv.free(s.block_table)

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background, keeping a reference until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def info(self) -> InstanceInfo:
        cm = self.backend.cost_model
        return InstanceInfo(
            instance_id=self.instance_id,
            role=self.role,
            model=self.model_name,
            block_tokens=self.backend.block_tokens,
            kv_bytes_per_token=self.backend.layout.kv_bytes_per_token,
            kv_blocks_total=self.backend.layout.num_blocks,
            max_context=self.max_context,
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_token_ids,
            calibration={
                "prefill": [cm.prefill.c0, cm.prefill.c1, cm.prefill.c2],
                "decode": [cm.decode.d0, cm.decode.d1, cm.decode.d2],
                "source": cm.source,
                "time_scale": self.time_scale,
            },
        )

    # --- InstanceAPI ---------------------------------------------------------------------------
    async def reserve_kv(
        self,
        request_id: RequestId,
        num_tokens: int,
        prompt_tokens: tuple[int, ...],
        block_hashes: tuple[BlockHash, ...],
        sampling: SamplingParams,
    ) -> KVReservation:
        self._check_accepting(Role.DECODE)
        n = len(prompt_tokens)
        if not 1 <= n <= num_tokens <= self.max_context:
            raise BadRequest(f"need 1 <= prompt ({n}) <= num_tokens ({num_tokens}) "
                             f"<= {self.max_context}")  # fmt: skip
        if not tokens_in_vocab(prompt_tokens, self.vocab_size):
            raise BadRequest(f"token ids must be in [0, {self.vocab_size})")
        if len(block_hashes) != n // self.kv.block_tokens:  # checked by the prefill instance
            raise BadRequest("block_hashes must name every full block of the prompt")
        if request_id in self.aborted:  # the abort overtook the reservation
            raise InstanceError(f"request {request_id} was aborted", 409, "aborted")
        try:
            blocks = self.kv.reserve(request_id, num_tokens,
                                     Prompt(prompt_tokens, block_hashes, sampling))  # fmt: skip
        except KVCacheFull:
            raise
        except EngineError as exc:
            raise BadRequest(str(exc)) from exc
        lay = self.backend.layout
        return KVReservation(
            request_id, self.instance_id, self.segment, tuple(blocks), lay.block_tokens,
            lay.block_bytes, lay.layer_bytes, lay.name,
        )  # fmt: skip

    async def submit_prefill(self, task: PrefillTask) -> PrefillResult:
        self._check_accepting(Role.PREFILL)
        if task.decode is not None and self.transfer is None:
            raise InstanceError("this instance has no Transfer Engine (no directory configured)")
        return await self.prefill.submit(task)

    def check_stream(self, request_id: RequestId) -> None:
        """Validate a stream call before the HTTP response starts."""
        if self.role is Role.PREFILL:
            raise InstanceError("a prefill instance does not decode", 400, "wrong_role")
        if not self.kv.owns(request_id):
            raise InstanceError(f"no KV for request {request_id} on {self.instance_id}", 409)

    async def stream_tokens(
        self, request_id: RequestId, first_token: int
    ) -> AsyncIterator[TokenChunk]:
        taken = self.kv.take(request_id)
        if taken is None:
            raise InstanceError(f"no KV for request {request_id}", 409)
        table, prompt = taken
        queue = self.decoder.join(request_id, table, prompt, first_token)
        while True:
            chunk = await queue.get()
            yield chunk
            if chunk.finish_reason is not None:
                return

    async def abort(self, request_id: RequestId, writer_stopped: bool = True) -> bool:
        """End ``request_id`` here, whatever stage it is in. Returns whether this instance
        writes nothing more for it (a prefill in progress has stopped and its writes resolved).
        ``writer_stopped``: the request's prefill (elsewhere) confirmed it stopped writing into
        this instance's reservation, so the blocks may be reused at once (else they are fenced).
        """
        stopped = True
        if self.role is not Role.DECODE:
            stopped = await self.prefill.abort(request_id)
        if self.role is not Role.PREFILL:
            self.aborted.add(request_id)
            colocated_stopped = stopped if self.role is Role.BOTH else writer_stopped
            self.kv.release(request_id, colocated_stopped)
            self.decoder.abort(request_id)
        return stopped

    async def drain(self) -> None:
        self.draining = True
        while self.prefill.busy() or self.decoder.busy():
            await asyncio.sleep(0.05)

    def load_report(self) -> LoadReport:
        self.kv.expire()
        used, total = self.kv.num_used, self.kv.capacity
        q_req, q_tok, q_s = self.prefill.queue_stats()
        running, ctx = self.decoder.stats()
        self.metrics.kv_used.set(used)
        self.metrics.running.set(running)
        self.metrics.queued.set(q_req)
        return LoadReport(
            instance_id=self.instance_id,
            role=self.role,
            timestamp=time.time(),
            queued_requests=q_req,
            queued_prefill_tokens=q_tok,
            queued_prefill_seconds=q_s,
            running_requests=running,
            running_context_tokens=ctx,
            kv_blocks_used=used,
            kv_blocks_total=total,
            recent_ttft_s=self.prefill.recent_s,
            recent_tbt_s=self.decoder.recent_tbt_s,
            healthy=not self.draining,
            preemptions=self.decoder.preemptions,
        )

    def kv_events(self, since_seq: int) -> list[KVEvent]:
        return self.kv.events_since(since_seq)

    def event_bounds(self) -> tuple[int, int]:
        return self.kv.event_bounds()

    def pool_event(self, kind: KVEventKind, hashes: list[Any]) -> None:
        self.kv.pool_event(kind, hashes)

    def kv_check(self) -> dict[str, int]:
        """The block accounting, checked (``GET /rpc/kv``; tests assert on it)."""
        out = self.kv.check()
        running, _ = self.decoder.stats()
        q_req, _, _ = self.prefill.queue_stats()
        out.update(
            running=running, prefill_queued=q_req, aborted_ids=len(self.aborted),
            preemptions=self.decoder.preemptions,
            pinned_by_puts=self.writer.pinned if self.writer is not None else 0,
        )  # fmt: skip
        return out

    # --- helpers -------------------------------------------------------------------------------
    def _check_accepting(self, role: Role) -> None:
        if self.draining:
            raise InstanceUnavailable(f"{self.instance_id} is draining")
        if self.role is not Role.BOTH and self.role is not role:
            raise InstanceError(
                f"{self.instance_id} is a {self.role.value} instance, not {role.value}", 400,
                "wrong_role",
            )  # fmt: skip

    def compute(self) -> contextlib.AbstractContextManager[Any]:
        return self.compute_lock if self.compute_lock is not None else contextlib.nullcontext()
