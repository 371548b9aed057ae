"""Tenants and API keys through a live cluster (issue 15 §3-§4; emulated backend, real
processes): OpenAI-style keys (401 with OpenAI's body, the `openai` SDK's AuthenticationError),
the tenant of a key / an `x-tenant-id` header / a `cache_salt` salting the block hashes, so an
equal prompt of another tenant reuses nothing (cached_tokens 0) while the same tenant reuses
its own, and the pool holds each tenant's blocks under its own keys."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from kvcake.core.hashing import block_hashes, block_key
from kvcake.launch.launcher import Cluster
from kvcake.proxy.auth import ApiKeys, salt_of
from kvcake.store.client import Client
from tests.cluster import make_cluster
from tests.waits import wait_until

KEY_A, KEY_B, KEY_OPEN = "sk-teamA-0123456789", "sk-teamB-0123456789", "sk-open-0123456789"
KEY_Q = "sk-teamQ-0123456789"  # a tenant whose store quota holds no block
PROMPT = [(7 * i + 3) % 900 + 20 for i in range(200)]  # 6 full blocks of 32 (192 tokens)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"# tenants\n{KEY_A}=teamA\n{KEY_B} = teamB\n{KEY_Q}=teamQ\n")
    mp = pytest.MonkeyPatch()
    mp.setenv("KVCAKE_MASTER_TENANT_QUOTAS", "teamQ=1KiB")  # less than one KV block
    c = make_cluster(
        tmp_path_factory.mktemp("tenants"),
        cluster={"prefill": 1, "decode": 1, "store_servers": 1, "store_size": "64MB"},
        proxy={"api_keys": [KEY_OPEN], "api_keys_file": str(keys)},
    )
    try:
        with c:
            yield c
    finally:
        mp.undo()


def complete(c: Cluster, key: str | None, prompt: object = PROMPT, **kw: object) -> httpx.Response:
    headers = dict(kw.pop("headers", {}) or {})  # type: ignore[call-overload]
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, **kw}
    return httpx.post(c.url + "/v1/completions", json=body, headers=headers, timeout=60)


def cached(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_missing_or_wrong_key_gets_openais_401(cluster: Cluster) -> None:
    r = complete(cluster, None)
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] is None
    assert "didn't provide an API key" in err["message"]
    r = complete(cluster, "sk-not-a-key-at-all")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert "sk-not-a-key-at-all" not in r.text  # redacted
    assert httpx.get(cluster.url + "/v1/models").status_code == 401
    ok = httpx.get(cluster.url + "/v1/models", headers={"Authorization": f"Bearer {KEY_OPEN}"})
    assert ok.status_code == 200
    assert httpx.get(cluster.url + "/health").status_code == 200  # probes stay open
    assert httpx.get(cluster.url + "/v1/cluster").status_code == 200  # kvcake status / top


def test_openai_sdk_sees_authentication_errors(cluster: Cluster) -> None:
    bad = openai.OpenAI(base_url=cluster.url + "/v1", api_key="sk-wrong-0000000000", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="x", prompt="hi", max_tokens=1)
    good = openai.OpenAI(base_url=cluster.url + "/v1", api_key=KEY_A, max_retries=0)
    out = good.completions.create(model=good.models.list().data[0].id, prompt="hi", max_tokens=1)
    assert out.usage is not None and out.usage.completion_tokens == 1


def test_equal_prompts_of_two_tenants_share_no_kv(cluster: Cluster) -> None:
    assert cached(complete(cluster, KEY_A)) == 0
    assert cached(complete(cluster, KEY_A)) == 192  # the same tenant reuses its blocks
    assert cached(complete(cluster, KEY_B)) == 0  # another tenant: nothing, not even the pool
    assert cached(complete(cluster, KEY_B)) == 192
    # An open key with an x-tenant-id header is a third tenant; a cache_salt a fourth chain.
    assert cached(complete(cluster, KEY_OPEN, headers={"x-tenant-id": "teamC"})) == 0
    assert cached(complete(cluster, KEY_A, cache_salt="conversation-1")) == 0
    assert cached(complete(cluster, KEY_A, cache_salt="conversation-1")) == 192
    assert cached(complete(cluster, KEY_A)) == 192  # teamA's unsalted chain is still there


def test_pool_holds_each_tenants_blocks_under_its_own_keys(cluster: Cluster) -> None:
    prompt = [(11 * i + 5) % 900 + 20 for i in range(200)]
    assert cached(complete(cluster, KEY_A, prompt)) == 0
    assert cached(complete(cluster, KEY_B, prompt)) == 0
    kv = cluster.conf.kv
    keys = {
        t: [block_key(kv.model, kv.dtype, kv.kv_block_tokens, h)
            for h in block_hashes(prompt, kv.kv_block_tokens, salt=salt_of(t, ""))]
        for t in ("teamA", "teamB", "")
    }  # fmt: skip
    assert not set(keys["teamA"]) & set(keys["teamB"])
    with Client(master=cluster.master_rpc) as store:
        found: dict[str, int] = {}

        def pooled() -> bool:
            found.update({t: sum(store.batch_is_exist(k)) for t, k in keys.items()})
            return found["teamA"] == found["teamB"] == 6

        # the prefill instance pools new blocks in the background
        wait_until(pooled, timeout=20, every_s=0.2, what="6 blocks of each tenant in the pool",
                   detail=lambda: found)  # fmt: skip
        assert found == {"teamA": 6, "teamB": 6, "": 0}, found


def test_tenant_facing_views_name_no_key_and_no_tenant(cluster: Cluster) -> None:
    """docs/store.md "What a tenant can learn": the open views (/v1/cluster, /metrics) give
    counts, never a pool key name or a tenant name; the pool's key listings need the store's
    secret (tests/store/test_auth_http.py, test_events_auth.py)."""
    prompt = [(19 * i + 4) % 900 + 20 for i in range(200)]
    assert cached(complete(cluster, KEY_A, prompt)) == 0
    kv = cluster.conf.kv
    names = [block_key(kv.model, kv.dtype, kv.kv_block_tokens, h).rpartition("/")[2]
             for h in block_hashes(prompt, kv.kv_block_tokens, salt="teamA")]  # fmt: skip
    for path in ("/v1/cluster", "/metrics"):
        text = httpx.get(cluster.url + path, timeout=10).text
        assert "teamA" not in text and not [n for n in names if n in text], path
    assert cached(complete(cluster, KEY_B, prompt)) == 0  # and B's usage tells nothing of A's


def test_store_quota_applies_to_the_serving_path(cluster: Cluster) -> None:
    """teamQ's quota is smaller than one block: its pooled puts (prefill's new blocks, decode's
    prompt + answer) are refused, its requests are still served, other tenants' blocks stay."""
    prompt = [(17 * i + 2) % 900 + 20 for i in range(200)]
    assert cached(complete(cluster, KEY_Q, prompt)) == 0
    assert cached(complete(cluster, KEY_Q, prompt)) == 192  # its own instance-local cache
    # The prefill instance's one pool-writer thread puts in order: once teamA's blocks are
    # in, teamQ's (queued before) were tried.
    assert cached(complete(cluster, KEY_A, prompt)) == 0
    kv = cluster.conf.kv
    keys = {
        t: [block_key(kv.model, kv.dtype, kv.kv_block_tokens, h)
            for h in block_hashes(prompt, kv.kv_block_tokens, salt=t)]
        for t in ("teamA", "teamQ")
    }  # fmt: skip
    with Client(master=cluster.master_rpc) as store:
        deadline = time.monotonic() + 20
        while sum(store.batch_is_exist(keys["teamA"])) < 6 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sum(store.batch_is_exist(keys["teamA"])) == 6
        assert sum(store.batch_is_exist(keys["teamQ"])) == 0


