"""Per-request KV attribution on a live emulated cluster (2 prefill, 1 decode, a master and one
small storage node): where each prompt token's KV came from and why the others were computed,
in the response, in /metrics and in the request log. The tests run in file order on one
cluster; the last one kills the storage node."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvcake.core.hashing import block_hashes, block_key
from kvcake.core.promtext import Series, parse_metrics
from kvcake.launch.launcher import Cluster
from tests.cluster import make_cluster
from tests.waits import wait_until

BT = 32
P1 = list(range(1000, 1200))  # 200 tokens: 6 full blocks + 8
P3 = list(range(5000, 5200))
RESPONSES: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def cl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = make_cluster(
        tmp_path_factory.mktemp("attr"),
        cluster={"prefill": 2, "decode": 1, "store_servers": 1, "store_size": "1MB"},
        instance={"kv_blocks": 64, "warmup_tokens": 0},  # small caches: evictions come quickly
        proxy={"metrics_names": "both"},
    )
    with c:
        yield c
    from kvcake.transfer import cleanup_stale

    cleanup_stale()  # the SIGKILLed storage node could not remove its /dev/shm segment


def post(c: Cluster, prompt: list[int], max_tokens: int = 2) -> dict[str, Any]:
    r = httpx.post(c.url + "/v1/completions", timeout=120,
                   json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})  # fmt: skip
    assert r.status_code == 200, r.text
    doc = r.json()
    doc["_prefill"] = r.headers["x-kvcake-prefill"]
    RESPONSES.append(doc)
    return doc


def kv(doc: dict[str, Any]) -> dict[str, Any]:
    ext = doc["usage"]["kvcake"]
    assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == (
        doc["usage"]["prompt_tokens"] - ext["computed_tokens"]
    )
    return ext


def pool_keys(c: Cluster) -> set[str]:
    http = c.child("master").info["http"]
    return set(httpx.get(f"http://{http}/get_all_keys", timeout=10).json())


def keys_of(c: Cluster, prompt: list[int]) -> set[str]:
    kvc = c.conf.kv
    return {str(block_key(kvc.model, kvc.dtype, BT, h)) for h in block_hashes(prompt, BT)}


def wait_pooled(c: Cluster, prompt: list[int], timeout: float = 20.0) -> None:
    want = keys_of(c, prompt)
    wait_until(lambda: want <= pool_keys(c), timeout=timeout, every_s=0.1,
               what="the prompt's blocks in the pool")  # fmt: skip
    time.sleep(0.3)  # the proxy's pool index follows the master's events


def wait_alive(c: Cluster, instance: str, alive: bool, timeout: float = 60.0) -> None:
    def seen() -> bool:
        rows = {r["id"]: r for r in httpx.get(c.url + "/v1/cluster").json()["instances"]}
        return rows[instance]["alive"] is alive

    wait_until(seen, timeout=timeout, what=f"{instance} alive={alive}")


def settle(c: Cluster) -> None:
    """Until the proxy's view of the instances (pulled every poll interval, so it lags a
    response) includes everything they did before now: two more completed polls. Only then is
    where a prompt goes a question of the caches, not of the view's age."""

    def polls() -> int:
        return int(httpx.get(c.url + "/v1/cluster", timeout=10).json()["polls"])

    start = polls()
    wait_until(lambda: polls() >= start + 2, timeout=30, what="two polls of the instances")


def kill(c: Cluster, instance: str) -> None:
    """SIGKILL an instance: the proxy drops it (and its cached blocks) at its next poll."""
    c.child(instance).proc.kill()  # type: ignore[union-attr]
    c.child(instance).proc.wait()  # type: ignore[union-attr]
    wait_alive(c, instance, False)


def test_first_request_is_computed_never_seen(cl: Cluster) -> None:
    a = kv(post(cl, P1))
    assert a["computed_tokens"] == 200 and a["local_tokens"] == 0
    assert a["miss_reasons"] == {"never_seen": 192, "last_block": 8}


def test_repeat_is_served_from_the_local_cache(cl: Cluster) -> None:
    settle(cl)
    doc = post(cl, P1)
    a = kv(doc)
    assert doc["_prefill"] == RESPONSES[0]["_prefill"]
    assert a["local_tokens"] == 192 and a["pool_dram_tokens"] == {}
    assert a["miss_reasons"] == {"last_block": 8}


