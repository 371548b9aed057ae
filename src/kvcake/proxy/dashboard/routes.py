"""The dashboard's HTTP surface on the proxy.

``GET /dashboard``: the page (static files shipped in the package, no CDN);
``GET /dashboard/static/{app.js,style.css}``; ``GET /dashboard/api/snapshot?recent=N``: one
snapshot (:mod:`.snapshot`); ``GET /dashboard/api/stream?interval=S&max_events=N``:
server-sent events, one ``snapshot`` event every ``interval`` seconds, then ``end`` after
``max_events`` — or sooner, when the client goes away. Malformed parameters get a 400 with a
JSON error saying which one and what range it takes.

Bounds: at most ``MAX_STREAMS`` streams at once (more get 429), a stream lasts at most
``max_events`` events, the history ring holds ``History.capacity`` samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvcake.core.auth import resolve
from kvcake.core.http_auth import MASTER_HTTP
from kvcake.net.httpserve import client_auth
from kvcake.proxy import openai_shapes as shapes
from kvcake.proxy.dashboard import snapshot
from kvcake.proxy.dashboard.history import History, sample, series_of
from kvcake.proxy.dashboard.sources import PoolReport, RunRecord, read_pool, read_run_record

MAX_STREAMS = 8
POOL_TTL_S = 0.5
_STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}


class BadParam(ValueError):
    pass


@dataclass(frozen=True)
class Range:
    lo: float
    hi: float
    default: float
    integer: bool = True

    def parse(self, request: Request, name: str) -> float:
        raw = request.query_params.get(name)
        if raw is None:
            return self.default
        try:
            v = float(int(raw)) if self.integer else float(raw)
        except ValueError:
            v = float("nan")
        if not self.lo <= v <= self.hi:  # also refuses nan and inf
            kind = "an integer" if self.integer else "a number"
            raise BadParam(f"{name} must be {kind} in [{self.lo:g}, {self.hi:g}], got {raw!r}")
        return v


RECENT = Range(1, 1000, 50)
HOT = Range(1, 100, 10)
INTERVAL = Range(0.1, 60.0, 1.0, integer=False)
MAX_EVENTS = Range(1, 3600, 600)


def _bad(exc: BadParam) -> JSONResponse:
    return JSONResponse(shapes.error(str(exc), "invalid_request_error", 400), status_code=400)


class Dashboard:
    """Owns the history ring and the master client; ``run`` samples the counters."""

    def __init__(self, side: snapshot.ProxySide, run_state: str = "", sample_s: float = 1.0):
        self.side = side
        self.run_state = run_state  # path of the cluster's cluster.json ("" = none)
        self.sample_s = sample_s
        self.history = History()
        self.streams = 0
        self._http: httpx.AsyncClient | None = None
        self._pool_cache: tuple[tuple[str, int], float, PoolReport] | None = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            # The master's admin HTTP wants the shared secret when one is set.
            self._http = httpx.AsyncClient(
                timeout=httpx.Timeout(1.5), auth=client_auth(resolve(None), MASTER_HTTP)
            )
        return self._http

    def take_sample(self) -> None:
        self.history.add(sample(series_of(self.side.metrics.registry), time.time()))

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                self.take_sample()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.sample_s)
        finally:
            if self._http is not None:
                await self._http.aclose()
                self._http = None

    async def snapshot(self, n_recent: int, n_hot: int) -> dict[str, Any]:
        run = read_run_record(self.run_state)
        return snapshot.build(self.side, self.history, run, await self._pool(run, n_hot), n_recent)

    async def _pool(self, run: RunRecord, n_hot: int) -> PoolReport:
        """The master's answers, shared for ``POOL_TTL_S`` by every stream and page (8 open
        streams must not mean 24 admin requests a second)."""
        key, now = (run.master_http, n_hot), time.monotonic()
        c = self._pool_cache
        if c is not None and c[0] == key and now - c[1] < POOL_TTL_S:
            return c[2]
        pool = await read_pool(self._client(), run.master_http, n_hot)
        self._pool_cache = (key, now, pool)
        return pool

    async def _events(
        self, interval: float, n: int, n_recent: int, n_hot: int
    ) -> AsyncIterator[bytes]:
        self.streams += 1  # counted here: a body never started must not hold a slot
        try:
            # A client that goes away ends this generator at its next yield or sleep:
            # Starlette cancels it (and ``finally`` frees the slot).
            for i in range(n):
                doc = await self.snapshot(n_recent, n_hot)
                yield f"id: {i}\nevent: snapshot\ndata: {json.dumps(doc)}\n\n".encode()
                await asyncio.sleep(interval)
            yield b"event: end\ndata: {}\n\n"
        finally:
            self.streams -= 1

    def router(self) -> APIRouter:
        r = APIRouter()

        @r.get("/dashboard")
        async def page(request: Request) -> Response:
            # The first snapshot rides in the page: it renders before the load event, with no
            # second round trip and whatever the live stream does (headless browsers included).
            try:
                n_recent = int(RECENT.parse(request, "recent"))
            except BadParam:
                n_recent = int(RECENT.default)  # the page's own script reports the bad value
            return _page(await self.snapshot(n_recent, int(HOT.default)))

        @r.get("/dashboard/static/{name}")
        async def static(name: str) -> Response:
            return _static(name)

        @r.get("/dashboard/api/snapshot")
        async def snap(request: Request) -> Response:
            try:
                n_recent, n_hot = RECENT.parse(request, "recent"), HOT.parse(request, "hot")
            except BadParam as exc:
                return _bad(exc)
            return JSONResponse(await self.snapshot(int(n_recent), int(n_hot)))

        @r.get("/dashboard/api/stream")
        async def stream(request: Request) -> Response:
            try:
                interval = INTERVAL.parse(request, "interval")
                n = int(MAX_EVENTS.parse(request, "max_events"))
                n_recent, n_hot = RECENT.parse(request, "recent"), HOT.parse(request, "hot")
            except BadParam as exc:
                return _bad(exc)
            if self.streams >= MAX_STREAMS:
                doc = shapes.error(
                    f"at most {MAX_STREAMS} dashboard streams at once", "too_many_streams", 429
                )
                return JSONResponse(doc, status_code=429, headers={"Retry-After": "5"})
            body = self._events(interval, n, int(n_recent), int(n_hot))
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)

        return r


def _page(first: dict[str, Any]) -> Response:
    """index.html with ``first`` embedded as JSON (``<`` escaped: no ``</script>`` inside)."""
    html = (resources.files("kvcake.proxy.dashboard") / "static" / "index.html").read_text()
    doc = json.dumps(first).replace("<", "\\u003c")
    tag = f'<script id="first-snapshot" type="application/json">{doc}</script>\n'
    html = html.replace("<script src=", tag + "<script src=", 1)
    return Response(html, media_type=_STATIC["index.html"], headers={"Cache-Control": "no-cache"})


def _static(name: str) -> Response:
    kind = _STATIC.get(name)
    if kind is None:
        doc = shapes.error(f"no dashboard file {name!r}", "not_found_error", 404)
        return JSONResponse(doc, status_code=404)
    data = (resources.files("kvcake.proxy.dashboard") / "static" / name).read_bytes()
    return Response(data, media_type=kind, headers={"Cache-Control": "no-cache"})
