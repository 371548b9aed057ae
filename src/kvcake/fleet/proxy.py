"""The OpenAI HTTP front of a vLLM fleet: places each request with :class:`VllmFleet` and
forwards it unchanged to a kv_both engine, or runs prefill and decode on two engines of a P/D
fleet (:mod:`kvcake.fleet.pd`) (``kvcake vllm-proxy --help``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvcake.conductor.config import ConductorConfig
from kvcake.core.config import add_config_flags, flag_overrides, load_config
from kvcake.core.errors import ConfigError
from kvcake.core.ids import InstanceId
from kvcake.fleet.adapter import EngineRef, FleetConfig, Placement, VllmFleet
from kvcake.fleet.pd import ENGINE_HEADER, PdRelay, check_pd_body, forward_pd
from kvcake.fleet.pd import error as _error
from kvcake.net.httpserve import serve
from kvcake.net.listen import bind

# FleetConfig's fields with a flag (help: each field's metadata)
FLEET_FLAGS = ("block_tokens", "prefill_timeout_s", "decode_idle_timeout_s")
ROLE_NAMES = {"both": "vllm", "prefill": "vllm-prefill", "decode": "vllm-decode"}


def parse_body(raw: bytes, pd: bool) -> tuple[dict[str, Any], int]:
    """The request as a dict and its max_tokens; ValueError / TypeError: a 400."""
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    limit = body.get("max_tokens")
    limit = body.get("max_completion_tokens") if limit is None else limit
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"max_tokens must be a positive integer, got {limit!r}")
    max_tokens = limit or 16
    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise ValueError("kv_transfer_params must be an object")
    if pd and params is None:
        check_pd_body(body)
    return body, max_tokens


async def tokens_of(fleet: VllmFleet, path: str, body: dict[str, Any]) -> list[int]:
    """Token ids of the prompt, as the engines will see them."""
    prompt = body.get("prompt")
    if path.endswith("/completions") and "chat" not in path:
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if not isinstance(prompt, str):
            raise ValueError("prompt must be a string or a list of token ids")
        req: dict[str, Any] = {"model": body.get("model", fleet.cfg.model), "prompt": prompt}
    else:
        if not isinstance(body.get("messages"), list):
            raise ValueError("messages must be a list")
        req = {"model": body.get("model", fleet.cfg.model), "messages": body["messages"]}
    for e in fleet.engines.values():
        if not e.healthy:
            continue
        with contextlib.suppress(httpx.HTTPError):
            r = await fleet.http.post(e.url + "/tokenize", json=req, timeout=30)
            if r.status_code == 200:
                return list(r.json()["tokens"])
            raise ValueError(r.text[:500])
    raise LookupError("no healthy vLLM engine to tokenize with")


def build_app(fleet: VllmFleet) -> FastAPI:
    stop = asyncio.Event()
    ids = itertools.count(1)
    tag = secrets.token_hex(4)  # request ids stay unique on the engines across proxy restarts
    relay = PdRelay(fleet)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(fleet.run(stop))
        yield
        stop.set()
        relay.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 5)

    app = FastAPI(title="kvcake vLLM fleet proxy", lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        ok = fleet.ready()
        return JSONResponse({"healthy": ok}, status_code=200 if ok else 503)

    @app.get("/fleet")
    async def state() -> dict[str, Any]:
        return {
            "engines": {
                e.id: {
                    "url": e.url,
                    "healthy": e.healthy,
                    "running": e.running,
                    "waiting": e.waiting,
                    "kv_usage": e.kv_usage,
                    "role": e.role,
                    "placed": fleet.placed[e.id],
                    "blocks": fleet.index.blocks_of(e.id),
                }
                for e in fleet.engines.values()
            },
            "pool_blocks": fleet.index.blocks_of(InstanceId("pool")),
            "pd": fleet.pd,
            "pd_released_by_proxy": relay.released_by_proxy,
        }

    @app.get("/v1/cluster")
    async def cluster() -> dict[str, Any]:  # the shape `kvcake status` prints
        cap = fleet.cfg.kv_capacity_tokens // fleet.cfg.block_tokens
        return {
            "ready": fleet.ready(),
            "indexed_blocks": len(fleet.index),
            "instances": [
                {"id": e.id, "role": ROLE_NAMES[e.role], "alive": e.healthy, "queued": int(e.waiting),
                 "running": int(e.running), "kv_used": int(e.kv_usage * cap), "kv_total": cap,
                 "cached_blocks": fleet.index.blocks_of(e.id)}
                for e in fleet.engines.values()
            ],
        }  # fmt: skip

    async def forward(request: Request, path: str) -> Response:
        try:
            body, max_tokens = parse_body(await request.body(), fleet.pd)
            tokens = await tokens_of(fleet, path, body)
        except (ValueError, TypeError) as exc:
            return _error(400, str(exc))
        except LookupError as exc:
            return _error(503, str(exc), "unavailable")
        rid = f"vllm-proxy-{tag}-{next(ids)}"
        for _attempt in range(2):  # a dead engine: mark it and place once more
            try:
                p = fleet.plan(rid, tokens, max_tokens)
            except LookupError as exc:
                return _error(503, str(exc), "unavailable")
            client_params = body.get("kv_transfer_params")
            try:
                if p.disaggregated and client_params is None:
                    return await forward_pd(relay, p, path, body, rid, request.is_disconnected)
                return await _send_one(fleet, p, path, body, rid)
            except httpx.TransportError:
                fleet.finished(rid, ok=False)
        return _error(502, "the chosen vLLM engines did not answer", "upstream_error")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await forward(request, "/v1/chat/completions")

    return app


async def _send_one(
    fleet: VllmFleet, p: Placement, path: str, body: dict[str, Any], rid: str
) -> Response:
    """One engine runs the request: colocated, or a P/D fleet's request that carries its own
    ``kv_transfer_params`` (the client drives the hand-off): a ``do_remote_prefill`` request
    goes to the decode engine, any other to the prefill engine."""
    params = body.get("kv_transfer_params") or {}
    e = p.decode if p.disaggregated and params.get("do_remote_prefill") else p.prefill

    def done(first_token: bool = False) -> None:
        if first_token:  # a streamed answer's first token: the prefill's end
            fleet.observe_prefill(p, time.monotonic() - p.started)
        fleet.done(rid, p.prefill.id, p.predicted_s)

    try:
        return await _send(fleet, e, path, body, done)
    except httpx.TransportError:
        e.healthy = False
        raise


async def _send(
    fleet: VllmFleet, e: EngineRef, path: str, body: dict[str, Any], done: Callable[..., None]
) -> Response:
    headers = {ENGINE_HEADER: e.id}
    if not body.get("stream"):
        try:
            r = await fleet.http.post(e.url + path, json=body)
        finally:
            done()
        return Response(r.content, r.status_code, headers=headers, media_type="application/json")
    req = fleet.http.build_request("POST", e.url + path, json=body)
    try:
        r = await fleet.http.send(req, stream=True)
    except httpx.TransportError:
        done()
        raise

    async def relay() -> AsyncIterator[bytes]:
        first = True
        try:
            async for chunk in r.aiter_raw():
                if first:
                    done(True)
                    first = False
                yield chunk
        finally:
            if first:
                done()
            await r.aclose()

    return StreamingResponse(relay(), r.status_code, headers=headers,
                             media_type="text/event-stream")  # fmt: skip


def parse_engine(text: str, role: str = "both") -> EngineRef:
    """``ID=URL`` or ``ID=URL@tcp://127.0.0.1:PORT`` (its KV events)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest.startswith("http"):
        raise argparse.ArgumentTypeError(f"--engine wants ID=URL[@EVENTS], got {text!r}")
    url, _, events = rest.partition("@")
    return EngineRef(InstanceId(name), url.rstrip("/"), events, role=role)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="kvcake vllm-proxy",
        description="kvcake's KV-aware proxy in front of vLLM engines (OpenAI API). With "
        "--prefill and --decode engines it runs each request's prefill on one (max_tokens=1, "
        "kv_transfer_params do_remote_decode) and its decode on another.",
    )
    spec = "ID=URL[@tcp://127.0.0.1:PORT] of a vLLM engine and its KV events"
    ap.add_argument("--engine", type=parse_engine, action="append", default=[],
                    help=spec + " (kv_both: prefills and decodes its requests)")  # fmt: skip
    ap.add_argument("--prefill", type=lambda t: parse_engine(t, "prefill"), action="append",
                    default=[], help=spec + " (P/D: prefill only)")  # fmt: skip
    ap.add_argument("--decode", type=lambda t: parse_engine(t, "decode"), action="append",
                    default=[], help=spec + " (P/D: decode only)")  # fmt: skip
    ap.add_argument("--master", default="", help="kvcake master host:port (the pool's events)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 = a free port")
    fleet_flags = add_config_flags(ap, FleetConfig, only=FLEET_FLAGS)
    aliases = {"prefill_policy": ("--policy",)}
    policy = add_config_flags(ap, ConductorConfig, only=["prefill_policy"], aliases=aliases)
    args = ap.parse_args(argv)
    engines = args.engine + args.prefill + args.decode
    if not engines:
        ap.error("name at least one engine (--engine, or --prefill and --decode)")
    try:
        overrides = {"colocated": True, **flag_overrides(args, policy)}
        conductor = load_config(ConductorConfig, section="conductor", overrides=overrides)
        cfg = load_config(FleetConfig, section="fleet", overrides=flag_overrides(args, fleet_flags))
    except ConfigError as exc:
        ap.error(str(exc))
    cfg = dataclasses.replace(cfg, conductor=conductor)
    try:
        fleet = VllmFleet(engines, cfg, args.master)
    except ValueError as exc:
        ap.error(str(exc))
    sock = bind(args.host, args.port, "vllm-proxy (--port)")  # requests wait in the backlog
    print(f"vllm-proxy url=http://{args.host}:{sock.getsockname()[1]}", flush=True)
    serve(build_app(fleet), sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