def test_streaming_usage_chunk_carries_the_attribution(cl: Cluster) -> None:
    body = {"prompt": P1, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", cl.url + "/v1/completions", json=body, timeout=60) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
        prefill = r.headers["x-kvcake-prefill"]
    usage = chunks[-1]["usage"]
    RESPONSES.append({"usage": usage, "_prefill": prefill, "model": chunks[-1]["model"]})
    a = kv(RESPONSES[-1])
    assert a["local_tokens"] == 192 and a["miss_reasons"] == {"last_block": 8}


def test_other_instance_reads_the_pool_and_names_the_node(cl: Cluster) -> None:
    from kvcake.transfer import cleanup_stale

    wait_pooled(cl, P1)
    holder = RESPONSES[0]["_prefill"]
    kill(cl, holder)  # its cached copy is gone; the pool's (store-0) is not
    doc = post(cl, P1)
    assert doc["_prefill"] != holder
    a = kv(doc)
    assert a["pool_dram_tokens"] == {"store-0": 192}, a
    assert a["local_tokens"] == 0 and a["miss_reasons"] == {"last_block": 8}
    cleanup_stale()  # the killed instance's /dev/shm KV segment
    cl.respawn(cl.child(holder))  # back with an empty cache, for the tests below
    wait_alive(cl, holder, True)


def test_blocks_read_from_the_ssd_tier_are_ssd_tokens(
    cl: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A second storage node with a disk tier (and 64 KB of DRAM): under pool pressure the
    master offloads the oldest memory copies to its disk; a prefix read then comes from SSD.
    Runs while the pool is still fresh (the housekeeper offloads; a pool under allocation
    pressure drops memory copies instead)."""
    from tests.store.procs import spawn

    ssd = spawn(
        "store-server", "--master", cl.child("master").info["rpc"], "--segment-size", "65536",
        "--ssd-dir", str(tmp_path_factory.mktemp("ssd")), "--ssd-quota", "64MB",
        "--name", "ssd-0", ready="store-server",
    )  # fmt: skip
    try:
        p4 = list(range(8000, 8200))
        kv(post(cl, p4))
        wait_pooled(cl, p4)
        http = cl.child("master").info["http"]
        kvc = cl.conf.kv
        keys = [str(block_key(kvc.model, kvc.dtype, BT, h)) for h in block_hashes(p4, BT)]

        def tiers(key: str) -> set[str]:
            r = httpx.get(f"http://{http}/query_key", params={"key": key}, timeout=10)
            return {rep["tier"] for rep in r.json().get("replicas", [])} if r.is_success else set()

        # prompts sharing P4's first block follow it to its instance and push the rest of P4
        # out of that instance's cache; in the pool, block 0 must stay (any tier) and block 1
        # must be on disk only
        k, end = 0, time.monotonic() + 90
        while not (tiers(keys[0]) and tiers(keys[1]) == {"disk"}):
            assert time.monotonic() < end, "P4's second block never ended up on disk only"
            post(cl, p4[:BT] + [(20000 + k * 400 + i) % 31000 for i in range(288)], 1)
            time.sleep(0.3)  # let the housekeeper offload
            k += 1
        settle(cl)
        a = kv(post(cl, p4))
        assert a["ssd_tokens"] >= 32 and a["ssd_tokens_by_node"] == {"ssd-0": a["ssd_tokens"]}, (
            json.dumps(a)
        )
    finally:
        ssd.stop()
    time.sleep(0.5)  # the node unmounted: the pool is back to store-0's 1 MB


def test_evicted_blocks_are_reported_as_evicted(cl: Cluster) -> None:
    # P2 lives on one prefill instance, the decode instance and the pool. 14 prompts that
    # share P2's first block (so they follow it to the same instance) but not the rest: 126
    # new blocks, more than any instance's 64 and the ~80 the 1 MB pool keeps, push P2's
    # other blocks out of every cache (LRU)
    p2 = list(range(3000, 3200))
    kv(post(cl, p2))
    wait_pooled(cl, p2)
    rest = keys_of(cl, p2) - keys_of(cl, p2[:BT])
    k = 0
    end = time.monotonic() + 60
    while k < 14 or rest & pool_keys(cl):
        assert time.monotonic() < end, "P2 was never evicted from the pool"
        post(cl, p2[:BT] + [(10000 + k * 400 + i) % 31000 for i in range(288)], 1)
        k += 1
    settle(cl)
    a = kv(post(cl, p2))
    reasons = a["miss_reasons"]
    assert reasons.get("evicted", 0) >= 160 and "never_seen" not in reasons, a
    assert reasons["last_block"] == 8


def scrape(c: Cluster) -> Series:
    return parse_metrics(httpx.get(c.url + "/metrics").text)


def test_metrics_agree_with_the_responses(cl: Cluster) -> None:
    m = scrape(cl)
    model = RESPONSES[0]["model"]

    def val(name: str, **labels: str) -> float:
        return m.get((name, tuple(sorted({"model_name": model, **labels}.items()))), 0.0)

    tiers: dict[tuple[str, str], int] = {}
    reasons: dict[str, int] = {}
    for doc in RESPONSES:
        a = kv(doc)
        tiers[("local", "")] = tiers.get(("local", ""), 0) + a["local_tokens"]
        tiers[("computed", "")] = tiers.get(("computed", ""), 0) + a["computed_tokens"]
        for node, n in a["pool_dram_tokens"].items():
            tiers[("pool_dram", node)] = tiers.get(("pool_dram", node), 0) + n
        for node, n in a["ssd_tokens_by_node"].items():
            tiers[("ssd", node)] = tiers.get(("ssd", node), 0) + n
        for r, n in a["miss_reasons"].items():
            reasons[r] = reasons.get(r, 0) + n
    for (tier, node), n in tiers.items():
        assert val("kvcake_proxy_kv_tier_tokens_total", tier=tier, node=node) == n, (tier, node)
    for r, n in reasons.items():
        assert val("kvcake_proxy_kv_miss_tokens_total", reason=r) == n, r
    total = sum(d["usage"]["prompt_tokens"] for d in RESPONSES)
    assert val("kvcake:prompt_tokens_total") == total
    # the same series under vLLM's names, told apart by component
    vl = {"component": "kvcake-proxy", "engine": "kvcake-proxy"}
    assert val("vllm:prompt_tokens_total", **vl) == total
    assert val("vllm:request_prompt_tokens_count", **vl) == len(RESPONSES)
    assert val("vllm:request_queue_time_seconds_count", **vl) == len(RESPONSES)
    assert val("vllm:request_decode_time_seconds_count", **vl) == len(RESPONSES)
    assert ("vllm:num_preemptions_total", tuple(sorted({"model_name": model, **vl}.items()))) in m
    src = {s: val("kvcake:prompt_tokens_by_source_total", source=s)
           for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}  # fmt: skip
    assert src["local_compute"] == tiers[("computed", "")]
    assert src["external_kv_transfer"] == tiers[("pool_dram", "store-0")] + tiers[("ssd", "ssd-0")]
    text = httpx.get(cl.url + "/metrics").text
    assert "_created" not in text


def test_master_exports_mooncake_metric_names(cl: Cluster) -> None:
    http = cl.child("master").info["http"]
    m = parse_metrics(httpx.get(f"http://{http}/metrics", timeout=10).text)
    assert m[("master_total_capacity_bytes", ())] == 1_000_000  # the one 1 MB storage node
    assert m[("segment_total_capacity_bytes", (("segment", "store-0"),))] == 1_000_000
    used = m[("segment_allocated_bytes", (("segment", "store-0"),))]
    assert m[("master_allocated_bytes", ())] == used > 0
    assert m[("master_key_count", ())] >= len(pool_keys(cl)) > 0
    assert m[("master_evicted_key_count", ())] > 0  # the eviction test above
    assert m[("master_evicted_size_bytes", ())] > 0
    assert ("master_put_start_failures_total", ()) in m
    assert m[("master_active_clients", ())] >= 3  # two prefill + one decode instance
    for url in [f"http://{http}", *cl.instance_urls.values()]:
        assert "_created" not in httpx.get(url + "/metrics", timeout=10).text, url


def log_lines(c: Cluster) -> list[dict[str, Any]]:
    path = Path(c.run_dir) / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_request_log_has_one_line_per_request(cl: Cluster) -> None:
    lines = log_lines(cl)
    by_id = {ln["request_id"]: ln for ln in lines}
    assert len(by_id) == len(RESPONSES)
    first = lines[0]
    assert first["kv"] == RESPONSES[0]["usage"]["kvcake"]
    assert first["block_hashes"] == [f"{int(h):016x}" for h in block_hashes(P1, BT)]
    assert first["outcome"] == "length" and first["prefill"] == RESPONSES[0]["_prefill"]
    assert first["ttft_s"] > 0 and first["queue_s"] >= 0 and first["prefill_s"] > 0


def test_kvcake_logs_and_plan_read_the_live_log(
    cl: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvcake.cli import main
    from kvcake.commands.plan import load_any

    path = str(Path(cl.run_dir) / "requests.jsonl")
    assert main(["logs", "--file", path, "--tier", "pool_dram", "--json"]) == 0
    hits = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [h["kv"] for h in hits] == [
        d["usage"]["kvcake"] for d in RESPONSES if d["usage"]["kvcake"]["pool_dram_tokens"]
    ]
    assert main(["logs", "--file", path, "--reason", "evicted", "--json"]) == 0
    evicted = [d for d in RESPONSES if "evicted" in d["usage"]["kvcake"]["miss_reasons"]]
    assert len(capsys.readouterr().out.splitlines()) == len(evicted) >= 1
    state = str(Path(cl.conf.cluster.run_dir) / "latest.json")  # what `kvcake logs` reads
    assert main(["logs", "--state", state, "--limit", "0", "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(RESPONSES)
    trace = load_any(path, tokenizer="bytes")
    assert len(trace) == len(RESPONSES)
    p1 = [t for t in trace if t.input_length == 200][:3]  # P1 three times: one prefix
    assert p1[0].hash_ids == p1[1].hash_ids == p1[2].hash_ids


def test_failed_fetch_is_reported_as_fetch_failed(cl: Cluster) -> None:
    first = post(cl, P3)
    wait_pooled(cl, P3)
    holder = first["_prefill"]
    kill(cl, holder)
    cl.child("store-0").proc.kill()  # type: ignore[union-attr]
    doc = post(cl, P3)  # the master still lists store-0's replicas: the read fails
    assert doc["_prefill"] != holder
    a = kv(doc)
    assert a["miss_reasons"] == {"fetch_failed": 192, "last_block": 8}, a
    assert a["pool_dram_tokens"] == {}
