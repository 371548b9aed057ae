"""A whole cluster with the shared secret (issue 15 §3; emulated backend, real processes on
loopback): `kvcake up` children inherit KVCAKE_AUTH_SECRET, so master RPC, directory, every
Transfer Engine, the storage node and the instances' /rpc API authenticate each connection and
a request still runs end to end with pooled reuse; an unsigned /rpc call is refused with 401
before the instance reads its body, a store client without the secret gets Unauthorized."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from kvcake.core import auth
from kvcake.core.http_auth import INSTANCE_HTTP as INSTANCE
from kvcake.launch.launcher import Cluster
from kvcake.store.client import Client
from kvcake.store.errors import Unauthorized
from tests.cluster import make_cluster

SECRET = "serve-auth-test-secret-0123456789abcdef"
PROMPT = [(13 * i + 1) % 900 + 20 for i in range(200)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    mp = pytest.MonkeyPatch()
    mp.setenv("KVCAKE_AUTH_SECRET", SECRET)  # this process (the test's clients) and children
    c = make_cluster(
        tmp_path_factory.mktemp("auth"),
        cluster={"prefill": 1, "decode": 1, "store_servers": 1, "store_size": "64MB"},
    )
    try:
        with c:
            yield c
    finally:
        mp.undo()


def test_requests_run_end_to_end_with_the_secret(cluster: Cluster) -> None:
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0}
    first = httpx.post(cluster.url + "/v1/completions", json=body, timeout=60)
    assert first.status_code == 200, first.text
    second = httpx.post(cluster.url + "/v1/completions", json=body, timeout=60).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 192
    assert second["kvcake"]["token_ids"] == first.json()["kvcake"]["token_ids"]


def test_unsigned_instance_calls_are_refused(cluster: Cluster) -> None:
    url = cluster.instance_urls["prefill-0"]
    task = {"request_id": "intruder", "prompt_tokens": [300] * 40, "block_hashes": [],
            "sampling": {"max_tokens": 1}}  # fmt: skip
    for path in ("/rpc/prefill", "/rpc/info", "/rpc/state", "/rpc/kv"):
        r = httpx.request("POST" if path == "/rpc/prefill" else "GET", url + path, json=task)
        assert r.status_code == 401, (path, r.text)
    bad = auth.Authenticator(b"a-different-secret-0000000000")
    r = httpx.get(url + "/rpc/info", headers=bad.http_headers("GET", url + "/rpc/info", INSTANCE))
    assert r.status_code == 401
    good = auth.Authenticator(SECRET.encode())
    signed = good.http_headers("GET", url + "/rpc/info", INSTANCE)
    assert httpx.get(url + "/rpc/info", headers=signed).status_code == 200
    assert httpx.get(url + "/rpc/info", headers=signed).status_code == 401  # once only
    assert httpx.get(url + "/health").status_code == 200


def test_store_client_without_the_secret_is_refused(cluster: Cluster) -> None:
    with pytest.raises(Unauthorized):
        Client(master=cluster.master_rpc, auth=auth.DISABLED)
    with Client(master=cluster.master_rpc) as c:  # the environment's secret
        assert not c.is_exist("nothing/here")


def test_admin_http_needs_and_gets_the_secret(cluster: Cluster) -> None:
    """The master's admin HTTP refuses unsigned calls; `kvcake top` signs its own."""
    from kvcake.proxy.top_view import fetch

    master_http = cluster.child("master").info["http"]
    assert httpx.get(f"http://{master_http}/get_all_keys").status_code == 401
    assert httpx.get(f"http://{master_http}/health").status_code == 200
    snap = fetch(cluster.url, master_http)
    assert not snap.errors, snap.errors
