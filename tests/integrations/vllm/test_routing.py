"""kvcake's proxy in front of the two vLLM engines: a conversation's second turn is placed
where its prefix is (learnt from vLLM's KV events, re-hashed with kvcake's block hash)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integrations.vllm.conftest import Cluster
from tests.waits import wait_until

# The first test also waits for the shared engines to start (minutes on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def proxy(cluster: Cluster) -> Iterator[str]:
    argv = [sys.executable, "-m", "kvcake", "vllm-proxy", "--master", cluster.master_addr]
    for e in (cluster.a, cluster.b):
        argv += ["--engine", f"{e.spec.name}={e.url}@tcp://127.0.0.1:{e.spec.kv_events_port}"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("vllm-proxy url="), line
        url = line.split("=", 1)[1].strip()
        wait_until(lambda: httpx.get(url + "/health").status_code == 200, timeout=30, every_s=0.3,
                   what="the vllm-proxy healthy")  # fmt: skip
        yield url
    finally:
        p.terminate()
        p.wait(10)


def chat(url: str, messages: list[dict[str, str]]) -> tuple[str, str]:
    body = {"model": "smollm2", "messages": messages, "max_tokens": 40, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=180)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"], r.headers.get("x-kvcake-engine", "")


def blocks_of(url: str, engine: str) -> int:
    return int(httpx.get(url + "/fleet").json()["engines"][engine]["blocks"])


@pytest.mark.parametrize("first", ["a", "b"])
def test_second_turn_lands_where_its_prefix_is(cluster: Cluster, proxy: str, first: str) -> None:
    engine = cluster.a if first == "a" else cluster.b
    system = f"You are assistant number {first}. " + "Answer briefly and politely. " * 60
    turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "Name a color."}]
    before = blocks_of(proxy, first)
    answer, _ = chat(engine.url, turn1)  # turn 1 straight to one engine, not via the proxy
    # its KV events reached the proxy (~12 blocks)
    wait_until(lambda: blocks_of(proxy, first) >= before + 8, timeout=20, every_s=0.2,
               what="turn 1's blocks in the proxy's index",
               detail=lambda: httpx.get(proxy + "/fleet").json())  # fmt: skip
    turn2 = [*turn1, {"role": "assistant", "content": answer},
             {"role": "user", "content": "And another one?"}]  # fmt: skip
    _, placed = chat(proxy, turn2)
    assert placed == first


def test_bad_requests_are_400(proxy: str) -> None:
    r = httpx.post(proxy + "/v1/completions", content=b"{not json")
    assert r.status_code == 400
    r = httpx.post(proxy + "/v1/completions", json={"prompt": 5})
    assert r.status_code == 400
    r = httpx.post(proxy + "/v1/chat/completions", json={"messages": "hi"})
    assert r.status_code == 400


def test_pd_kv_transfer_params_pass_through_the_proxy(cluster: Cluster, proxy: str) -> None:
    """The two-step P/D flow by a client through the proxy: the prefill's te params come back
    unchanged and the decode, wherever it is placed, answers as one engine does."""
    prompt = list(range(1000, 1300))
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0,
            "kv_transfer_params": {"do_remote_decode": True}}  # fmt: skip
    r = httpx.post(proxy + "/v1/completions", json=body, timeout=180)
    r.raise_for_status()
    params = r.json()["kv_transfer_params"]
    assert params["kvcake_transport"] == "te" and params["remote_block_ids"]
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 8, "temperature": 0,
            "return_token_ids": True, "kv_transfer_params": params}  # fmt: skip
    r = httpx.post(proxy + "/v1/completions", json=body, timeout=180)
    r.raise_for_status()
    oracle = dict(body, kv_transfer_params=None)
    want = httpx.post(cluster.a.url + "/v1/completions", json=oracle, timeout=180).json()
    assert r.json()["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]


def test_zz_pd_prefill_killed_decode_recomputes(cluster: Cluster) -> None:
    """Runs last in the session (it kills engine A's engine core and worker; the fixture's
    teardown reaps the rest): a prefill engine that died after answering. B's read finds
    nobody at A's address (or A's segments gone), B recomputes and answers as A did."""
    import signal

    import psutil

    from tests.integrations.vllm.conftest import complete, wait_log

    prompt = list(range(2000, 2330))
    oracle = complete(cluster.a, prompt)
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0,
            "kv_transfer_params": {"do_remote_decode": True}}  # fmt: skip
    params = httpx.post(cluster.a.url + "/v1/completions", json=body, timeout=180).json()[
        "kv_transfer_params"
    ]
    for proc in psutil.Process(cluster.a.proc.pid).children(recursive=True):
        proc.send_signal(signal.SIGKILL)
    failures = cluster.b.log_text().count("vLLM recomputes")
    t0 = time.monotonic()
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "return_token_ids": True, "kv_transfer_params": params}  # fmt: skip
    r = httpx.post(cluster.b.url + "/v1/completions", json=body, timeout=180)
    assert r.json()["choices"][0]["token_ids"] == oracle
    assert time.monotonic() - t0 < 60
    assert wait_log(cluster.b, "vLLM recomputes", failures + 1, 10)
