"""KvcakeConnector against the real vLLM (CPU): reuse gives vLLM's own answers, across
engines, and every fault ends in a recompute with the right answer (docs/integrations/vllm.md).

The tests share two engines (see conftest) and run in file order: the fault tests come last.
"""

from __future__ import annotations

import signal
import time

import httpx
import numpy as np
import pytest

from kvcake.integrations.vllm.keys import BlockNamer
from kvcake.store.client import Client
from tests.integrations.vllm.conftest import Cluster, complete, metric, wait_log
from tests.waits import wait_until

# The first test also waits for the shared engines to start (minutes on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

BS = 32
HITS = "vllm:external_prefix_cache_hits_total"


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(100, 40000, n).tolist()


def wait_pooled(c: Cluster, prompt: list[int], timeout_s: float = 30) -> None:
    """Block until every full block of ``prompt`` is in the pool (A saves in the background)."""
    model = f"{c.a.spec.model_dir.rstrip('/').rsplit('/', 1)[-1]}@vllm"
    keys = BlockNamer(model, "float32", BS).objects(prompt)  # every rank's object
    with Client(master=c.master_addr) as client:
        wait_until(lambda: all(client.batch_is_exist(keys)), timeout=timeout_s, every_s=0.2,
                   what="engine A's blocks in the pool")  # fmt: skip


def loaded_on_b(c: Cluster, prompt: list[int]) -> tuple[list[int], float]:
    before = metric(c.b, HITS)
    out = complete(c.b, prompt)
    return out, metric(c.b, HITS) - before


def test_master_down_at_start_up_engines_serve(cluster: Cluster) -> None:
    got = cluster.before_pool
    assert got["a"] and got["a"] == got["b"]
    for name in ("a", "b"):
        log = got["logs"][name]
        # One line per connector process (scheduler and worker), saying what happens.
        assert 1 <= log.count("serves without the KV pool") <= 2, log[-2000:]
        assert "unreachable" in log


def test_full_hit_from_another_engine_gives_prefix_cache_answer(cluster: Cluster) -> None:
    p = tokens(1, 330)
    cold = complete(cluster.a, p)
    local_hit = complete(cluster.a, p)  # vLLM's own prefix cache: the oracle
    assert cold == local_hit
    wait_pooled(cluster, p)
    out, hits = loaded_on_b(cluster, p)
    assert out == local_hit
    assert hits == (330 - 1) // BS * BS  # every full block but none of the last token


def test_cross_instance_prefix_plus_new_suffix_loads_90_percent(cluster: Cluster) -> None:
    prefix = tokens(2, 330)
    complete(cluster.a, prefix)
    wait_pooled(cluster, prefix)
    q = prefix + tokens(3, 70)
    out, hits = loaded_on_b(cluster, q)  # before A sees q, so only the prefix is pooled
    assert out == complete(cluster.a, q)  # A: vLLM's own prefix hit on its blocks
    assert hits >= 0.9 * len(prefix)


def test_partial_hit_diverging_mid_block(cluster: Cluster) -> None:
    base = tokens(4, 300)
    complete(cluster.a, base)
    wait_pooled(cluster, base)
    q = base[:200] + tokens(5, 90)  # diverges inside block 6
    out, hits = loaded_on_b(cluster, q)
    assert out == complete(cluster.a, q)
    assert hits == 200 // BS * BS


def test_miss_loads_nothing(cluster: Cluster) -> None:
    q = tokens(6, 150)
    out, hits = loaded_on_b(cluster, q)
    assert hits == 0
    assert out == complete(cluster.a, q)


def test_connector_stats_reach_prometheus(cluster: Cluster) -> None:
    assert metric(cluster.b, "kvcake_connector_load_blocks_total") > 0
    assert metric(cluster.b, "kvcake_connector_load_bytes_total") > 0
    assert metric(cluster.b, "kvcake_connector_load_seconds_total") > 0
    assert metric(cluster.a, "kvcake_connector_save_blocks_total") > 0


def test_layer_wise_loads_are_waited_for_layer_by_layer_inside_vllm(cluster: Cluster) -> None:
    """B loads in 3 layer groups: vLLM's attention calls ``wait_for_layer_load`` per layer (else
    the loader would report every block and fall back to whole loads, with a warning), and the
    answers above came from those loads (the load counters moved; no block was reported)."""
    assert cluster.b.spec.connector_extra["load_layer_groups"] == 3
    assert "did not wait" not in cluster.b.log_text()
    assert metric(cluster.b, "kvcake_connector_load_error_blocks_total") == 0
    assert metric(cluster.b, "kvcake_connector_load_wait_seconds_total") > 0