def test_malformed_tenant_ids_and_salts(cluster: Cluster) -> None:
    for bad in ("-leading-dash", "has space", "x" * 65, "ünïcode".encode()):
        r = complete(cluster, KEY_OPEN, headers={"x-tenant-id": bad})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_tenant", bad
    r = complete(cluster, KEY_A, headers={"x-tenant-id": "teamB"})  # not the key's tenant
    assert r.status_code == 403 and r.json()["error"]["code"] == "tenant_mismatch"
    for salt in (7, "", "s" * 257, ["a"]):
        r = complete(cluster, KEY_A, cache_salt=salt)
        assert r.status_code == 400 and "cache_salt" in r.json()["error"]["message"]


def test_api_key_config(tmp_path: Path) -> None:
    from kvcake.core.errors import ConfigError

    f = tmp_path / "k"
    f.write_text("sk-abcdefgh=t1\n\n# comment\nsk-ijklmnop\n")
    keys = ApiKeys.load(["sk-qrstuvwx=t2"], f)
    assert keys is not None and dict(keys.keys) == {
        "sk-qrstuvwx": "t2", "sk-abcdefgh": "t1", "sk-ijklmnop": ""
    }  # fmt: skip
    assert ApiKeys.load() is None
    with pytest.raises(ConfigError, match="8-256"):
        ApiKeys.load(["short"])
    with pytest.raises(ConfigError, match="bad tenant"):
        ApiKeys.load(["sk-abcdefgh=bad tenant"])
    with pytest.raises(ConfigError, match="api_keys_file"):
        ApiKeys.load([], tmp_path / "missing")
    assert (
        salt_of("t", "") == "t" and salt_of("", "s") == "salt:s" and salt_of("t", "s") == "t/salt:s"
    )
