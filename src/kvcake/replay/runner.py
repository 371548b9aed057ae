"""Replay a Mooncake trace against any OpenAI-compatible endpoint (ours, vLLM's, SGLang's).

Prompts are token ids synthesised by :func:`kvcake.core.trace.tokens_from_hash_ids` (equal
``hash_ids`` give equal token blocks, so the trace's prefix sharing survives; ``tokens_per_block``
scales the 512-token trace blocks down for small models). Each request is sent at its (scaled)
arrival time as a streaming ``/v1/completions`` call with ``max_tokens`` = its output length and
``ignore_eos``. Requests that do not fit the model context are dropped and counted.

Per request: TTFT, TBT (mean of the longest 10% inter-token gaps, as in the paper), tokens,
cached prompt tokens (``usage.prompt_tokens_details.cached_tokens``), outcome. The summary adds
percentiles, throughput and the effective request capacity (share of requests meeting both SLOs).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from kvcake.core.stats import percentile, tbt_of_times
from kvcake.core.trace import TraceRecord, tokens_from_hash_ids


@dataclass(frozen=True)
class ReplayOptions:
    url: str
    tokens_per_block: int = 512
    max_context: int = 8192
    vocab_size: int = 32000
    max_output: int = 0  # cap output lengths (0 = as in the trace)
    model: str = ""
    seed: int = 0
    ttft_slo_s: float = 30.0
    tbt_slo_s: float = 0.3
    timeout_s: float = 600.0


@dataclass
class RequestRecord:
    index: int
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    status: str = "pending"  # ok | rejected | error | dropped
    ttft_s: float | None = None
    tbt_s: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    latency_s: float | None = None
    error: str | None = None
    sent_s: float | None = None  # when the request was actually sent (s after the start)


@dataclass
class ReplaySummary:
    requests: int
    completed: int
    rejected: int
    errors: int
    dropped: int
    duration_s: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    tbt_p50: float
    tbt_p99: float
    output_tokens_per_s: float
    requests_per_s: float
    prefix_hit_rate: float
    effective_capacity: float  # share of sent requests meeting both SLOs
    per_request: list[RequestRecord] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("per_request")
        return d


def prepare(
    records: Sequence[TraceRecord], opts: ReplayOptions
) -> tuple[list[RequestRecord], list[list[int]]]:
    reqs, prompts = [], []
    for i, r in enumerate(records):
        toks = tokens_from_hash_ids(
            r.hash_ids, r.input_length, tokens_per_block=opts.tokens_per_block,
            vocab_size=opts.vocab_size, seed=opts.seed,
        )  # fmt: skip
        out = max(1, min(r.output_length, opts.max_output) if opts.max_output else r.output_length)
        rec = RequestRecord(i, r.timestamp_ms / 1000.0, len(toks), out)
        if len(toks) + out > opts.max_context:
            rec.status = "dropped"
            rec.error = f"{len(toks)} + {out} tokens exceed the context of {opts.max_context}"
        reqs.append(rec)
        prompts.append(toks)
    return reqs, prompts


async def _one(
    http: httpx.AsyncClient, rec: RequestRecord, prompt: list[int], opts: ReplayOptions,
    start: float = 0.0,
) -> None:  # fmt: skip
    body = {
        "model": opts.model or None, "prompt": prompt, "max_tokens": rec.max_tokens,
        "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    t0 = time.perf_counter()
    rec.sent_s = t0 - start if start else None
    times: list[float] = []
    try:
        async with http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                rec.status = "rejected" if r.status_code == 429 else "error"
                rec.error = f"HTTP {r.status_code}: {text[:200]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                if "error" in doc:
                    rec.status, rec.error = "error", str(doc["error"].get("message"))
                    return
                if doc.get("usage"):
                    use = doc["usage"]
                    rec.output_tokens = int(use.get("completion_tokens", 0))
                    details = use.get("prompt_tokens_details") or {}
                    rec.cached_tokens = int(details.get("cached_tokens") or 0)
                if doc.get("choices") and doc["choices"][0].get("text"):
                    times.append(time.perf_counter())
    except httpx.HTTPError as exc:
        rec.status, rec.error = "error", repr(exc)
        return
    rec.status = "ok"
    rec.latency_s = time.perf_counter() - t0
    rec.ttft_s = times[0] - t0 if times else None
    tbt = tbt_of_times(times)  # NaN with one token; the record says None (JSON has no NaN)
    rec.tbt_s = None if math.isnan(tbt) else tbt
    if not rec.output_tokens:
        rec.output_tokens = len(times)


async def run_replay(
    records: Sequence[TraceRecord],
    opts: ReplayOptions,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> ReplaySummary:
    reqs, prompts = prepare(records, opts)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    timeout = httpx.Timeout(opts.timeout_s, connect=10.0)
    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=opts.url, limits=limits, timeout=timeout) as http:

        async def fire(rec: RequestRecord, prompt: list[int]) -> None:
            delay = start + rec.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await _one(http, rec, prompt, opts, start)
            if on_done is not None:
                on_done(rec)

        tasks = []
        for rec, p in zip(reqs, prompts, strict=True):
            if rec.status == "dropped":
                if on_done is not None:
                    on_done(rec)
                continue
            tasks.append(asyncio.create_task(fire(rec, p)))
        await asyncio.gather(*tasks)
    return summarize(reqs, time.perf_counter() - start, opts)


def summarize(reqs: list[RequestRecord], duration: float, opts: ReplayOptions) -> ReplaySummary:
    ok = [r for r in reqs if r.status == "ok"]
    sent = [r for r in reqs if r.status != "dropped"]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tbt = [r.tbt_s for r in ok if r.tbt_s is not None]
    good = [
        r for r in ok
        if r.ttft_s is not None and r.ttft_s <= opts.ttft_slo_s
        and (r.tbt_s is None or r.tbt_s <= opts.tbt_slo_s)
    ]  # fmt: skip
    prompt_total = sum(r.prompt_tokens for r in ok)
    return ReplaySummary(
        requests=len(reqs),
        completed=len(ok),
        rejected=sum(r.status == "rejected" for r in reqs),
        errors=sum(r.status == "error" for r in reqs),
        dropped=sum(r.status == "dropped" for r in reqs),
        duration_s=duration,
        ttft_p50=percentile(ttft, 50),
        ttft_p90=percentile(ttft, 90),
        ttft_p99=percentile(ttft, 99),
        tbt_p50=percentile(tbt, 50),
        tbt_p99=percentile(tbt, 99),
        output_tokens_per_s=sum(r.output_tokens for r in ok) / max(duration, 1e-9),
        requests_per_s=len(ok) / max(duration, 1e-9),
        prefix_hit_rate=sum(r.cached_tokens for r in ok) / max(prompt_total, 1),
        effective_capacity=len(good) / max(len(sent), 1),
        per_request=reqs,
    )