def test_prefill_on_a_decode_on_b_through_the_pool(cluster: Cluster) -> None:
    """The pool hand-off (``kvcake_transport: pool``; the direct path is tests/.../test_pd.py)."""
    p = tokens(9, 330)
    body = {"model": "smollm2", "prompt": p, "max_tokens": 1, "temperature": 0,
            "kv_transfer_params": {"do_remote_decode": True, "kvcake_transport": "pool"}}  # fmt: skip
    r = httpx.post(cluster.a.url + "/v1/completions", json=body, timeout=180).json()
    params = r["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["kvcake_blocks"] == 330 // BS
    before = metric(cluster.b, HITS)
    body = {"model": "smollm2", "prompt": p, "max_tokens": 12, "temperature": 0,
            "return_token_ids": True, "kv_transfer_params": params}  # fmt: skip
    out = httpx.post(cluster.b.url + "/v1/completions", json=body, timeout=180).json()
    # B waited for A's background save instead of recomputing the prompt
    assert metric(cluster.b, HITS) - before == (330 - 1) // BS * BS
    assert out["choices"][0]["token_ids"] == complete(cluster.a, p)


def test_a_corrupted_pooled_block_is_recomputed_never_used(cluster: Cluster) -> None:
    """Issue 30 §1: one byte of a pooled block changed in the store-server's memory (a bit
    flip, a stray write, a range reused under a stale master). B's layer-wise load verifies
    each group before its layers are released; the block fails, it and the rest of its run
    are recomputed, and the answer is the cold one."""
    p = tokens(10, 330)
    oracle = complete(cluster.a, p)  # A's cold answer; A pools the blocks
    wait_pooled(cluster, p)
    model = f"{cluster.a.spec.model_dir.rstrip('/').rsplit('/', 1)[-1]}@vllm"
    victim = BlockNamer(model, "float32", BS).objects(p)[4]
    errors = metric(cluster.b, "kvcake_connector_load_error_blocks_total")
    logged = cluster.b.log_text().count("no replica verifies")
    with Client(master=cluster.master_addr) as client:
        rep = client.get_replica_desc(victim).replicas[0]
        b = bytearray(1)
        client.engine.read_into(rep.segment, rep.offset + 1000, b)
        b[0] ^= 0xFF
        client.engine.write(rep.segment, rep.offset + 1000, b)
    assert complete(cluster.b, p) == oracle
    assert wait_log(cluster.b, "no replica verifies", logged + 1, 10)  # the store's error
    deadline = time.monotonic() + 20
    while metric(cluster.b, "kvcake_connector_load_error_blocks_total") - errors < 6:
        assert time.monotonic() < deadline  # block 4 and the 5 after it in the run
        complete(cluster.b, [9, 9, 9, 9], max_tokens=2)  # a step flushes the worker's stats
    time.sleep(1.5)  # let B's pool back-off (1 s) end


def test_slow_store_past_deadline_recomputes(cluster: Cluster) -> None:
    p = tokens(7, 330)
    oracle = complete(cluster.a, p)
    wait_pooled(cluster, p)
    misses = metric(cluster.b, "kvcake_connector_load_deadline_misses_total")
    cluster.store.popen.send_signal(signal.SIGSTOP)  # B reads over TCP: its loads stall
    try:
        t0 = time.monotonic()
        out = complete(cluster.b, p)
        took = time.monotonic() - t0
    finally:
        cluster.store.popen.send_signal(signal.SIGCONT)
    assert out == oracle
    assert took < 60  # bounded by B's load_timeout_s (1 s) + the recompute, not by the store
    assert wait_log(cluster.b, "load failed (deadline", 1, 10)
    deadline = time.monotonic() + 20
    while metric(cluster.b, "kvcake_connector_load_deadline_misses_total") <= misses:
        assert time.monotonic() < deadline
        complete(cluster.b, [9, 9, 9, 9], max_tokens=2)  # a step flushes the worker's stats
    time.sleep(1.5)  # let B's pool back-off (1 s) end


def test_store_server_killed_between_requests_recomputes(cluster: Cluster) -> None:
    p = tokens(8, 330)
    oracle = complete(cluster.a, p)
    wait_pooled(cluster, p)
    errors_before = cluster.b.log_text().count("could not be loaded")
    cluster.store.popen.send_signal(signal.SIGKILL)
    cluster.store.popen.wait(10)
    out = complete(cluster.b, p)  # the master still lists the replicas: the load fails
    assert out == oracle
    assert wait_log(cluster.b, "could not be loaded", errors_before + 1, 10) or wait_log(
        cluster.b, "load failed", 1, 1
    )
