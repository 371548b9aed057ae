"""The life of one request in the proxy: place it (conductor), prefill (the prefill instance
reserves the decode KV itself), then relay the decode instance's tokens. The proxy hashes the
prompt's blocks once and sends the prompt once (in the ``PrefillTask``).

``Router.run`` is an async generator of :class:`Event` s with **one terminal hook**: whatever
way it ends — finished, first token already a stop token, rejected, an instance error, the
client gone (generator closed or cancelled) — one ``finally`` calls exactly one of the
conductor's ``on_decode_done`` (the request finished decoding) or ``on_abort`` (anything else),
and, unless it finished, aborts it on both instances. The abort runs as a detached task (a
cancelled request cannot cut it short) and in a fixed order: first the prefill instance, which
answers once it writes nothing more for the request, then the decode instance, told whether
that was confirmed so it frees the reserved blocks at once or keeps them fenced.

A ``Rejected`` error (HTTP 429) can only happen before anything streamed. If an instance fails
before the first token, the request is re-placed once on the survivors (under a new attempt
id, so the instances never confuse the two attempts); after the first token it ends with an
error.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from kvcake.conductor import admission as adm
from kvcake.core.api import (
    Accept,
    DecodeTarget,
    FinishReason,
    PrefillResult,
    PrefillTask,
    Reject,
    RequestView,
    SamplingParams,
)
from kvcake.core.errors import KvcakeError
from kvcake.core.hashing import block_hashes, hash_block, salted_root
from kvcake.core.ids import InstanceId, RequestId
from kvcake.core.stats import percentile
from kvcake.engine.sampling import finish_reason
from kvcake.proxy.metrics import ProxyMetrics
from kvcake.proxy.state import LiveCluster, Pending
from kvcake.serve import attribution as attr
from kvcake.serve.wire import InstanceError, InstanceUnavailable

log = logging.getLogger(__name__)
_ids = itertools.count(1)

MARGIN_MIN_SAMPLES = 4

# Error types of a 429 (the ``type`` of the OpenAI error body).
TTFT_SLO, TBT_SLO, NO_CAPACITY = "ttft_slo", "tbt_slo", "no_capacity"
_KIND_OF_REASON = {
    adm.TTFT_SLO: TTFT_SLO,
    adm.TBT_SLO: TBT_SLO,
    adm.PREDICTED_TBT_SLO: TBT_SLO,
    adm.TBT_SLO_AFTER_PREFILL: TBT_SLO,
}


class Rejected(KvcakeError):
    """The cluster cannot serve the request within its SLOs now (HTTP 429). ``kind`` is one of
    ``ttft_slo``, ``tbt_slo``, ``no_capacity``; ``retry_after_s`` the suggested wait."""

    def __init__(self, message: str, kind: str = NO_CAPACITY, retry_after_s: float = 1.0):
        super().__init__(message)
        self.kind = kind
        self.retry_after_s = max(1, math.ceil(retry_after_s))


class NotReady(KvcakeError):
    """No healthy instance to serve the request (HTTP 503)."""


@dataclass
class Outcome:
    """What the proxy measured for one request."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int = 0
    prefill: str = ""
    decode: str = ""
    arrival: float = field(default_factory=time.perf_counter)
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    prefill_timings: dict[str, float] = field(default_factory=dict)
    predicted_ttft_s: float | None = None
    # the prediction's queue part was calibrated (queue empty, or its WaitFit had samples): only
    # such requests teach admission's TTFT margin
    calibrated: bool = True
    wall: float = field(default_factory=time.time)  # arrival, Unix time (request logs)
    gate_at: float = 0.0  # perf_counter when its prefill instance took it (queue time)
    max_tokens: int = 0
    block_hashes: tuple[Any, ...] = ()  # the prompt's full blocks
    tail_hash: Any = None  # chained hash of the partial last block (None if there is none)
    placed: attr.Placement = field(default_factory=attr.Placement)  # the index at placement
    kv: attr.Attribution | None = None  # where the prompt's KV came from
    model: str = ""
    endpoint: str = ""  # "chat" | "completions"
    stream: bool = False
    tenant: str | None = None  # set by the API-key layer when there is one

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None


@dataclass(frozen=True)
class Event:
    tokens: tuple[int, ...]
    finish: FinishReason | None = None
    error: str | None = None


@dataclass
class _Life:
    """Where a request is: set as it moves, read by the terminal hook."""

    rid: RequestId
    acc: Accept | None = None  # the decision the conductor currently tracks
    attempt_id: RequestId | None = None  # the id the instances know it by
    finished: bool = False  # decode ended normally (stop / length)
    prefilled: bool = False  # the prefill answered: nothing writes any more
    release_decode: bool = False  # finished without decoding: free the decode reservation


