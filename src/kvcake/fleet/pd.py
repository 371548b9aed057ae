"""P/D through the fleet proxy: prefill on one vLLM engine, decode on another.

The flow is vLLM's disaggregated-serving proxies' (its ``toy_proxy_server``): the request goes
to the prefill engine with ``max_tokens = 1``, ``stream = false`` and ``kv_transfer_params =
{"do_remote_decode": true}``; the prefill's answer carries the ``kv_transfer_params`` that name
its kept blocks (:mod:`kvcake.integrations.vllm.pd_wire`); the *original* request goes to the
decode engine with those params, and its answer (streamed or not) is the client's.

Who frees the prefill's kept blocks: the decode's connector (a release note once its read has
ended, or at once when it needs none), else the prefill's lease (``pd_lease_s``). The proxy
sends the note itself only when the decode certainly never admitted the request: the decode
engine refused the connection or answered 4xx (vLLM validates before it schedules). A client
that goes away mid-stream closes the decode request (vLLM aborts it; its connector then
releases as above). Errors are OpenAI-shaped (``{"error": {"message", "type"}}``), never a hang:
the prefill step has ``prefill_timeout_s``; a decode has ``decode_idle_timeout_s`` between
chunks (streamed) or, non-streamed, without the engine's generation-token counter moving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvcake.core.ids import InstanceId
from kvcake.fleet.adapter import EngineRef, Placement, VllmFleet
from kvcake.integrations.vllm.pd_wire import Notifier, PdParamsError, is_te_decode, parse_remote

log = logging.getLogger(__name__)

ENGINE_HEADER = "x-kvcake-engine"  # the engine that answered (the decode one in P/D)
PREFILL_HEADER = "x-kvcake-prefill"  # P/D: the engine that prefilled
_DROP_FOR_PREFILL = ("stream_options", "min_tokens")  # min_tokens > 1 fails with max_tokens=1


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def check_pd_body(body: dict[str, Any]) -> None:
    """What a P/D request may not ask (ValueError: a 400)."""
    for key in ("n", "best_of"):
        if body.get(key) not in (None, 1):
            # every child request would read the same kept blocks and release them: the
            # first release would free blocks the others still read
            raise ValueError(f"{key} > 1 is not supported on a prefill/decode fleet")


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in body.items() if k not in _DROP_FOR_PREFILL}
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["kv_transfer_params"] = {"do_remote_decode": True}
    return out


def upstream_error(r: httpx.Response, who: str) -> JSONResponse:
    """An engine's error answer, passed on with its status (vLLM's are OpenAI-shaped)."""
    try:
        doc = r.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        return JSONResponse(doc, status_code=r.status_code)
    kind = "invalid_request_error" if r.status_code < 500 else "upstream_error"
    return error(r.status_code, f"{who}: {r.text[:500]}", kind)


class PdRelay:
    """Runs the two steps for one proxy (holds the notifier for the proxy's release notes)."""

    def __init__(self, fleet: VllmFleet):
        self.fleet = fleet
        self._notifier: Notifier | None = None
        self.released_by_proxy = 0  # release notes this proxy sent (a decode never admitted)

    def release(self, params: dict[str, Any] | None) -> None:
        """Tell the prefill to free the blocks it kept for ``params`` (safe only when no
        decode will read them)."""
        if not is_te_decode(params):
            return  # pool hand-off (nothing kept) or no params
        assert params is not None
        try:
            remote = parse_remote(params)
        except PdParamsError:
            return
        if self._notifier is None:
            self._notifier = Notifier()
        if self._notifier.send(remote.notify, [remote.request_id]):
            self.released_by_proxy += 1

    def close(self) -> None:
        if self._notifier is not None:
            self._notifier.close()

    async def prefill(
        self, p: Placement, path: str, body: dict[str, Any], rid: str
    ) -> dict[str, Any] | Response | None:
        """Step 1. Returns the prefill's kv_transfer_params (None: it gave none; the decode
        then computes the prompt itself), or the error Response for the client. Raises
        httpx.ConnectError when the prefill engine refused the connection (place again)."""
        e, fleet = p.prefill, self.fleet
        try:
            r = await fleet.http.post(e.url + path, json=prefill_body(body),
                                      headers={"X-Request-Id": rid + "-p"},
                                      timeout=httpx.Timeout(fleet.cfg.prefill_timeout_s,
                                                            connect=5))  # fmt: skip
        except httpx.ConnectError:
            e.healthy = False
            raise
        except httpx.TimeoutException:
            return error(504, f"prefill engine {e.id} did not answer within "
                         f"{fleet.cfg.prefill_timeout_s:.0f} s", "upstream_timeout")  # fmt: skip
        except httpx.TransportError as exc:
            e.healthy = False
            return error(502, f"prefill engine {e.id} failed: {exc!r}", "upstream_error")
        finally:
            fleet.prefill_done(rid, e.id, p.predicted_s)
        if r.status_code != 200:
            return upstream_error(r, f"prefill engine {e.id}")
        try:
            params = r.json().get("kv_transfer_params")
        except (ValueError, AttributeError):
            return error(502, f"prefill engine {e.id} answered no JSON object", "upstream_error")
        if not isinstance(params, dict):
            log.warning("prefill engine %s returned no kv_transfer_params (is its connector "
                        "the KvcakeConnector?); the decode computes the prompt", e.id)  # fmt: skip
            return None
        return params

    async def decode(
        self, p: Placement, path: str, body: dict[str, Any], rid: str,
        params: dict[str, Any] | None,
    ) -> Response:  # fmt: skip
        """Step 2: the original request, with the prefill's params, on the decode engine;
        another healthy decode engine if this one refuses the connection."""
        fleet, d = self.fleet, p.decode
        req = dict(body)
        if params is not None:
            req["kv_transfer_params"] = params
        tried: set[InstanceId] = set()
        while True:
            headers = {ENGINE_HEADER: str(d.id), PREFILL_HEADER: str(p.prefill.id)}
            try:
                return await self._send(d, path, req, rid, params, headers)
            except httpx.ConnectError:
                d.healthy = False
                tried.add(d.id)
                nxt = fleet.next_decode(tried, prefer_not=p.prefill.id)
                if nxt is None:
                    self.release(params)
                    fleet.finished(rid, ok=False)
                    return error(502, f"no decode engine answered (tried {sorted(tried)})",
                                 "upstream_error")  # fmt: skip
                d = nxt

    async def _send(
        self, d: EngineRef, path: str, req: dict[str, Any], rid: str,
        params: dict[str, Any] | None, headers: dict[str, str],
    ) -> Response:  # fmt: skip
        fleet = self.fleet
        hdr = {"X-Request-Id": rid}
        if not req.get("stream"):
            post = asyncio.ensure_future(fleet.http.post(d.url + path, json=req, headers=hdr))
            if not await _unless_stalled(post, d, fleet.cfg.decode_idle_timeout_s):
                fleet.finished(rid, ok=False)  # the closed request makes vLLM abort it
                return error(504, f"decode engine {d.id} generated no token in "
                             f"{fleet.cfg.decode_idle_timeout_s:.0f} s", "upstream_timeout")  # fmt: skip
            try:
                r = post.result()
            except httpx.ConnectError:
                raise
            except httpx.TransportError as exc:
                fleet.finished(rid, ok=False)
                return _transport_error(d, exc)
            return self._answered(r, rid, params, headers, d)
        try:
            idle = httpx.Timeout(30.0, read=fleet.cfg.decode_idle_timeout_s)
            built = fleet.http.build_request("POST", d.url + path, json=req, headers=hdr,
                                             timeout=idle)  # fmt: skip
            r = await fleet.http.send(built, stream=True)
        except httpx.ConnectError:
            raise
        except httpx.TransportError as exc:
            fleet.finished(rid, ok=False)
            return _transport_error(d, exc)
        if r.status_code != 200:
            await r.aread()
            await r.aclose()
            return self._answered(r, rid, params, headers, d)
        return ClosingStream(self._relay(r, rid, d), 200, headers=headers,
                             media_type="text/event-stream")  # fmt: skip

    def _answered(
        self, r: httpx.Response, rid: str, params: dict[str, Any] | None,
        headers: dict[str, str], d: EngineRef,
    ) -> Response:  # fmt: skip
        if r.status_code == 200:
            self.fleet.finished(rid)
            return Response(r.content, 200, headers=headers, media_type="application/json")
        self.fleet.finished(rid, ok=False)
        if 400 <= r.status_code < 500:
            self.release(params)  # vLLM refused it before scheduling: nobody will read
        return upstream_error(r, f"decode engine {d.id}")

    async def _relay(self, r: httpx.Response, rid: str, d: EngineRef) -> AsyncIterator[bytes]:
        ok = False
        try:
            async for chunk in r.aiter_raw():
                yield chunk
            ok = True
        except httpx.TransportError as exc:  # the decode engine died or stalled mid-stream
            msg = {"error": {"message": f"decode engine {d.id} failed mid-stream: {exc!r}",
                             "type": "upstream_error"}}  # fmt: skip
            yield b"data: " + json.dumps(msg).encode() + b"\n\ndata: [DONE]\n\n"
        finally:
            self.fleet.finished(rid, ok=ok)
            with anyio.CancelScope(shield=True):  # closing it is what aborts the decode
                await r.aclose()


async def _unless_stalled(call: asyncio.Future[Any], d: EngineRef, idle_s: float) -> bool:
    """Wait for ``call``; False (and ``call`` cancelled) once engine ``d``'s generation-token
    counter (polled from its /metrics) has not moved for ``idle_s``. A non-streamed answer
    sends no byte before the end, so a read timeout cannot tell a long decode from a stall."""
    start = time.monotonic()
    try:
        while not call.done():
            left = max(d.progress_at, start) + idle_s - time.monotonic()
            if left <= 0:
                return False
            await asyncio.wait({call}, timeout=min(left, 1.0))
        return True
    finally:
        if not call.done():
            call.cancel()  # also when this request is itself cancelled (client gone)


def _transport_error(d: EngineRef, exc: httpx.TransportError) -> JSONResponse:
    if isinstance(exc, httpx.TimeoutException):
        return error(504, f"decode engine {d.id} did not answer in time: {exc!r}",
                     "upstream_timeout")  # fmt: skip
    return error(502, f"decode engine {d.id} failed: {exc!r}", "upstream_error")


class ClosingStream(StreamingResponse):
    """A StreamingResponse that closes its iterator however the response ends: a client that
    disconnects mid-stream (ASGI 2.4 servers raise from ``send``, older ones cancel) then
    closes the upstream request at once, not when the generator is garbage-collected."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await aclose()


async def forward_pd(
    relay: PdRelay, p: Placement, path: str, body: dict[str, Any], rid: str,
    gone: Callable[[], Awaitable[bool]] | None = None,
) -> Response:  # fmt: skip
    """Both steps for a placement whose prefill and decode engines differ. ``gone`` says
    whether the client has hung up (checked between the steps: then the decode is not sent
    and the prefill's blocks are released). Raises httpx.ConnectError when the prefill engine
    refused (the caller places again)."""
    got = await relay.prefill(p, path, body, rid)
    if isinstance(got, Response):
        relay.fleet.finished(rid, ok=False)
        return got
    if gone is not None and await gone():
        relay.release(got)
        relay.fleet.finished(rid, ok=False)
        return error(499, "the client closed the request", "client_closed_request")
    return await relay.decode(p, path, body, rid, got)
