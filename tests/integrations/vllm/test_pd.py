"""Prefill -> decode straight through the Transfer Engine (``pd_transport = "te"``) with the
real vLLM (CPU): engine A prefills (``do_remote_decode``), engine B reads A's blocks from A's
registered KV tensors and decodes; faults end in a recompute with the right answer.

Shares the session's two engines (conftest); A is only ever stopped briefly, never killed.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
import numpy as np
import psutil
import pytest

from kvcake.integrations.vllm.keys import BlockNamer
from kvcake.store.client import Client
from tests.integrations.vllm.conftest import Cluster, complete, metric, wait_log

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

BS = 32
HITS = "vllm:external_prefix_cache_hits_total"
PULLED = "kvcake_connector_pd_pull_blocks_total"
PULL_ERRORS = "kvcake_connector_pd_pull_error_blocks_total"
RELEASED = "kvcake_connector_pd_released_requests_total"


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(100, 40000, n).tolist()


def prefill(c: Cluster, prompt: list[int]) -> dict[str, Any]:
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0,
            "kv_transfer_params": {"do_remote_decode": True}}  # fmt: skip
    r = httpx.post(c.a.url + "/v1/completions", json=body, timeout=180)
    r.raise_for_status()
    return dict(r.json()["kv_transfer_params"])


def decode(c: Cluster, prompt: list[int], params: dict[str, Any]) -> list[int]:
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "return_token_ids": True, "kv_transfer_params": params}  # fmt: skip
    r = httpx.post(c.b.url + "/v1/completions", json=body, timeout=180)
    r.raise_for_status()
    return list(r.json()["choices"][0]["token_ids"])


def wait_metric(engine: Any, name: str, above: float, timeout_s: float = 20) -> float:
    deadline = time.monotonic() + timeout_s
    while (value := metric(engine, name)) <= above:
        assert time.monotonic() < deadline, f"{name} stayed at {value}"
        complete(engine, [9, 9, 9, 9], max_tokens=2)  # a step flushes the worker's stats
        time.sleep(0.3)
    return value


def pooled(c: Cluster, prompt: list[int]) -> list[bool]:
    model = f"{c.a.spec.model_dir.rstrip('/').rsplit('/', 1)[-1]}@vllm"
    with Client(master=c.master_addr) as client:
        return list(client.batch_is_exist(BlockNamer(model, "float32", BS).objects(prompt)))


def engine_processes(engine: Any) -> list[psutil.Process]:
    """vLLM's engine core and worker processes (the API server's descendants): the worker
    holds the KV tensors and the Transfer Engine server that serves them."""
    return list(psutil.Process(engine.proc.pid).children(recursive=True))


def test_pd_through_the_transfer_engine_same_tokens_no_recompute(cluster: Cluster) -> None:
    p = tokens(21, 330)
    params = prefill(cluster, p)
    assert params["kvcake_transport"] == "te" and params["do_remote_prefill"] is True
    assert len(params["remote_block_ids"]) == 330 // BS
    hits, pulled = metric(cluster.b, HITS), metric(cluster.b, PULLED)
    released = metric(cluster.a, RELEASED)
    out = decode(cluster, p, params)
    # B loaded every full prompt block but the last token's from A, over the Transfer Engine
    assert metric(cluster.b, HITS) - hits == (330 - 1) // BS * BS
    assert not any(pooled(cluster, p))  # neither side put this request into the pool
    assert wait_metric(cluster.b, PULLED, pulled) - pulled == (330 - 1) // BS
    assert out == complete(cluster.a, p)  # one engine's answer (A: its own prefix cache)
    wait_metric(cluster.a, RELEASED, released)  # B's release note freed A's kept blocks


def test_pd_decode_with_local_prefix_hit_reads_nothing(cluster: Cluster) -> None:
    """B already holds the prefix (its own prefix cache): no read, A's blocks released."""
    p = tokens(22, 200)
    oracle = decode(cluster, p, prefill(cluster, p))
    pulled = metric(cluster.b, PULLED)
    again = prefill(cluster, p)
    released = metric(cluster.a, RELEASED)
    assert decode(cluster, p, again) == oracle
    wait_metric(cluster.a, RELEASED, released)
    assert metric(cluster.b, PULLED) == pulled


def test_pd_prefill_gone_decode_recomputes(cluster: Cluster) -> None:
    p = tokens(23, 330)
    oracle = complete(cluster.a, p)
    params = prefill(cluster, tokens(24, 330))
    # A prefill whose segments the master dropped (it died): its engine id names nothing.
    gone = {**params, "remote_engine_id": "gone-0000"}
    errors = metric(cluster.b, PULL_ERRORS)
    t0 = time.monotonic()
    assert decode(cluster, p, gone) == oracle
    assert time.monotonic() - t0 < 60
    assert wait_log(cluster.b, "reading the prefill's KV from engine gone-0000 failed", 1, 10)
    assert wait_metric(cluster.b, PULL_ERRORS, errors) > errors


def test_pd_malformed_params_recompute(cluster: Cluster) -> None:
    p = tokens(25, 100)
    oracle = complete(cluster.a, p)
    bad = {"do_remote_prefill": True, "kvcake_transport": "te", "remote_block_ids": "x"}
    assert decode(cluster, p, bad) == oracle
    assert wait_log(cluster.b, "the prompt is recomputed", 1, 10)


def test_pd_prefill_stopped_decode_recomputes_within_deadline(cluster: Cluster) -> None:
    p = tokens(26, 330)
    params = prefill(cluster, p)
    oracle = complete(cluster.a, p)
    released = metric(cluster.a, RELEASED)
    procs = engine_processes(cluster.a)
    for proc in procs:
        proc.send_signal(signal.SIGSTOP)  # A's Transfer Engine server stops answering
    try:
        t0 = time.monotonic()
        out = decode(cluster, p, params)  # B: load_timeout_s = 1 s, then recompute
        took = time.monotonic() - t0
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGCONT)
    assert out == oracle
    assert took < 60
    assert wait_log(cluster.b, "not done after", 1, 10)
    # once A answers again, B's late read ends and its release note frees A's blocks
    wait_metric(cluster.a, RELEASED, released, timeout_s=60)