class Router:
    def __init__(
        self, cluster: LiveCluster, conductor: Any, metrics: ProxyMetrics, eos: tuple[int, ...]
    ):
        self.cluster = cluster
        self.conductor = conductor
        self.metrics = metrics
        self.eos = eos
        self.t0 = time.monotonic()
        self.gates: dict[InstanceId, asyncio.Semaphore] = {}
        self.reserve_wait_s = float(getattr(conductor.config, "ttft_slo_s", 30.0))
        self.expected_output = int(getattr(conductor.config, "expected_output_tokens", 256))
        self._cleanups: set[asyncio.Task[None]] = set()
        self._fitted_at = -1
        self.ttft_errors: deque[float] = deque(maxlen=256)
        self.ttft_ratios: deque[float] = deque(maxlen=64)  # measured / predicted TTFT

    def new_id(self) -> RequestId:
        return RequestId(f"req-{int(time.time() * 1000)}-{next(_ids)}")

    @property
    def in_cleanup(self) -> int:
        return len(self._cleanups)

    def _place(self, view: RequestView) -> Accept:
        if not self.cluster.alive_any():
            raise NotReady("no healthy prefill/decode instances")
        self._refresh_predictors()
        snap = self.cluster.snapshot(time.monotonic() - self.t0)
        decision = self.conductor.schedule(view, snap)
        if isinstance(decision, Reject):
            self.metrics.rejections.labels(decision.reason).inc()
            kind = _KIND_OF_REASON.get(decision.reason, NO_CAPACITY)
            slo = float(getattr(self.conductor.config, "ttft_slo_s", 30.0))
            wait = decision.expected_ttft_s - slo if kind == TTFT_SLO else 1.0
            raise Rejected(
                f"request rejected: {decision.reason} (predicted TTFT "
                f"{decision.expected_ttft_s:.2f} s, TBT {decision.expected_tbt_s:.3f} s)",
                kind, wait,
            )  # fmt: skip
        assert isinstance(decision, Accept)
        return decision

    def _refresh_predictors(self) -> None:
        """Predict with the instances' online-fitted coefficients (new after every poll)."""
        if self._fitted_at == self.cluster.polls or not hasattr(self.conductor, "set_predictors"):
            return
        self._fitted_at = self.cluster.polls
        p = self.cluster.fitted_predictors(self.conductor.predictors)
        for stage, coef, v in self.cluster.wait_gauges():  # queue / decode-KV wait fits
            self.metrics.fitted.labels(stage, coef).set(v)
        if p is not None:
            self.conductor.set_predictors(p)
            self.metrics.set_fitted(p)

    async def run(
        self, rid: RequestId, tokens: list[int], sampling: SamplingParams, out: Outcome
    ) -> AsyncIterator[Event]:
        # Salted by the tenant / cache_salt: other tenants' equal prompts share no block.
        hashes = tuple(block_hashes(tokens, self.cluster.block_tokens, salt=sampling.cache_salt))
        waited = max(0.0, time.perf_counter() - out.arrival)  # body read, tokenized (TTFT counts)
        view = RequestView(
            rid, time.monotonic() - self.t0 - waited, len(tokens), hashes,
            min(sampling.max_tokens, self.expected_output),
        )  # fmt: skip
        self.metrics.prompt_tokens.inc(len(tokens))
        self.metrics.prefix_queries.inc(len(tokens))
        self._describe(out, tokens, hashes, sampling)
        life = _Life(rid)
        try:
            result = None
            for attempt in range(2):
                life.acc = self._place(view)
                limit = (len(tokens) - 1) // self.cluster.block_tokens
                out.placed = attr.placement(self.cluster.kv_index, hashes, life.acc.prefill, limit)
                life.attempt_id = rid if attempt == 0 else RequestId(f"{rid}.{attempt}")
                try:
                    result = await self._prefill(life, tokens, hashes, sampling, out)
                    break
                except InstanceUnavailable as exc:
                    self._on_failure(life.acc, exc)
                    self._end(life)  # this attempt: abort hook + cleanup on the instances
                    if attempt == 1:
                        raise
            assert result is not None and life.acc is not None
            life.prefilled = True
            out.cached_tokens = result.cached_tokens
            self.metrics.prefix_hits.inc(result.cached_tokens)
            out.kv = self._attribute(out, result)
            self.conductor.on_prefill_done(rid, time.monotonic() - self.t0)
            async for ev in self._decode(life, result, sampling, out):
                yield ev
        finally:
            self._end(life)

    def _describe(
        self, out: Outcome, tokens: list[int], hashes: tuple[Any, ...], sampling: SamplingParams
    ) -> None:
        out.block_hashes, out.max_tokens = hashes, sampling.max_tokens
        tail = len(tokens) % self.cluster.block_tokens
        if tail:
            root = salted_root(sampling.cache_salt)
            out.tail_hash = hash_block(hashes[-1] if hashes else root, tokens[-tail:])

    def _attribute(self, out: Outcome, result: PrefillResult) -> attr.Attribution:
        n, bt = out.prompt_tokens, self.cluster.block_tokens
        if result.kv_sources:
            mem = getattr(self.cluster.kv_index, "evictions", None)  # attr.tracking_index
            a = attr.attribute(n, bt, out.block_hashes, result.kv_sources, out.placed,
                               (lambda h: h in mem) if mem is not None else (lambda h: False))  # fmt: skip
        else:
            a = attr.fallback(n, result.cached_tokens)
        self.metrics.record_attribution(a)
        return a

    def _end(self, life: _Life) -> None:
        """The terminal hook: exactly one conductor hook per accepted attempt, and the
        instances' cleanup unless it finished."""
        acc, aid = life.acc, life.attempt_id
        life.acc = None
        if acc is None or aid is None:
            return  # rejected (nothing tracked) or already ended
        # The conductor knows the request by its id, the instances by the attempt's.
        if life.finished:
            self.conductor.on_decode_done(life.rid, time.monotonic() - self.t0)
            if life.release_decode:
                self._spawn(self._abort(acc, aid, True))
            return
        self.conductor.on_abort(life.rid)
        self._spawn(self._abort(acc, aid, life.prefilled))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _abort(self, acc: Accept, aid: RequestId, prefilled: bool) -> None:
        """Prefill first (its answer fences the writes), then decode."""
        p = self.cluster.instances.get(acc.prefill)
        d = self.cluster.instances.get(acc.decode)
        try:
            stopped = prefilled
            if p is not None and not prefilled:
                stopped = await p.abort(aid)
            if d is not None and (d is not p or prefilled):
                await d.abort(aid, writer_stopped=stopped)
        except Exception:  # cleanup must never raise into the event loop
            log.exception("aborting %s failed", aid)

    async def _prefill(
        self, life: _Life, tokens: list[int], hashes: tuple[Any, ...], sampling: SamplingParams,
        out: Outcome,
    ) -> PrefillResult:  # fmt: skip
        acc, rid = life.acc, life.attempt_id
        assert acc is not None and rid is not None
        p = self.cluster.instances[acc.prefill]
        d = self.cluster.instances[acc.decode]
        out.prefill, out.decode = str(acc.prefill), str(acc.decode)
        out.predicted_ttft_s = acc.expected_ttft_s + max(0.0, time.perf_counter() - out.arrival)
        out.calibrated = self.cluster.queue_calibrated(acc.prefill)
        pend = self.cluster.pending.setdefault(acc.decode, Pending())
        pend.requests += 1
        pend.tokens += len(tokens)
        ppend = self.cluster.pending.setdefault(acc.prefill, Pending())
        cached = sum(f.num_blocks for f in acc.fetch) + acc.local_prefix_blocks
        cached = min(cached * self.cluster.block_tokens, len(tokens))
        predicted = float(self.conductor.predictors.prefill.time(len(tokens), cached))
        t_enq = time.monotonic()
        ahead = ppend.queued_seconds(t_enq)  # predicted work ahead: the wait fit's input
        ppend.prefill_s += predicted
        ppend.prefill_requests += 1
        self.metrics.waiting.inc()
        # The prefill queue is held here (the one source of truth the snapshot reads): decode
        # KV is then reserved only when the prefill is about to run, so queued requests do not
        # pin decode memory, and a reservation is young when its writer starts.
        gate = self.gates.setdefault(acc.prefill, asyncio.Semaphore(1))
        try:
            async with gate:
                t_gate = time.monotonic()
                out.gate_at = time.perf_counter()
                self.cluster.record_wait(acc.prefill, ahead, t_gate - t_enq)
                ppend.running_since, ppend.running_pred = t_gate, predicted
                try:
                    result = await self._submit(p, d, acc, rid, tokens, hashes, sampling)
                    if acc.prefill != acc.decode:  # the prefill reserved the decode KV first
                        waited = result.timings.get("decode_wait_s", 0.0)
                        self.cluster.record_decode_wait(acc.decode, waited)
                        t_gate += waited  # the service fit: prefill, not the decode-KV wait
                finally:
                    ppend.running_since = 0.0
                self.cluster.record_service(
                    acc.prefill, len(tokens), result.cached_tokens, time.monotonic() - t_gate,
                    self.conductor.predictors.prefill.coefficients,
                )  # fmt: skip
            # What the instance measured of the prefill itself (the decode-KV wait went above).
            out.prefill_timings = {k: v for k, v in result.timings.items() if k != "decode_wait_s"}
            return result
        finally:
            pend.requests -= 1
            pend.tokens -= len(tokens)
            ppend.prefill_requests -= 1
            # Reset when the queue empties so float rounding cannot accumulate.
            ppend.prefill_s = (
                max(0.0, ppend.prefill_s - predicted) if ppend.prefill_requests else 0.0
            )
            self.metrics.waiting.dec()

    async def _decode(
        self, life: _Life, result: PrefillResult, sampling: SamplingParams, out: Outcome
    ) -> AsyncIterator[Event]:
        acc, rid = life.acc, life.attempt_id
        assert acc is not None and rid is not None
        d = self.cluster.instances[acc.decode]
        first = result.first_token
        out.token_times.append(time.perf_counter())
        self._record_ttft_error(out)
        reason = finish_reason(first, 1, sampling, self.eos)
        if reason is FinishReason.STOP:  # the stop token is not output
            life.finished = life.release_decode = True  # the hook frees the reservation
            yield Event((), FinishReason.STOP)
            return
        yield Event((first,))
        self.metrics.running.inc()
        try:
            stream = d.stream_tokens(rid, first)
            async for chunk in stream:
                if chunk.token_ids:
                    now = time.perf_counter()
                    out.token_times.extend([now] * len(chunk.token_ids))
                if chunk.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
                    life.finished = True
                yield Event(chunk.token_ids, chunk.finish_reason, chunk.error)
                if chunk.finish_reason is not None:
                    return
        except InstanceError as exc:
            self._on_failure(acc, exc, decode_only=True)
            yield Event((), FinishReason.ERROR, f"decode instance failed mid-stream: {exc}")
        finally:
            self.metrics.running.dec()

    def _record_ttft_error(self, out: Outcome) -> None:
        ttft, pred = out.ttft, out.predicted_ttft_s
        if ttft and pred is not None and ttft > 0:
            err = abs(pred - ttft) / ttft
            self.ttft_errors.append(err)
            self.metrics.ttft_prediction_error.observe(err)
            median = percentile(self.ttft_errors, 50, method="higher")
            self.metrics.ttft_prediction_error_median.set(median)
            if pred > 0 and out.calibrated:
                self.ttft_ratios.append(ttft / pred)
                self._update_margin()

    def _update_margin(self) -> None:
        """Admission's TTFT margin: the 90th percentile of measured / predicted TTFT of recent
        requests (>= 1, <= 3), once there are a few — predictions that ran short on this
        cluster lately are trusted that much less."""
        if len(self.ttft_ratios) < MARGIN_MIN_SAMPLES or not hasattr(
            self.conductor, "set_ttft_margin"
        ):
            return
        margin = min(3.0, max(1.0, percentile(self.ttft_ratios, 90, method="lower")))
        self.conductor.set_ttft_margin(margin)
        self.metrics.ttft_margin.set(margin)

    async def _submit(
        self,
        p: Any,
        d: Any,
        acc: Accept,
        rid: RequestId,
        tokens: list[int],
        hashes: tuple[Any, ...],
        sampling: SamplingParams,
    ) -> PrefillResult:
        """The prefill task: the prompt, once. A disaggregated one names its decode instance,
        where the prefill instance reserves the prompt plus a margin (the decode loop grows it
        with the answer), waiting while that KV is full — up to the TTFT SLO, then a reject
        (``no_capacity``)."""
        target = None
        if acc.prefill != acc.decode:
            margin = min(sampling.max_tokens, self.cluster.block_tokens)
            target = DecodeTarget(acc.decode, d.url, len(tokens) + margin, self.reserve_wait_s)
        task = PrefillTask(rid, tuple(tokens), hashes, sampling, acc.fetch, target)
        try:
            result: PrefillResult = await p.submit_prefill(task)
        except InstanceError as exc:
            if exc.kind != "kv_full":
                raise
            self.metrics.rejections.labels("decode_kv_full").inc()
            raise Rejected(f"decode KV memory full: {exc}", NO_CAPACITY) from exc
        return result

    def _on_failure(self, acc: Accept, exc: Exception, decode_only: bool = False) -> None:
        """Stop routing to the instance that failed (the poller revives it if it answers)."""
        iid = getattr(exc, "instance", None) or (acc.decode if decode_only else None)
        if isinstance(exc, InstanceUnavailable) and iid:
            self.cluster.mark_dead(InstanceId(iid), str(exc))
