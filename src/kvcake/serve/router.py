"""The life of one request in the proxy: place it (conductor), reserve decode KV, prefill,
then relay the decode instance's tokens.

``Router.run`` is an async generator of :class:`Event` s. A ``Rejected`` error (HTTP 429) can
only happen before anything streamed. If an instance fails before the first token, the request is
re-placed once on the survivors; after the first token it ends with an error. Closing the
generator (the client went away) aborts the request on both instances, freeing its KV.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from kvcake.core.api import (
    Accept,
    FinishReason,
    PrefillResult,
    PrefillTask,
    Reject,
    RequestView,
    SamplingParams,
)
from kvcake.core.errors import KvcakeError
from kvcake.core.hashing import block_hashes
from kvcake.core.ids import InstanceId, RequestId
from kvcake.serve.metrics import ProxyMetrics
from kvcake.serve.state import LiveCluster, Pending
from kvcake.serve.wire import InstanceError, InstanceUnavailable

log = logging.getLogger(__name__)
_ids = itertools.count(1)


class Rejected(KvcakeError):
    """The conductor predicts the request would miss its SLOs (HTTP 429)."""


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

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None


@dataclass(frozen=True)
class Event:
    tokens: tuple[int, ...]
    finish: FinishReason | None = None
    error: str | None = None


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

    def new_id(self) -> RequestId:
        return RequestId(f"req-{int(time.time() * 1000)}-{next(_ids)}")

    def _place(self, view: RequestView) -> Accept:
        if not self.cluster.alive_any():
            raise NotReady("no healthy prefill/decode instances")
        snap = self.cluster.snapshot(time.monotonic() - self.t0)
        decision = self.conductor.schedule(view, snap)
        if isinstance(decision, Reject):
            self.metrics.rejections.labels(decision.reason).inc()
            raise Rejected(
                f"request rejected: {decision.reason} (predicted TTFT "
                f"{decision.expected_ttft_s:.2f} s, TBT {decision.expected_tbt_s:.3f} s)"
            )
        assert isinstance(decision, Accept)
        return decision

    async def run(
        self, rid: RequestId, tokens: list[int], sampling: SamplingParams, out: Outcome
    ) -> AsyncIterator[Event]:
        hashes = tuple(block_hashes(tokens, self.cluster.block_tokens))
        view = RequestView(
            rid, time.monotonic() - self.t0, len(tokens), hashes, sampling.max_tokens
        )
        self.metrics.prompt_tokens.inc(len(tokens))
        self.metrics.prefix_queries.inc(len(tokens))
        result, acc = None, None
        for attempt in range(2):
            acc = self._place(view)
            try:
                result = await self._prefill(rid, tokens, hashes, sampling, acc, out)
                break
            except InstanceUnavailable as exc:
                self._on_failure(acc, exc)
                self.conductor.on_abort(rid)
                if attempt == 1:
                    raise
        assert result is not None and acc is not None
        out.cached_tokens = result.cached_tokens
        self.metrics.prefix_hits.inc(result.cached_tokens)
        self.conductor.on_prefill_done(rid, time.monotonic() - self.t0)
        async for ev in self._decode(rid, result, sampling, acc, out, tuple(tokens)):
            yield ev

    async def _prefill(
        self, rid: RequestId, tokens: list[int], hashes: tuple[Any, ...], sampling: SamplingParams,
        acc: Accept, out: Outcome,
    ) -> PrefillResult:  # fmt: skip
        p = self.cluster.instances[acc.prefill]
        d = self.cluster.instances[acc.decode]
        out.prefill, out.decode = str(acc.prefill), str(acc.decode)
        pend = self.cluster.pending.setdefault(acc.decode, Pending())
        pend.requests += 1
        pend.tokens += len(tokens)
        ppend = self.cluster.pending.setdefault(acc.prefill, Pending())
        cached = sum(f.num_blocks for f in acc.fetch) + acc.local_prefix_blocks
        cached = min(cached * self.cluster.block_tokens, len(tokens))
        predicted = float(self.conductor.predictors.prefill.time(len(tokens), cached))
        ppend.prefill_s += predicted
        self.metrics.waiting.inc()
        reserved = False
        # The prefill queue is held here, not on the instance: decode KV is then reserved only
        # when the prefill is about to run, so queued requests do not pin decode memory.
        gate = self.gates.setdefault(acc.prefill, asyncio.Semaphore(1))
        try:
            async with gate:
                reservation = None
                if acc.prefill != acc.decode:
                    reservation = await self._reserve(d, rid, len(tokens) + sampling.max_tokens)
                    reserved = True
                task = PrefillTask(rid, tuple(tokens), hashes, sampling, acc.fetch, reservation)
                result = await p.submit_prefill(task)
            out.prefill_timings = dict(result.timings)
            return result
        except BaseException:
            if reserved or acc.prefill == acc.decode:
                await d.abort(rid)
            raise
        finally:
            pend.requests -= 1
            pend.tokens -= len(tokens)
            ppend.prefill_s = max(0.0, ppend.prefill_s - predicted)
            self.metrics.waiting.dec()

    async def _decode(
        self, rid: RequestId, result: PrefillResult, sampling: SamplingParams, acc: Accept,
        out: Outcome, prompt: tuple[int, ...],
    ) -> AsyncIterator[Event]:  # fmt: skip
        d = self.cluster.instances[acc.decode]
        first = result.first_token
        stop = not sampling.ignore_eos and (first in self.eos or first in sampling.stop_token_ids)
        out.token_times.append(time.perf_counter())
        if stop:
            await d.abort(rid)
            yield Event((), FinishReason.STOP)
            return
        yield Event((first,))
        self.metrics.running.inc()
        finished = False
        try:
            stream = d.stream_tokens(rid, first, result.prompt_tokens, sampling, prompt)
            async for chunk in stream:
                if chunk.token_ids:
                    now = time.perf_counter()
                    out.token_times.extend([now] * len(chunk.token_ids))
                finished = chunk.finish_reason is not None
                yield Event(chunk.token_ids, chunk.finish_reason, chunk.error)
        except InstanceError as exc:
            self._on_failure(acc, exc, decode_only=True)
            finished = True
            yield Event((), FinishReason.ERROR, f"decode instance failed mid-stream: {exc}")
        finally:
            self.metrics.running.dec()
            if not finished:
                await d.abort(rid)
                self.conductor.on_abort(rid)
            else:
                self.conductor.on_decode_done(rid, time.monotonic() - self.t0)

    async def _reserve(self, d: Any, rid: RequestId, n: int) -> Any:
        """Reserve prompt + output KV on the decode instance (so decoding never runs out).
        While it is full, wait for requests to finish — up to the TTFT SLO, then reject."""
        deadline = time.monotonic() + self.reserve_wait_s
        while True:
            try:
                return await d.reserve_kv(rid, n)
            except InstanceError as exc:
                if exc.kind != "kv_full" or time.monotonic() > deadline:
                    if exc.kind == "kv_full":
                        self.metrics.rejections.labels("decode_kv_full").inc()
                        raise Rejected(f"decode KV memory full: {exc}") from exc
                    raise
            await asyncio.sleep(0.05)

    def _on_failure(self, acc: Accept, exc: Exception, decode_only: bool = False) -> None:
        """Stop routing to the instance that failed (the poller revives it if it answers)."""
        iid = getattr(exc, "instance", None) or (acc.decode if decode_only else None)
        if isinstance(exc, InstanceUnavailable) and iid:
            self.cluster.mark_dead(InstanceId(iid), str(exc))
