"""The OpenAI-compatible proxy (``kvcake proxy``): FastAPI app holding the conductor.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE when ``stream``),
``GET /v1/models``, ``GET /health`` (503 until a prefill and a decode instance answer),
``GET /metrics``, ``GET /v1/cluster`` (the live view, for ``kvcake status``). Errors are JSON
``{"error": {"message", "type", "code"}}``: 400 bad request, 429 SLO rejection, 503 not ready.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvcake.core.api import FinishReason
from kvcake.core.errors import KvcakeError
from kvcake.core.ids import InstanceId
from kvcake.serve import openai
from kvcake.serve.client import RemoteInstance
from kvcake.serve.metrics import ProxyMetrics
from kvcake.serve.router import NotReady, Outcome, Rejected, Router
from kvcake.serve.state import LiveCluster
from kvcake.serve.textcodec import IncrementalDecoder, TextCodec
from kvcake.serve.wire import BadRequest, InstanceError

log = logging.getLogger(__name__)


@dataclass
class ProxyState:
    urls: list[str]
    model: str
    codec_factory: Any  # (InstanceInfo) -> TextCodec
    conductor_factory: Any  # (InstanceInfo) -> Conductor
    link_bandwidth: float
    poll_interval_s: float
    max_prompt_tokens: int
    cluster: LiveCluster | None = None
    router: Router | None = None
    codec: TextCodec | None = None
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    outcomes: list[Outcome] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def ready(self) -> bool:
        return self.cluster is not None and self.cluster.alive_any()


async def _connect_all(st: ProxyState) -> None:
    """Connect to every instance (retrying until each answers), then start serving."""
    remotes: dict[InstanceId, RemoteInstance] = {}
    pending = list(st.urls)
    while pending and not st.stop.is_set():
        for url in list(pending):
            try:
                r = await RemoteInstance.connect(url)
            except InstanceError:
                continue
            remotes[r.instance_id] = r
            pending.remove(url)
        if pending:
            await asyncio.sleep(0.2)
    if not remotes:
        return
    info = next(iter(remotes.values())).info
    for r in remotes.values():
        if (r.info.block_tokens, r.info.kv_bytes_per_token) != (
            info.block_tokens,
            info.kv_bytes_per_token,
        ):
            log.error("instance %s has a different KV layout than %s", r.instance_id, info)
    st.codec = st.codec_factory(info)
    cluster = LiveCluster(remotes, info.block_tokens, info.kv_bytes_per_token, st.link_bandwidth)
    await cluster.poll_once()
    st.cluster = cluster
    st.router = Router(cluster, st.conductor_factory(info), st.metrics, info.eos_token_ids)
    await cluster.run(st.poll_interval_s, st.stop)


def _err(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(openai.error(message, kind, status), status_code=status)


def build_app(st: ProxyState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_connect_all(st))
        yield
        st.stop.set()
        task.cancel()
        if st.cluster:
            await asyncio.gather(*(i.close() for i in st.cluster.instances.values()))

    app = FastAPI(title="kvcake proxy", lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        if not st.ready():
            return _err(503, "no healthy prefill and decode instances yet", "unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        _refresh_gauges(st)
        return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> Response:
        card = {"id": st.model, "object": "model", "created": 0, "owned_by": "kvcake"}
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/v1/cluster")
    async def cluster() -> Response:
        return JSONResponse(_cluster_view(st))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(st, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _generate(st, request, chat=True)

    return app


def _refresh_gauges(st: ProxyState) -> None:
    if st.cluster is None:
        return
    for inst in st.cluster.instances.values():
        rep, name = inst.load_report(), str(inst.instance_id)
        st.metrics.instance_up.labels(name, inst.role.value).set(1 if inst.alive else 0)
        if rep.kv_blocks_total:
            st.metrics.kv_usage.labels(name).set(rep.kv_blocks_used / rep.kv_blocks_total)
        st.metrics.queued_prefill.labels(name).set(rep.queued_prefill_seconds)
        st.metrics.instance_running.labels(name).set(rep.running_requests)


def _cluster_view(st: ProxyState) -> dict[str, Any]:
    if st.cluster is None:
        return {"ready": False, "instances": []}
    rows = []
    for i in st.cluster.instances.values():
        rep = i.load_report()
        rows.append(
            {"id": i.instance_id, "role": i.role.value, "url": i.url, "alive": i.alive,
             "queued": rep.queued_requests, "running": rep.running_requests,
             "kv_used": rep.kv_blocks_used, "kv_total": rep.kv_blocks_total,
             "cached_blocks": st.cluster.kv_index.blocks_of(i.instance_id)}
        )  # fmt: skip
    return {"ready": st.ready(), "indexed_blocks": len(st.cluster.kv_index), "instances": rows}


def _tokens(st: ProxyState, req: openai.GenRequest) -> list[int]:
    assert st.codec is not None
    if req.prompt_ids is not None:
        return list(req.prompt_ids)
    try:
        if req.chat:
            return st.codec.encode_chat(req.messages)
        return st.codec.encode(req.prompt_text or "")
    except KvcakeError as exc:
        raise BadRequest(str(exc)) from exc


async def _generate(st: ProxyState, request: Request, chat: bool) -> Response:
    if not st.ready() or st.router is None or st.codec is None:
        return _err(503, "the cluster is not ready (no healthy instances)", "unavailable")
    try:
        body = json.loads(await request.body())
        req = openai.parse(
            body, chat=chat, vocab_size=st.codec.vocab_size, max_tokens_cap=st.max_prompt_tokens
        )
        tokens = _tokens(st, req)
        if len(tokens) + req.sampling.max_tokens > st.max_prompt_tokens:
            raise BadRequest(
                f"prompt ({len(tokens)} tokens) + max_tokens ({req.sampling.max_tokens}) exceeds "
                f"the model context of {st.max_prompt_tokens} tokens"
            )
    except json.JSONDecodeError as exc:
        return _err(400, f"the body is not valid JSON: {exc.msg}", "invalid_request_error")
    except BadRequest as exc:
        return _err(400, str(exc), "invalid_request_error")
    rid = st.router.new_id()
    out = Outcome(str(rid), len(tokens))
    gen = st.router.run(rid, tokens, req.sampling, out)
    try:
        first = await gen.__anext__()  # placement errors surface before any byte is sent
    except Rejected as exc:
        return _err(429, str(exc), "rate_limit_exceeded")
    except NotReady as exc:
        return _err(503, str(exc), "unavailable")
    except InstanceError as exc:
        if exc.kind == "kv_full":
            st.metrics.rejections.labels("kv_full").inc()
            return _err(429, str(exc), "rate_limit_exceeded")
        st.metrics.errors.labels(exc.kind).inc()
        code = 400 if exc.status == 400 else 503
        return _err(code, str(exc), "invalid_request_error" if code == 400 else "unavailable")
    model = req.model or st.model
    headers = {"x-kvcake-prefill": out.prefill, "x-kvcake-decode": out.decode}
    if req.stream:
        return StreamingResponse(
            _sse(st, gen, first, out, req, model, request),
            media_type="text/event-stream",
            headers=headers,
        )
    resp = await _collect(st, gen, first, out, req, model)
    resp.headers.update(headers)
    return resp


async def _events(gen: AsyncIterator[Any], first: Any) -> AsyncIterator[Any]:
    yield first
    async for ev in gen:
        yield ev


async def _collect(
    st: ProxyState, gen: Any, first: Any, out: Outcome, req: openai.GenRequest, model: str
) -> Response:
    assert st.codec is not None
    dec = IncrementalDecoder(st.codec)
    reason, error = None, None
    async for ev in _events(gen, first):
        dec.push(ev.tokens)
        reason, error = ev.finish or reason, ev.error or error
    _record(st, out, reason, error)
    if reason is FinishReason.ERROR:
        return _err(502, error or "the request failed", "instance_error")
    text = st.codec.decode(dec.ids)
    use = openai.usage(out.prompt_tokens, len(dec.ids), out.cached_tokens)
    doc = openai.response(out.request_id, req.chat, model, text, openai.finish_reason(reason), use)
    # An extension clients ignore: where the request ran and what prefill measured.
    doc["kvcake"] = {
        "prefill": out.prefill, "decode": out.decode, "ttft_s": out.ttft,
        "token_ids": dec.ids, "prefill_timings": out.prefill_timings,
    }  # fmt: skip
    return JSONResponse(doc)


async def _sse(
    st: ProxyState, gen: Any, first: Any, out: Outcome, req: openai.GenRequest, model: str,
    request: Request,
) -> AsyncIterator[bytes]:  # fmt: skip
    assert st.codec is not None
    dec = IncrementalDecoder(st.codec)
    reason, error, first_chunk = None, None, True
    try:
        async for ev in _events(gen, first):
            reason, error = ev.finish or reason, ev.error or error
            text = dec.push(ev.tokens, final=ev.finish is not None)
            if reason is FinishReason.ERROR:
                msg = openai.error(error or "the request failed", "instance_error", 502)
                yield f"data: {json.dumps(msg)}\n\n".encode()
                break
            if text or ev.finish is not None or first_chunk:
                fr = openai.finish_reason(ev.finish)
                c = openai.chunk(out.request_id, req.chat, model, text, fr, first_chunk)
                first_chunk = False
                yield f"data: {json.dumps(c)}\n\n".encode()
        if req.include_usage:
            c = openai.chunk(out.request_id, req.chat, model, None, None)
            c["choices"] = []
            c["usage"] = openai.usage(out.prompt_tokens, len(dec.ids), out.cached_tokens)
            yield f"data: {json.dumps(c)}\n\n".encode()
        yield b"data: [DONE]\n\n"
    finally:
        await gen.aclose()  # on a client disconnect this aborts the request on the instances
        _record(st, out, reason, error)


def _record(st: ProxyState, out: Outcome, reason: FinishReason | None, error: str | None) -> None:
    if out.finish_reason is not None or out.error is not None:
        return
    out.finish_reason = reason.value if reason else "abort"
    out.error = error
    m = st.metrics
    if out.ttft is not None:
        m.ttft.observe(out.ttft)
        m.e2e.observe(time.perf_counter() - out.arrival)
    for a, b in zip(out.token_times, out.token_times[1:], strict=False):
        m.itl.observe(b - a)
    m.generation_tokens.inc(len(out.token_times))
    if error:
        m.errors.labels("instance").inc()
    m.requests.labels(out.finish_reason).inc()
    st.outcomes.append(out)
    del st.outcomes[:-1000]
