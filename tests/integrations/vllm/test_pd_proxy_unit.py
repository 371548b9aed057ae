"""The fleet proxy's P/D flow without vLLM: the proxy app in-process (ASGI), its engines
scripted behind httpx's MockTransport, so each failure happens exactly where the test says
(prefill refused or timing out, decode refusing with 4xx, decode dying mid-stream). Release
notes go over real zmq to a real :class:`Inbox`. The happy path against real vLLM engines is
in test_pd_proxy.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvcake.core.errors import ConfigError
from kvcake.fleet.adapter import EngineRef, FleetConfig, VllmFleet
from kvcake.fleet.pd import PREFILL_HEADER, check_pd_body, prefill_body
from kvcake.fleet.proxy import ENGINE_HEADER, build_app
from kvcake.integrations.vllm.pd_wire import Inbox, producer_params
from kvcake.integrations.vllm.worker import log_for

Handler = Callable[[httpx.Request, dict[str, Any]], Any]


class Engines:
    """Scripted engines by host: ``p`` prefills, ``d`` decodes; ``script[host]`` may
    override the answer to a completion."""

    def __init__(self, inbox: Inbox):
        self.inbox = inbox
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.script: dict[str, Handler] = {}

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": list(range(40))})
        body = json.loads(request.content)
        self.seen.append((host, body))
        if host in self.script:
            return await self.script[host](request, body)
        if host == "p":
            params = producer_params("eng-p", "req-p-1", [3, 4, 5], 64, self.inbox.address)
            return httpx.Response(200, json={"choices": [{"text": "x"}],
                                             "kv_transfer_params": params})  # fmt: skip
        if body.get("stream"):
            chunks = [b'data: {"choices":[{"text":"a"}]}\n\n', b"data: [DONE]\n\n"]
            return httpx.Response(200, content=_agen(chunks))
        return httpx.Response(200, json={"choices": [{"text": "decoded"}]})


async def _agen(chunks: list[bytes], fail: Exception | None = None) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c
    if fail is not None:
        raise fail


def fleet_with(engines: Engines) -> VllmFleet:
    refs = [EngineRef("p", "http://p", role="prefill"), EngineRef("d", "http://d", role="decode")]
    fleet = VllmFleet(refs, FleetConfig(block_tokens=4, prefill_timeout_s=5))
    fleet.http = httpx.AsyncClient(transport=httpx.MockTransport(engines))
    for e in fleet.engines.values():
        e.healthy = True  # no poller in-process
    return fleet


def call(fleet: VllmFleet, body: Any, stream: bool = False) -> tuple[httpx.Response, bytes]:
    async def go() -> tuple[httpx.Response, bytes]:
        transport = httpx.ASGITransport(app=build_app(fleet))
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as c:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = await c.post("/v1/completions", content=raw, timeout=10)
            return r, r.content

    return asyncio.run(go())


def notes(inbox: Inbox, timeout_s: float = 3.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    got: set[str] = set()
    while not got and time.monotonic() < deadline:
        got = inbox.drain()
        time.sleep(0.02)
    return got


BODY = {"model": "smollm2", "prompt": "hello", "max_tokens": 9, "temperature": 0,
        "stream_options": {"include_usage": True}, "min_tokens": 3}  # fmt: skip


@pytest.fixture
def engines() -> Any:
    inbox = Inbox(log_for("test"))
    yield Engines(inbox)
    inbox.close()


def test_two_steps_non_streaming(engines: Engines) -> None:
    fleet = fleet_with(engines)
    r, _ = call(fleet, BODY)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "decoded"
    assert (r.headers[ENGINE_HEADER], r.headers[PREFILL_HEADER]) == ("d", "p")
    (h1, pre), (h2, dec) = engines.seen
    assert h1 == "p" and pre["max_tokens"] == 1 and pre["stream"] is False
    assert pre["kv_transfer_params"] == {"do_remote_decode": True}
    assert "stream_options" not in pre and "min_tokens" not in pre
    assert h2 == "d" and dec["max_tokens"] == 9 and dec["min_tokens"] == 3
    assert dec["kv_transfer_params"]["remote_request_id"] == "req-p-1"
    assert notes(engines.inbox, 0.2) == set()  # the decode's connector releases, not the proxy


def test_two_steps_streaming(engines: Engines) -> None:
    r, raw = call(fleet_with(engines), {**BODY, "stream": True})
    assert r.status_code == 200 and r.headers[ENGINE_HEADER] == "d"
    assert raw.endswith(b"data: [DONE]\n\n") and b'"a"' in raw
    assert engines.seen[0][1]["stream"] is False and engines.seen[1][1]["stream"] is True


def test_decode_refusing_4xx_releases_the_prefills_blocks(engines: Engines) -> None:
    async def bad(_: httpx.Request, __: dict[str, Any]) -> httpx.Response:
        err = {"error": {"message": "max_tokens must be at least 1", "type": "BadRequestError"}}
        return httpx.Response(400, json=err)

    engines.script["d"] = bad
    for stream in (False, True):
        r, _ = call(fleet_with(engines), {**BODY, "stream": stream})
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
        assert notes(engines.inbox) == {"req-p-1"}


def test_decode_unreachable_is_502_and_releases(engines: Engines) -> None:
    async def refused(request: httpx.Request, _: dict[str, Any]) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    engines.script["d"] = refused
    fleet = fleet_with(engines)
    r, _ = call(fleet, BODY)
    assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_error"
    assert notes(engines.inbox) == {"req-p-1"}
    assert not fleet.engines["d"].healthy  # type: ignore[index]


def test_prefill_failures_are_clear_errors_and_skip_the_decode(engines: Engines) -> None:
    async def refused(request: httpx.Request, _: dict[str, Any]) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async def slow(request: httpx.Request, _: dict[str, Any]) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async def invalid(_: httpx.Request, __: dict[str, Any]) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "temperature", "type": "x"}})

    for script, status in ((refused, 503), (slow, 504), (invalid, 400)):
        engines.seen.clear()
        engines.script["p"] = script
        r, _ = call(fleet_with(engines), BODY)
        assert r.status_code == status, r.text
        assert isinstance(r.json()["error"]["message"], str)
        assert [h for h, _ in engines.seen] == ["p"]  # never sent to the decode


def test_decode_dying_mid_stream_ends_the_stream_with_an_error(engines: Engines) -> None:
    async def dies(request: httpx.Request, _: dict[str, Any]) -> httpx.Response:
        fail = httpx.ReadError("connection reset", request=request)
        return httpx.Response(200, content=_agen([b'data: {"x":1}\n\n'], fail))

    engines.script["d"] = dies
    r, raw = call(fleet_with(engines), {**BODY, "stream": True})
    assert r.status_code == 200
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[0] == b'data: {"x":1}'
    assert b"failed mid-stream" in events[1] and events[-1] == b"data: [DONE]"


def test_a_stalled_streamed_decode_times_out_between_chunks(engines: Engines) -> None:
    timeouts: list[dict[str, Any]] = []

    async def stalls(request: httpx.Request, _: dict[str, Any]) -> httpx.Response:
        timeouts.append(request.extensions["timeout"])
        fail = httpx.ReadTimeout("no chunk in time", request=request)  # what the idle read raises
        return httpx.Response(200, content=_agen([b'data: {"x":1}\n\n'], fail))

    engines.script["d"] = stalls
    fleet = fleet_with(engines)
    fleet.cfg = dataclasses.replace(fleet.cfg, decode_idle_timeout_s=7.5)
    r, raw = call(fleet, {**BODY, "stream": True})
    assert timeouts and timeouts[0]["read"] == 7.5  # the decode's wait for each next chunk
    assert r.status_code == 200
    events = [e for e in raw.split(b"\n\n") if e]
    assert b"failed mid-stream" in events[1] and events[-1] == b"data: [DONE]"


def test_malformed_requests_are_400(engines: Engines) -> None:
    fleet = fleet_with(engines)
    for body in (b"{nope", b"[1]", {**BODY, "n": 2}, {**BODY, "max_tokens": "many"}, {**BODY, "max_tokens": -1},
                 {**BODY, "kv_transfer_params": "x"}, {"prompt": 5}):  # fmt: skip
        r, _ = call(fleet, body)
        assert r.status_code == 400, body
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert engines.seen == []


def test_client_driven_params_go_where_they_say(engines: Engines) -> None:
    """A request with its own kv_transfer_params is forwarded unchanged: a decode-side one
    (do_remote_prefill) to the decode engine, a prefill-side one to the prefill engine."""
    fleet = fleet_with(engines)
    params = producer_params("eng-p", "r9", [1], 64, engines.inbox.address)
    r, _ = call(fleet, {**BODY, "kv_transfer_params": params})
    assert r.status_code == 200 and r.headers[ENGINE_HEADER] == "d"
    r, _ = call(fleet, {**BODY, "kv_transfer_params": {"do_remote_decode": True}})
    assert r.headers[ENGINE_HEADER] == "p"
    assert [h for h, _ in engines.seen] == ["d", "p"]


def test_fleet_roles_and_bodies() -> None:
    with pytest.raises(ValueError, match="decode"):
        VllmFleet([EngineRef("p", "http://p", role="prefill")], FleetConfig())
    with pytest.raises(ValueError, match="role"):
        EngineRef("x", "http://x", role="middle")
    fleet = VllmFleet([EngineRef("p", "http://p", role="prefill"),
                       EngineRef("b", "http://b"), EngineRef("d", "http://d", role="decode")],
                      FleetConfig(block_tokens=4))  # fmt: skip
    snap = fleet.snapshot()
    assert [s.instance_id for s in snap.prefill] == ["p", "b"]
    assert [s.instance_id for s in snap.decode] == ["b", "d"]
    assert fleet.pd and not fleet.cfg.conductor.colocated
    fleet.engines["p"].healthy = True  # type: ignore[index]
    assert not fleet.ready()  # nobody to decode
    fleet.engines["d"].healthy = True  # type: ignore[index]
    assert fleet.ready()
    b = prefill_body({"max_completion_tokens": 50, "stream": True, "kv_transfer_params": None})
    assert (b["max_tokens"], b["max_completion_tokens"], b["stream"]) == (1, 1, False)
    with pytest.raises(ValueError, match="n > 1"):
        check_pd_body({"n": 3})


def test_cluster_config_roles(tmp_path: Path) -> None:
    from kvcake.fleet.children import proxy_argv
    from kvcake.fleet.cluster import KV_ROLES, load
    from kvcake.fleet.procs import VllmEngine, VllmEngineSpec

    root = Path(__file__).resolve().parents[3]
    cfg = load(root / "configs" / "vllm-pd.toml")
    assert cfg.roles() == [("vllm-prefill-0", "prefill"), ("vllm-decode-0", "decode")]
    assert load(root / "configs" / "vllm.toml").roles() == [("vllm-0", "both"), ("vllm-1", "both")]
    bad = tmp_path / "bad.toml"
    bad.write_text("[vllm]\nprefill = 2\n")
    with pytest.raises(ConfigError, match="decode"):
        load(bad)
    bad.write_text('[vllm]\nprefill = "one"\ndecode = 1\n')
    with pytest.raises(ConfigError):
        load(bad)
    engines = [
        VllmEngine.of(VllmEngineSpec(n, 9000 + i, "/m", kv_role=KV_ROLES[r],
                                     kv_events_port=7000 + i), tmp_path)
        for i, (n, r) in enumerate([("vllm-0", "both"), *cfg.roles()])
    ]  # fmt: skip
    argv = proxy_argv("127.0.0.1:1", 0, 32, engines)
    flags = [a for a in argv if a in ("--engine", "--prefill", "--decode")]
    assert flags == ["--engine", "--prefill", "--decode"]
    assert "vllm-decode-0=http://127.0.0.1:9002@tcp://127.0.0.1:7002" in argv
    assert engines[1].spec.kv_transfer_config()["kv_role"] == "kv_producer"
    over = proxy_argv("127.0.0.1:1", 0, 32, engines[:1], roles={"vllm-0": "decode"})
    assert "--decode" in over and "--engine" not in over
    from kvcake.deploy.vllm_fleet import vllm_manifests

    with pytest.raises(ConfigError, match="prefill/decode"):  # not rendered (yet): say so
        vllm_manifests(cfg, "", "img")


def test_client_gone_after_the_prefill_skips_the_decode_and_releases(engines: Engines) -> None:
    from kvcake.fleet.pd import PdRelay, forward_pd

    async def gone() -> bool:
        return True

    async def go() -> int:
        fleet = fleet_with(engines)
        relay = PdRelay(fleet)
        try:
            p = fleet.plan("r1", list(range(40)), 9)
            return (await forward_pd(relay, p, "/v1/completions", BODY, "r1", gone)).status_code
        finally:
            relay.close()

    assert asyncio.run(go()) == 499
    assert [h for h, _ in engines.seen] == ["p"]
    assert notes(engines.inbox) == {"req-p-1"}


def test_a_stalled_non_streamed_decode_times_out_without_progress(engines: Engines) -> None:
    """A non-streamed answer sends nothing before its end, so the decode is judged by the
    engine's generation-token counter: no movement for the idle timeout -> 504, and the
    decode request is closed; a slow answer while the counter moves is waited for."""
    closed: list[bool] = []

    async def slow(_: httpx.Request, __: dict[str, Any]) -> httpx.Response:
        try:
            await asyncio.sleep(1.0)
        except asyncio.CancelledError:
            closed.append(True)
            raise
        return httpx.Response(200, json={"choices": [{"text": "late"}]})

    engines.script["d"] = slow
    fleet = fleet_with(engines)
    fleet.cfg = dataclasses.replace(fleet.cfg, decode_idle_timeout_s=0.3)
    t0 = time.monotonic()
    r, _ = call(fleet, BODY)
    assert r.status_code == 504 and "generated no token" in r.json()["error"]["message"]
    assert time.monotonic() - t0 < 0.9 and closed == [True]

    async def moving() -> tuple[httpx.Response, bytes]:
        d = fleet.engines["d"]

        async def tick() -> None:
            while True:  # what the /metrics poller does while the engine generates
                d.progress_at = time.monotonic()
                await asyncio.sleep(0.05)

        ticker = asyncio.create_task(tick())
        try:
            return await asyncio.to_thread(call, fleet, BODY)
        finally:
            ticker.cancel()

    r, _ = asyncio.run(moving())
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "late"


def test_metrics_parsing_reads_the_generation_counter() -> None:
    from kvcake.fleet.adapter import parse_metrics

    text = (
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 40.0\n'
        'vllm:generation_tokens_total{engine="1",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="0"} 3.0\nvllm:bogus 1\n'
    )
    m = parse_metrics(text)
    assert m["vllm:generation_tokens_total"] == 42.0 and m["vllm:num_requests_running"] == 3.0
    with pytest.raises(ValueError):  # prometheus-client's parser: the adapter skips the scrape
        parse_metrics(text + "not a metric line\n")
