"""The instance RPCs of one request say each thing once (real emulated cluster, raw HTTP).

The proxy's ``PrefillTask`` is the only message with the prompt; the prefill instance reserves
the decode KV itself and hands the prompt over with it, so the proxy's ``StreamRequest`` names
only the request and its first token. The prefill checks the proxy's block hashes with two
hashes (first and last block), not the whole chain.
"""

from __future__ import annotations

import json

import httpx

from kvcake.core.hashing import block_hashes
from kvcake.core.ports import free_port
from kvcake.launch.launcher import Cluster

PROMPT = [300 + i % 97 for i in range(110)]  # 3 full blocks of 32 tokens


def _task(rid: str, hashes: list[int], decode: dict[str, object] | None,
          salt: str = "") -> dict[str, object]:  # fmt: skip
    return {"request_id": rid, "prompt_tokens": PROMPT, "block_hashes": hashes,
            "sampling": {"max_tokens": 3, "ignore_eos": True, "cache_salt": salt},
            "decode": decode}  # fmt: skip


def _bt(url: str) -> int:
    return int(httpx.get(url + "/rpc/info", timeout=10).json()["block_tokens"])


def test_prompt_goes_once_and_the_decode_gets_it_from_the_prefill(
    emulated_cluster: Cluster,
) -> None:
    p_url = emulated_cluster.instance_urls["prefill-0"]
    d_url = emulated_cluster.instance_urls["decode-0"]
    hashes = [int(h) for h in block_hashes(PROMPT, _bt(p_url))]
    target = {"instance_id": "decode-0", "url": d_url, "num_tokens": len(PROMPT) + 3}
    r = httpx.post(p_url + "/rpc/prefill", json=_task("path-1", hashes, target), timeout=60)
    assert r.status_code == 200, r.text
    first = r.json()["first_token"]
    assert r.json()["timings"]["decode_wait_s"] >= 0.0  # it reserved on the decode itself
    stream = {"request_id": "path-1", "first_token": first}  # no prompt, no sampling
    with httpx.stream("POST", d_url + "/rpc/stream", json=stream, timeout=60) as s:
        assert s.status_code == 200
        chunks = [json.loads(line) for line in s.iter_lines() if line]
    assert chunks[-1]["finish_reason"] == "length"  # max_tokens from the prefill's handover
    assert sum(len(c["token_ids"]) for c in chunks) == 2  # + the first token = max_tokens
    acct = httpx.get(d_url + "/rpc/kv", timeout=10).json()
    assert acct["reservations"] == 0 and acct["fenced"] == 0, acct


def test_prefill_checks_first_and_last_block_hash(emulated_cluster: Cluster) -> None:
    p_url = emulated_cluster.instance_urls["prefill-0"]
    good = [int(h) for h in block_hashes(PROMPT, _bt(p_url))]
    salted = [int(h) for h in block_hashes(PROMPT, _bt(p_url), salt="tenant-a")]
    assert len(good) >= 3
    for hashes, salt in (
        ([*good[:-1], good[-1] ^ 1], ""),  # the prompt's end does not match
        (salted, ""),  # hashed under another tenant's root
        (good, "tenant-a"),  # the request's salt is not the one hashed with
        (good[:-1], ""),  # a block short (another kv_block_tokens)
    ):
        r = httpx.post(p_url + "/rpc/prefill", json=_task("bad", hashes, None, salt), timeout=10)
        assert r.status_code == 400 and "block_hashes" in r.text, r.text


def test_unreachable_decode_is_named_to_the_proxy(emulated_cluster: Cluster) -> None:
    """The prefill cannot reach the decode instance it should reserve on: a 503 naming that
    instance (the proxy marks it dead and re-places the request), nothing left allocated."""
    p_url = emulated_cluster.instance_urls["prefill-0"]
    hashes = [int(h) for h in block_hashes(PROMPT, _bt(p_url))]
    target = {"instance_id": "decode-9", "url": f"http://127.0.0.1:{free_port()}",
              "num_tokens": len(PROMPT) + 3}  # fmt: skip
    r = httpx.post(p_url + "/rpc/prefill", json=_task("path-2", hashes, target), timeout=60)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["instance"] == "decode-9"
    assert httpx.get(p_url + "/rpc/kv", timeout=10).json()["used"] == 0
