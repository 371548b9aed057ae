"""Routers' cache queries on a real master's HTTP (store/router_queries.py), signed as every
master route: Mooncake's ``GET /batch_query_keys`` and RFC 1403's ``POST /query`` (longest
prefix per tenant and instance, per medium), malformed input -> 400 with a message."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from kvcake.core import auth
from kvcake.core.hashing import block_hashes, block_key, rank_key
from kvcake.core.http_auth import MASTER_HTTP
from kvcake.net.httpserve import client_auth
from kvcake.store.client import Client
from kvcake.store.config import MasterConfig, StoreServerConfig
from kvcake.store.master_server import Master
from kvcake.store.server import StoreServer

GOOD = auth.Authenticator(b"router-queries-test-secret-0123456789")
TOKENS = list(range(7000, 7000 + 4 * 16))
Q = {"model": "m", "dtype": "f16", "block_size": 16, "token_ids": TOKENS}


@pytest.fixture(scope="module")
def master() -> Iterator[Master]:
    m = Master(MasterConfig(port=0, http_port=0, events_port=-1), auth=GOOD)
    m.start()
    node = StoreServer(
        StoreServerConfig(master=m.rpc_address, segment_size=4 << 20, http_port=-1), auth=GOOD
    )
    node.start()
    try:
        keys = [rank_key(block_key("m", "f16", 16, h), 0, 1) for h in block_hashes(TOKENS, 16)]
        with Client(master=m.rpc_address, auth=GOOD) as c:
            assert all(r is None for r in c.batch_put(keys[:3], [b"z" * 128] * 3))
        yield m
    finally:
        node.stop()
        m.stop()


@pytest.fixture
def http(master: Master) -> Iterator[httpx.Client]:
    base = f"http://{master.http_address}"
    with httpx.Client(base_url=base, auth=client_auth(GOOD, MASTER_HTTP)) as h:
        yield h


def test_query_longest_prefix_per_medium_and_tenant(http: httpx.Client) -> None:
    r = http.post("/query", json=Q)
    assert r.status_code == 200, r.text
    hit = r.json()["default"]["kvcake-pool"]
    assert hit == {"longest_matched": 48, "GPU": 0, "CPU": 48, "DISK": 0, "DP": {}}
    other = http.post("/query", json={**Q, "tenant_id": "acme"}).json()
    assert other == {"acme": {}}  # another tenant's chain: none of these blocks
    shifted = http.post("/query", json={**Q, "token_ids": [1, *TOKENS]}).json()
    assert shifted == {"default": {}}


def test_batch_query_keys_mooncake_shape(http: httpx.Client) -> None:
    k = rank_key(block_key("m", "f16", 16, block_hashes(TOKENS, 16)[0]), 0, 1)
    r = http.get("/batch_query_keys", params={"keys": f"{k},missing"})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert r.json()["success"] is True and data["missing"] == {
        "ok": False,
        "error": "OBJECT_NOT_FOUND",
    }
    (rep,) = data[k]["values"]
    assert data[k]["ok"] and data[k]["disk_values"] == [] and rep["size_"] == 128


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ([1, 2], "JSON object"),
        ({**Q, "model": None}, "'model'"),
        ({**Q, "block_size": 0}, "block_size"),
        ({**Q, "token_ids": [1, -2]}, "token_ids"),
        ({**Q, "token_ids": "abc"}, "'token_ids'"),
        ({**Q, "tenant_id": 5}, "'tenant_id'"),
    ],
)
def test_malformed_queries_are_400(http: httpx.Client, body: object, why: str) -> None:
    r = http.post("/query", json=body)
    assert r.status_code == 400 and why in r.json()["error"], r.text


def test_bad_batch_queries_and_unsigned_requests(http: httpx.Client, master: Master) -> None:
    assert http.get("/batch_query_keys").status_code == 400
    many = ",".join(f"k{i}" for i in range(1001))
    assert "at most 1000" in http.get("/batch_query_keys", params={"keys": many}).json()["error"]
    r = http.post("/query", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    plain = httpx.post(f"http://{master.http_address}/query", json=Q)
    assert plain.status_code == 401
