"""The OpenAI-compatible proxy (``kvcake proxy``): FastAPI app holding the conductor.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE when ``stream``),
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health/live`` (the process answers),
``GET /health/ready`` = ``GET /health`` (503 naming every failed check, :mod:`.health`),
``GET /metrics``, ``GET /v1/cluster`` (the live view, for ``kvcake status``),
``/dashboard`` (the web dashboard and its JSON/SSE endpoints, :mod:`kvcake.proxy.dashboard`).
Errors are OpenAI's JSON ``{"error": {"message", "type", "param", "code"}}`` (``code`` a string
or null): 400 bad request, 404 unknown model or path, 405 wrong method, 413 body too large, 429
SLO rejection, 503 not ready. Body decoding, validation and tokenization
run on a small thread pool, so a huge prompt never stalls other requests or ``/health``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvcake.core.api import FinishReason, SamplingParams
from kvcake.core.errors import KvcakeError
from kvcake.core.ids import InstanceId
from kvcake.core.pools import started_pool
from kvcake.proxy import auth as proxy_auth
from kvcake.proxy import openai, pool_events, reqlog
from kvcake.proxy import openai_shapes as shapes
from kvcake.proxy.client import RemoteInstance
from kvcake.proxy.dashboard import Dashboard
from kvcake.proxy.dashboard.snapshot import recent_row
from kvcake.proxy.detok import Detokenizer
from kvcake.proxy.health import Health
from kvcake.proxy.httpbody import BodyTooLarge, decode_json, read_limited
from kvcake.proxy.metrics import ProxyMetrics
from kvcake.proxy.router import NotReady, Outcome, Rejected, Router
from kvcake.proxy.state import LiveCluster
from kvcake.proxy.textcodec import TextCodec
from kvcake.serve import attribution
from kvcake.serve.wire import BadRequest, InstanceError

log = logging.getLogger(__name__)
_PREP_INFLIGHT = 32


@dataclass
class ProxyState:
    urls: list[str]
    models: tuple[str, ...]  # served names; the first is the default and the "root"
    codec_factory: Any  # (InstanceInfo) -> TextCodec
    conductor_factory: Any  # (InstanceInfo) -> Conductor
    link_bandwidth: float
    poll_interval_s: float
    max_prompt_tokens: int  # the context: prompt + answer (also capped by the instances')
    max_body_bytes: int = 8 << 20
    master: str = ""  # store master RPC host:port; "" = no store events (pool_events)
    directory: str = ""  # the instances' TE directory (proxy/health.py; "" = the master's)
    request_log: Any = None  # serve.reqlog.RequestLog: one JSON line per request (None = off)
    api_keys: Any = None  # serve.auth.ApiKeys: /v1/ needs one of them (None = open)
    run_state: str = ""  # the `kvcake up` run's cluster.json (dashboard: restarts, master HTTP)
    cluster: LiveCluster | None = None
    router: Router | None = None
    codec: TextCodec | None = None
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    # the dashboard's rows of the last finished requests (snapshot.recent_row), bounded
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=1000))
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    # Bounded: 2 workers; at most _PREP_INFLIGHT bodies decoded or waiting to be, the others
    # wait on the semaphore (their bodies are already capped by max_body_bytes).
    prep_pool: ThreadPoolExecutor = field(default_factory=lambda: started_pool(2, "kvcake-prep"))
    prep_gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(_PREP_INFLIGHT))

    health: Any = None  # serve.health.Health (set by build_app)

    def serving(self) -> bool:
        """Can a request be placed at all (a live prefill and decode instance)?"""
        return self.cluster is not None and self.cluster.alive_any()

    def ready(self) -> bool:
        """Readiness from the active checks (proxy/health.py)."""
        return bool(self.health.report()["ready"]) if self.health is not None else self.serving()


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
    contexts = [r.info.max_context for r in remotes.values() if r.info.max_context > 0]
    st.max_prompt_tokens = min([st.max_prompt_tokens, *contexts])
    index = attribution.tracking_index(attribution.EvictionMemory())  # miss reasons: evicted
    cluster = LiveCluster(remotes, info.block_tokens, info.kv_bytes_per_token, st.link_bandwidth,
                          kv_index=index)  # fmt: skip
    st.metrics.preemptions.source = lambda: reqlog.preemptions(cluster)
    await cluster.poll_once()
    st.cluster = cluster
    st.router = Router(cluster, st.conductor_factory(info), st.metrics, info.eos_token_ids)
    if st.master:  # the store's KV events keep the pool holder current (evictions included)
        cluster.pool_from_store = True
        pool_events.start(cluster.kv_index, st.master, st.stop)
    await cluster.run(st.poll_interval_s, st.stop)


def _err(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(shapes.error(message, kind, status, param), status_code=status)


def build_app(st: ProxyState) -> FastAPI:
    dash = Dashboard(st, st.run_state)
    st.health = Health(st)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_connect_all(st))
        sampler = asyncio.create_task(dash.run(st.stop))
        checker = asyncio.create_task(st.health.run(st.stop))
        yield
        st.stop.set()
        task.cancel()
        await sampler
        await checker
        st.prep_pool.shutdown(wait=False, cancel_futures=True)
        if st.cluster:
            await asyncio.gather(*(i.close() for i in st.cluster.instances.values()))

    app = FastAPI(title="kvcake proxy", lifespan=lifespan)
    shapes.install_error_handlers(app)  # 404 / 405 in OpenAI's shape too
    if st.api_keys is not None:  # OpenAI-style keys on /v1/ (proxy/auth.py)
        app.add_middleware(proxy_auth.RequireApiKey, keys=st.api_keys)
    app.include_router(dash.router())  # /dashboard (serve/dashboard)

    @app.get("/health/live")
    async def live() -> Response:  # this process answers; never depends on a peer
        return JSONResponse({"status": "alive"})

    @app.get("/health/ready")
    @app.get("/health")
    async def ready() -> Response:
        rep = st.health.report()
        if rep["ready"]:
            return JSONResponse({"status": "ok", **rep})
        body = shapes.error("not ready: " + "; ".join(rep["reasons"]), "unavailable", 503)
        return JSONResponse({**body, "status": "unavailable", **rep}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        _refresh_gauges(st)
        return Response(generate_latest(st.metrics.exposition), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> Response:
        cards = [shapes.model_card(m, st.models[0]) for m in st.models]
        return JSONResponse({"object": "list", "data": cards})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        if model_id not in st.models:
            return _err(404, str(openai.ModelNotFound(model_id)), "model_not_found", "model")
        return JSONResponse(shapes.model_card(model_id, st.models[0]))

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
    if st.health is not None:
        st.health.export(st.metrics)
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
        return {"ready": False, "health": st.health.report() if st.health else None,
                "instances": []}  # fmt: skip
    rows = []
    for i in st.cluster.instances.values():
        rep = i.load_report()
        rows.append(
            {"id": i.instance_id, "role": i.role.value, "url": i.url, "alive": i.alive,
             "queued": rep.queued_requests, "running": rep.running_requests,
             "kv_used": rep.kv_blocks_used, "kv_total": rep.kv_blocks_total,
             "cached_blocks": st.cluster.kv_index.blocks_of(i.instance_id)}
        )  # fmt: skip
    cfg = getattr(getattr(st.router, "conductor", None), "config", None)
    conf = asdict(cfg) if is_dataclass(cfg) and not isinstance(cfg, type) else {}  # [conductor]
    return {"ready": st.ready(), "health": st.health.report() if st.health else None,
            "indexed_blocks": len(st.cluster.kv_index), "instances": rows,
            # completed polls of the instances: a caller that waits for two more knows the
            # view above includes everything the instances had done when it started waiting
            "polls": st.cluster.polls,
            "conductor": conf}  # fmt: skip


@dataclass(frozen=True)
class Prepared:
    req: openai.GenRequest
    tokens: list[int]
    sampling: SamplingParams


def _prepare(st: ProxyState, raw: bytes, chat: bool) -> Prepared:
    """Decode, validate and tokenize one body (on the prep pool, off the event loop)."""
    assert st.codec is not None
    body = decode_json(raw)
    req = openai.parse(body, chat=chat, vocab_size=st.codec.vocab_size, models=st.models)
    if req.prompt_ids is not None:
        tokens = list(req.prompt_ids)
    else:
        _refuse_surely_too_long(st.codec, req, st.max_prompt_tokens)
        try:
            if req.chat:
                tokens = st.codec.encode_chat(req.messages)
            else:
                tokens = st.codec.encode(req.prompt_text or "")
        except KvcakeError as exc:
            raise BadRequest(str(exc)) from exc
        except UnicodeError as exc:  # defensive: decode_json already refuses lone surrogates
            raise BadRequest(f"the text is not valid Unicode: {exc}") from exc
    return Prepared(req, tokens, req.sampling(len(tokens), st.max_prompt_tokens))


def _refuse_surely_too_long(codec: TextCodec, req: openai.GenRequest, context: int) -> None:
    """A text longer than the context could hold even at the most characters per token is
    refused before tokenizing it (megabytes of tokenization for a certain 400)."""
    chars = sum(len(m["content"]) for m in req.messages) + len(req.prompt_text or "")
    least = chars // codec.max_token_chars
    if least >= context:
        raise BadRequest(
            f"the prompt is at least {least} tokens ({chars} characters), more than the model "
            f"context of {context} tokens"
        )


async def _parse_request(st: ProxyState, request: Request, chat: bool) -> Prepared | Response:
    try:
        raw = await read_limited(request, st.max_body_bytes)
        async with st.prep_gate:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(st.prep_pool, _prepare, st, raw, chat)
    except BodyTooLarge as exc:
        return _err(413, str(exc), "invalid_request_error")
    except openai.ModelNotFound as exc:
        return _err(404, str(exc), "model_not_found", "model")
    except BadRequest as exc:
        return _err(400, str(exc), "invalid_request_error")


async def _generate(st: ProxyState, request: Request, chat: bool) -> Response:
    arrival = time.perf_counter()  # TTFT counts from here: body read and tokenizing included
    try:  # the tenant (API key / x-tenant-id) salts the request's block hashes
        tenant = proxy_auth.tenant_for(st.api_keys, request.headers)
    except proxy_auth.AuthFailure as exc:
        return JSONResponse(exc.body(), status_code=exc.status)
    if not st.serving() or st.router is None or st.codec is None:
        return _err(503, "the cluster is not ready (no healthy instances)", "unavailable")
    prep = await _parse_request(st, request, chat)
    if isinstance(prep, Response):
        return prep
    req, tokens = prep.req, prep.tokens
    rid = st.router.new_id()
    out = Outcome(str(rid), len(tokens), arrival=arrival)
    out.model, out.stream = req.model, req.stream
    out.endpoint = "chat" if req.chat else "completions"
    out.tenant = tenant or None  # the request log's tenant field
    sampling = proxy_auth.salted(prep.sampling, tenant, req.cache_salt)
    gen = st.router.run(rid, tokens, sampling, out)
    try:
        first = await gen.__anext__()  # placement errors surface before any byte is sent
    except Rejected as exc:  # type says why (ttft_slo / tbt_slo / no_capacity)
        reqlog.on_end(st, out, outcome="rejected", error=exc.kind)
        rej = _err(429, str(exc), exc.kind)
        rej.headers["Retry-After"] = str(exc.retry_after_s)
        return rej
    except NotReady as exc:
        reqlog.on_end(st, out, outcome="error", error=str(exc))
        return _err(503, str(exc), "unavailable")
    except InstanceError as exc:
        kv_full = exc.kind == "kv_full"
        reqlog.on_end(st, out, outcome="rejected" if kv_full else "error", error=str(exc))
        if kv_full:
            st.metrics.rejections.labels("kv_full").inc()
            rej = _err(429, str(exc), "no_capacity")
            rej.headers["Retry-After"] = "1"
            return rej
        st.metrics.errors.labels(exc.kind).inc()
        code = 400 if exc.status == 400 else 503
        return _err(code, str(exc), "invalid_request_error" if code == 400 else "unavailable")
    meta = shapes.ResponseMeta(chat=req.chat, model=req.model)
    headers = {"x-kvcake-prefill": out.prefill, "x-kvcake-decode": out.decode}
    if out.predicted_ttft_s is not None:  # what admission judged (benchmarks compare)
        headers["x-kvcake-predicted-ttft"] = f"{out.predicted_ttft_s:.4f}"
    det = Detokenizer(st.codec, req.stop)
    if req.stream:
        return StreamingResponse(
            _sse(st, gen, first, out, req, meta, det),
            media_type="text/event-stream",
            headers=headers,
        )
    resp = await _collect(st, gen, first, out, meta, det)
    resp.headers.update(headers)
    return resp


Piece = tuple[str, FinishReason | None, str | None]  # text to send, finish, error


async def _pieces(gen: AsyncIterator[Any], first: Any, det: Detokenizer) -> AsyncIterator[Piece]:
    """The text of a request as it becomes final; the last piece carries the finish reason.
    A stop string ends it early (the caller closes ``gen``, which aborts the request)."""
    ev = first
    while True:
        text = det.feed(ev.tokens)
        if det.stopped:
            yield text, FinishReason.STOP, None
            return
        if ev.finish is FinishReason.ERROR:
            yield text, FinishReason.ERROR, ev.error or "the request failed"
            return
        if ev.finish is not None:
            yield text + det.finish(), ev.finish, None
            return
        yield text, None, None
        try:
            ev = await gen.__anext__()
        except StopAsyncIteration:
            yield det.finish(), None, None
            return


async def _collect(
    st: ProxyState, gen: Any, first: Any, out: Outcome, meta: shapes.ResponseMeta,
    det: Detokenizer,
) -> Response:  # fmt: skip
    reason, error = None, None
    try:
        async for piece in _pieces(gen, first, det):
            _, reason, error = piece
    finally:
        await gen.aclose()
    _record(st, out, reason, error)
    if reason is FinishReason.ERROR:
        return _err(502, error or "the request failed", "instance_error")
    use = shapes.usage(out.prompt_tokens, len(det.ids), out.cached_tokens)
    attribution.extend_usage(use, out.kv)
    doc = shapes.response(meta, det.text, shapes.finish_reason(reason), use)
    # An extension clients ignore: where the request ran and what prefill measured.
    doc["kvcake"] = {
        "prefill": out.prefill, "decode": out.decode, "ttft_s": out.ttft,
        "token_ids": det.ids, "prefill_timings": out.prefill_timings,
    }  # fmt: skip
    return JSONResponse(doc)


def _data(doc: Any) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


async def _sse(
    st: ProxyState, gen: Any, first: Any, out: Outcome, req: openai.GenRequest,
    meta: shapes.ResponseMeta, det: Detokenizer,
) -> AsyncIterator[bytes]:  # fmt: skip
    reason, error, first_chunk = None, None, True
    try:
        async for text, reason, error in _pieces(gen, first, det):
            if reason is FinishReason.ERROR:
                yield _data(shapes.error(error or "the request failed", "instance_error", 502))
                break
            if text or reason is not None or first_chunk:
                fr = shapes.finish_reason(reason)
                yield _data(shapes.chunk(meta, text, fr, first_chunk))
                first_chunk = False
        if req.include_usage:
            use = shapes.usage(out.prompt_tokens, len(det.ids), out.cached_tokens)
            attribution.extend_usage(use, out.kv)
            yield _data(shapes.usage_chunk(meta, use))
        yield b"data: [DONE]\n\n"
    finally:
        await gen.aclose()  # on a client disconnect or a stop string: abort on the instances
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
    st.recent.append(recent_row(out))
    reqlog.on_end(st, out)
