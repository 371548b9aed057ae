"""P/D through kvcake's fleet proxy with the real vLLM (CPU): the proxy places each request,
prefills it on engine A (``max_tokens=1``, ``do_remote_decode``) and decodes it on engine B with
A's ``kv_transfer_params``; B reads the prompt's KV from A through the Transfer Engine.

No new engines: the session's two (conftest) take the P/D parts (a kv_both connector takes
either; `kvcake up` gives P/D engines kv_producer / kv_consumer). The proxy is started with
``proxy_argv`` + ``start_proxy``, the code `kvcake up` runs (``--prefill a --decode b``).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integrations.vllm.conftest import Cluster, complete, metric
from tests.integrations.vllm.test_pd import HITS, PULLED, RELEASED, tokens, wait_metric

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

BS = 32


@pytest.fixture(scope="module")
def pd_proxy(cluster: Cluster) -> Iterator[str]:
    from kvcake.fleet.children import proxy_argv, start_proxy

    argv = proxy_argv(cluster.master_addr, 0, BS, [cluster.a, cluster.b],
                      roles={"a": "prefill", "b": "decode"})  # fmt: skip
    assert "--prefill" in argv and "--decode" in argv
    log = Path(tempfile.mkdtemp(prefix="kvcake-pd-proxy-")) / "proxy.log"
    proxy = start_proxy(argv, log)
    url = proxy.info["url"]
    try:
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health").status_code != 200:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
        fleet = httpx.get(url + "/fleet").json()
        assert fleet["pd"] and fleet["engines"]["a"]["role"] == "prefill"
        yield url
    finally:
        proxy.stop()


def test_pd_through_the_proxy_same_tokens_no_recompute(cluster: Cluster, pd_proxy: str) -> None:
    p = tokens(31, 330)
    hits, pulled, released = (
        metric(cluster.b, HITS),
        metric(cluster.b, PULLED),
        metric(cluster.a, RELEASED),
    )
    body = {"model": "smollm2", "prompt": p, "max_tokens": 12, "temperature": 0,
            "return_token_ids": True}  # fmt: skip
    r = httpx.post(pd_proxy + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert (r.headers["x-kvcake-prefill"], r.headers["x-kvcake-engine"]) == ("a", "b")
    out = r.json()["choices"][0]["token_ids"]
    # B did not compute the prompt: every full block but the last token's came from A
    assert metric(cluster.b, HITS) - hits == (330 - 1) // BS * BS
    assert wait_metric(cluster.b, PULLED, pulled) - pulled == (330 - 1) // BS
    wait_metric(cluster.a, RELEASED, released)  # B's release note freed A's kept blocks
    assert out == complete(cluster.a, p)  # one engine's greedy answer (test_pd's oracle)


def test_pd_streaming_chat_through_the_proxy(cluster: Cluster, pd_proxy: str) -> None:
    msgs = [{"role": "system", "content": "You answer in one short sentence. " * 12},
            {"role": "user", "content": "What is the capital of France?"}]  # fmt: skip
    body = {"model": "smollm2", "messages": msgs, "max_tokens": 16, "temperature": 0}
    want = httpx.post(cluster.a.url + "/v1/chat/completions", json=body, timeout=300).json()
    hits = metric(cluster.b, HITS)
    text = ""
    with httpx.stream("POST", pd_proxy + "/v1/chat/completions", timeout=300,
                      json={**body, "stream": True}) as r:  # fmt: skip
        assert r.status_code == 200 and r.headers["x-kvcake-engine"] == "b"
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                text += chunk["choices"][0]["delta"].get("content") or ""
    assert text == want["choices"][0]["message"]["content"]
    n = want["usage"]["prompt_tokens"]
    assert metric(cluster.b, HITS) - hits == (n - 1) // BS * BS


def test_pd_proxy_bad_requests(cluster: Cluster, pd_proxy: str) -> None:
    url = pd_proxy + "/v1/completions"
    for bad in ({"prompt": 5}, {"prompt": "hi", "n": 2}, {"prompt": "hi", "max_tokens": -1}):
        r = httpx.post(url, json=bad, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["message"], (bad, r.text)
    assert httpx.post(url, content=b"{nope", timeout=60).status_code == 400
    # accepted by the prefill (its min_tokens is dropped), refused by the decode's vLLM: the
    # client gets vLLM's 400 and A's kept blocks are released at once (not after the lease)
    released = metric(cluster.a, RELEASED)
    body = {"model": "smollm2", "prompt": tokens(32, 100), "max_tokens": 4, "min_tokens": 9}
    r = httpx.post(url, json=body, timeout=300)
    assert r.status_code == 400 and "min_tokens" in r.text, r.text
    wait_metric(cluster.a, RELEASED, released)


def test_pd_client_abort_mid_stream_aborts_the_decode(cluster: Cluster, pd_proxy: str) -> None:
    gen = "vllm:generation_tokens_total"
    before = metric(cluster.b, gen)
    released = metric(cluster.a, RELEASED)
    body = {"model": "smollm2", "prompt": tokens(33, 200), "max_tokens": 1000,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", pd_proxy + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # the first token arrived: hang up
    # B stops generating: its token counter stands still (the request would otherwise run
    # ~1000 tokens, over a minute on CPU)
    deadline = time.monotonic() + 30
    last = metric(cluster.b, gen)
    while True:
        time.sleep(1.5)
        now = metric(cluster.b, gen)
        if now == last:
            break
        assert time.monotonic() < deadline, "the decode request kept running"
        last = now
    assert now - before < 1000
    wait_metric(cluster.a, RELEASED, released)  # the prefill's blocks were released
