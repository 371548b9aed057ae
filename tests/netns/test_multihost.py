"""A cluster over emulated hosts (one network namespace each, TCP between them, no shared
memory): pooled KV reused from another host, and a partitioned storage node."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvcake.launch.netns_cluster import NetnsCluster, NetnsOptions
from tests.netns.worker import CHECK, EVENTS, PUT
from tests.waits import wait_until


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[object]:
    made: list[NetnsCluster] = []

    def make(**kw: object) -> NetnsCluster:
        c = NetnsCluster(NetnsOptions(**kw), tmp_path / f"run{len(made)}")  # type: ignore[arg-type]
        made.append(c)
        c.start()
        return c

    yield make
    for c in made:
        c.stop()
        names = {h.ns for h in c.net.hosts.values()} | {c.net.switch}
        assert not names & set(_netns_list()), "namespaces left behind"


def _netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()]


def _pool_keys(c: NetnsCluster) -> list[str]:
    http = c.proc("master").info["http"]
    with c.net.inside("client"):
        r = httpx.get(f"http://{http}/get_all_keys", timeout=10,
                      headers={"Authorization": f"Bearer {c.secret}"})  # fmt: skip
    r.raise_for_status()
    body = r.json()
    return list(body.get("keys", body) if isinstance(body, dict) else body)


@pytest.mark.timeout(300)
def test_pooled_kv_is_reused_from_another_host(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """prefill-0 computes a prompt and pools its blocks on the storage hosts; with prefill-0
    gone, the same prompt on prefill-1 (another host) is served from the pool over TCP (with a
    bandwidth cap and added RPC latency on every link)."""
    c = cluster_factory(prefill=2, decode=1, stores=2, rate="1gbit", delay_ms=2.0)
    block = c.conf.kv.kv_block_tokens
    prompt = [300 + (i * 7) % 200 for i in range(8 * block)]
    body = {"prompt": prompt, "max_tokens": 4, "ignore_eos": True}
    first = c.http("POST", "/v1/completions", json=body)
    assert first.status_code == 200, first.text
    holder = first.headers["x-kvcake-prefill"]
    other = "prefill-1" if holder.endswith("prefill-0") else "prefill-0"
    # the background pool put lands
    wait_until(lambda: len(_pool_keys(c)) >= 8, timeout=60, every_s=0.3,
               what="8 blocks in the pool", detail=lambda: _pool_keys(c))  # fmt: skip
    c.proc(holder).proc.kill()

    def served_by_the_other() -> httpx.Response | None:
        r = c.http("POST", "/v1/completions", json=body)
        ok = r.status_code == 200 and r.headers["x-kvcake-prefill"].endswith(other)
        return r if ok else None

    again = wait_until(served_by_the_other, timeout=90, every_s=0.5,
                       what="the surviving prefill host serving the prompt")  # fmt: skip
    cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 7 * block, again.json()["usage"]  # all but the last block from the pool
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]


@pytest.mark.timeout(300)
def test_partitioned_storage_node_loses_only_its_objects(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """Cut store-1's link: a read of one of its objects gives up within the client's timeouts
    (no hang), its objects leave the pool after the client TTL, every other object reads back
    intact."""
    ttl = 3.0
    c = cluster_factory(prefill=1, decode=1, stores=3, client_ttl_s=ttl)
    client = c.net["client"].addr
    r = _run(c, PUT, [c.master, client, "60"], "", 120)
    where = json.loads(r)
    segs = {s for v in where.values() for s in v}
    assert {"store-0", "store-1", "store-2"} <= segs, segs  # placed on every node
    # The master's KV events reach another host encrypted (CURVE, keys from the cluster's
    # secret); a plain subscriber there receives nothing.
    ev = json.loads(_run(c, EVENTS, [c.master, client], "", 60))
    assert ev["address"].startswith(f"tcp://{c.net['master'].addr}:"), ev
    assert "netns-events/probe" in ev["secret"] and ev["plain"] == [], ev
    c.net.partition("store-1")
    t = time.monotonic()
    out = json.loads(_run(c, CHECK, [c.master, client, "store-1", str(ttl)], json.dumps(where),
                          120))  # fmt: skip
    assert time.monotonic() - t < 100
    assert out["first_get"] != "ok" and out["first_get_s"] < 30, out  # gave up, did not hang
    assert out["gone_after_s"] is not None and out["gone_after_s"] < ttl + 30, out
    lost = sum("store-1" in v for v in where.values())
    assert out["intact"] == len(where) - lost and out["bad"] == [], out


def _run(c: NetnsCluster, code: str, args: list[str], stdin: str, timeout: float) -> str:
    r = c.run_python("client", code, args, stdin, timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]
