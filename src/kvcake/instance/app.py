"""HTTP server of one instance: exposes a :class:`~kvcake.instance.instance.Instance` (an
``InstanceAPI``) over the endpoints in :mod:`kvcake.serve.wire`.

The server never crashes on bad input: every body is validated by msgspec and errors become JSON
answers. A token stream whose HTTP client goes away aborts the request (frees its KV).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvcake.core.api import PrefillTask, TokenChunk
from kvcake.core.errors import EngineError, KvcakeError, StoreError, TransferError
from kvcake.core.ids import RequestId
from kvcake.engine.block_manager import KVCacheFull
from kvcake.instance.instance import Instance
from kvcake.serve.wire import (
    AbortAck,
    AbortRequest,
    InstanceError,
    InstanceState,
    InstanceUnavailable,
    ReserveKV,
    StreamRequest,
    decode,
    encode,
    error_body,
)

log = logging.getLogger(__name__)
JSON = "application/json"


def _error(exc: Exception) -> Response:
    if isinstance(exc, KVCacheFull):
        status, kind = 503, "kv_full"
    elif isinstance(exc, InstanceError):
        status, kind = exc.status, exc.kind
    elif isinstance(exc, TransferError | StoreError):  # a peer failed, not the request
        status, kind = 502, "peer_error"
    elif isinstance(exc, EngineError):
        status, kind = 400, "engine_error"
    elif isinstance(exc, KvcakeError | ValueError):
        status, kind = 400, "invalid_request_error"
    else:
        log.exception("internal error")
        status, kind = 500, "internal_error"
    # A decode peer this instance could not reach is named, so the proxy stops routing there.
    peer = exc.instance if isinstance(exc, InstanceUnavailable) else None
    return Response(error_body(str(exc), kind, peer), status_code=status, media_type=JSON)


async def _now(value: Any) -> Any:
    return value


async def _guard(fn: Callable[[], Awaitable[Any]]) -> Response:
    try:
        return Response(encode(await fn()), media_type=JSON)
    except Exception as exc:
        return _error(exc)


def build_app(inst: Instance) -> FastAPI:
    app = FastAPI(title=f"kvcake {inst.role.value} instance {inst.instance_id}")

    @app.get("/health")
    async def health() -> Response:
        if inst.draining:
            return Response(error_body("draining", "unavailable"), 503, media_type=JSON)
        return Response(b'{"status":"ok"}', media_type=JSON)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(inst.metrics_registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/rpc/info")
    async def info() -> Response:
        return Response(encode(inst.info()), media_type=JSON)

    @app.get("/rpc/state")
    async def state(since: int = 0) -> Response:
        events = inst.kv_events(since)
        first, last = inst.event_bounds()
        st = InstanceState(
            inst.load_report(), tuple(events), first, last, inst.fit.fitted().as_dict()
        )
        return Response(encode(st), media_type=JSON)

    @app.get("/rpc/kv")
    async def kv() -> Response:
        return await _guard(lambda: _now(inst.kv_check()))

    @app.post("/rpc/reserve_kv")
    async def reserve(request: Request) -> Response:
        async def run() -> Any:
            r = decode(await request.body(), ReserveKV)
            return await inst.reserve_kv(
                r.request_id, r.num_tokens, r.prompt_tokens, r.block_hashes, r.sampling
            )

        return await _guard(run)

    @app.post("/rpc/prefill")
    async def prefill(request: Request) -> Response:
        async def run() -> Any:
            return await inst.submit_prefill(decode(await request.body(), PrefillTask))

        return await _guard(run)

    @app.post("/rpc/abort")
    async def abort(request: Request) -> Response:
        async def run() -> Any:
            a = decode(await request.body(), AbortRequest)
            return AbortAck(await inst.abort(a.request_id, a.writer_stopped))

        return await _guard(run)

    @app.post("/rpc/drain")
    async def drain() -> Response:
        inst.spawn(inst.drain())
        return Response(b"{}", media_type=JSON)

    @app.post("/rpc/stream")
    async def stream(request: Request) -> Response:
        try:
            s = decode(await request.body(), StreamRequest)
            inst.check_stream(s.request_id)
        except Exception as exc:
            return _error(exc)
        chunks = inst.stream_tokens(s.request_id, s.first_token)
        return StreamingResponse(
            _ndjson(inst, s.request_id, chunks), media_type="application/x-ndjson"
        )

    return app


async def _ndjson(
    inst: Instance, rid: RequestId, chunks: AsyncIterator[TokenChunk]
) -> AsyncIterator[bytes]:
    finished = False
    try:
        async for c in chunks:
            finished = c.finish_reason is not None
            yield encode(c) + b"\n"
    finally:
        if not finished:  # client went away (or we failed): free the request's KV
            # Decoding starts after the prefill confirmed every write: nothing writes any more.
            # Spawned, so a cancelled response cannot cut the cleanup short.
            inst.spawn(inst.abort(rid, writer_stopped=True))
