"""Signed HTTP requests cannot be replayed (issue 32 §1): a header captured from a legit
``PUT /metadata?key=victim`` is refused (401) with another key, body, method, at another
server sharing the secret, and outside the time window; the legit request passes once; a full
nonce cache refuses new requests (503) without evicting a live nonce."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from kvcake.core import auth
from kvcake.core.errors import ConfigError
from kvcake.core.http_auth import (
    HEADER,
    MASTER_HTTP,
    NODE_HTTP,
    HttpPolicy,
    HttpRefused,
    HttpVerifier,
)
from kvcake.net.httpserve import client_auth
from kvcake.store.config import MasterConfig
from kvcake.store.master_server import Master

SECRET = b"http-replay-test-secret-0123456789"
GOOD = auth.Authenticator(SECRET)


def _master(a: auth.Authenticator) -> Master:
    m = Master(MasterConfig(port=0, http_port=0, events_port=-1), auth=a)
    m.start()
    return m


@pytest.fixture(scope="module")
def masters() -> Iterator[tuple[Master, Master]]:
    a, b = _master(GOOD), _master(GOOD)  # two servers sharing the secret
    yield a, b
    a.stop()
    b.stop()


def _refused(r: httpx.Response, why: str) -> None:
    assert r.status_code == 401, r.text
    assert why in r.json()["error"], r.json()


def test_captured_header_is_refused_everywhere_else(masters: tuple[Master, Master]) -> None:
    a, b = masters
    url = f"http://{a.http_address}/metadata?key=victim"
    h = GOOD.http_headers("PUT", url, MASTER_HTTP, b"legit")  # captured, not yet sent
    other_key = url.replace("victim", "other")
    _refused(httpx.put(other_key, headers=h, content=b"legit"), "bad signature")
    _refused(httpx.put(url, headers=h, content=b"evil"), "not the signed body")
    _refused(httpx.put(url, headers=h), "not the signed body")  # the empty body too
    _refused(httpx.delete(url, headers=h), "bad signature")
    at_b = f"http://{b.http_address}/metadata?key=victim"
    _refused(httpx.put(at_b, headers=h, content=b"legit"), "another server")
    # The refusals burnt no nonce: the legit request passes, once.
    assert httpx.put(url, headers=h, content=b"legit").status_code == 200
    _refused(httpx.put(url, headers=h, content=b"legit"), "already seen")
    assert a.metadata_kv.get("victim") == b"legit" and b.metadata_kv.get("victim") is None
    assert a.metadata_kv.get("other") is None


def test_time_window_and_other_services(masters: tuple[Master, Master]) -> None:
    a, _ = masters
    url = f"http://{a.http_address}/get_all_keys"
    now = time.time()
    _refused(httpx.get(url, headers=GOOD.http_headers("GET", url, MASTER_HTTP, now=now - 31)),
             "outside")  # fmt: skip
    _refused(httpx.get(url, headers=GOOD.http_headers("GET", url, MASTER_HTTP, now=now + 20)),
             "outside")  # fmt: skip
    _refused(httpx.get(url, headers=GOOD.http_headers("GET", url, NODE_HTTP)), "signed for")
    wrong = auth.Authenticator(b"someone-elses-secret-987654321")
    _refused(httpx.get(url, headers=wrong.http_headers("GET", url, MASTER_HTTP)), "signature")
    _refused(httpx.get(url), "no valid")
    _refused(httpx.get(url, headers={HEADER: "v=2,t=1,n=zz,aud=x,b=,mac=00"}), "no valid")
    huge = f"v=2,t={'9' * 5000},n={'0' * 32},aud=master-http@h:{'1' * 5000},b=,mac=00"
    _refused(httpx.get(url, headers={HEADER: huge}), "no valid")  # a typed refusal, not a 500
    huge = f"v=2,t={int(now)},n={'0' * 32},aud=master-http@h:{'1' * 5000},b=,mac=00"
    _refused(httpx.get(url, headers={HEADER: huge}), "signed for")
    _refused(httpx.get(url, headers={"Authorization": "Bearer not-the-secret"}), "bearer")
    ok = httpx.get(url, headers={"Authorization": f"Bearer {SECRET.decode()}"})
    assert ok.status_code == 200  # the private-network form
    # A host name that resolves to the address reached is the same audience.
    port = a.http_address.rsplit(":", 1)[1]
    by_name = f"http://localhost:{port}/get_all_keys"
    r = httpx.get(by_name, headers=GOOD.http_headers("GET", by_name, MASTER_HTTP))
    assert r.status_code == 200, r.text
    # A wildcard address (what a server bound to 0.0.0.0 announces) reaches loopback.
    wild = f"http://0.0.0.0:{port}/get_all_keys"
    r = httpx.get(wild, headers=GOOD.http_headers("GET", wild, MASTER_HTTP))
    assert r.status_code == 200, r.text


def test_signing_client_streams_and_empty_bodies(masters: tuple[Master, Master]) -> None:
    a, _ = masters
    base = f"http://{a.http_address}"
    with httpx.Client(base_url=base, auth=client_auth(GOOD, MASTER_HTTP)) as http:
        chunks = iter([b"part-1/", b"part-2"])
        assert http.put("/metadata", params={"key": "streamed"}, content=chunks).status_code == 200
        assert a.metadata_kv.get("streamed") == b"part-1/part-2"
        assert http.put("/metadata?key=empty", content=b"").status_code == 200
        assert http.delete("/metadata", params={"key": "empty"}).status_code == 200
        assert http.get("/metadata?key=streamed").content == b"part-1/part-2"
        odd = "sp ace/ü?&=%"  # percent-encoded on the wire: signed as sent
        assert http.put("/metadata", params={"key": odd}, content=b"o").status_code == 200
        assert a.metadata_kv.get(odd) == b"o"


def test_a_full_nonce_cache_refuses_new_requests() -> None:
    small = auth.Authenticator(SECRET, http_policy=HttpPolicy(nonces=16))
    m = _master(small)
    try:
        url = f"http://{m.http_address}/get_all_segments"
        with httpx.Client(auth=client_auth(small, MASTER_HTTP)) as http:
            assert all(http.get(url).status_code == 200 for _ in range(16))
            full = http.get(url)
        assert full.status_code == 503 and "http_nonces" in full.json()["error"]
        assert full.headers["retry-after"] == "1"
    finally:
        m.stop()


def test_verifier_rules_at_given_times() -> None:
    """The window, the skew and the nonce cache's expiry, at injected times (pure)."""
    v = HttpVerifier(GOOD, MASTER_HTTP, HttpPolicy(window_s=10, max_skew_s=2, nonces=16))
    h = GOOD.http_headers("GET", "http://127.0.0.1:1/x", MASTER_HTTP, now=1000.0)
    claim = v.check_header(h, "GET", b"/x", now=1000.5)
    v.admit(claim)
    with pytest.raises(HttpRefused, match="already seen"):
        v.admit(v.check_header(h, "GET", b"/x", now=1009.0))
    with pytest.raises(HttpRefused, match="outside"):
        v.check_header(h, "GET", b"/x", now=1011.0)  # after the window
    with pytest.raises(HttpRefused, match="outside"):
        v.check_header(h, "GET", b"/x", now=997.0)  # a client clock > 2 s ahead
    v.check_header(h, "GET", b"/x", now=998.0)  # within the skew
    v.nonces.admit("f" * 32, now=2000.0)  # the old nonce expired: purged on the way
    assert len(v.nonces) == 1
    # Names the server is reached by behind NAT / a load balancer ([auth] http_names).
    named = HttpVerifier(GOOD, MASTER_HTTP, HttpPolicy(names=("gw.example:8080", "lb")))

    def audience(url: str) -> None:
        h = GOOD.http_headers("GET", url, MASTER_HTTP, now=1000.0)
        claim = named.check_header(h, "GET", b"/x", now=1000.0)
        asyncio.run(named.check_audience(claim, ("10.1.2.3", 9003)))

    audience("http://gw.example:8080/x")
    audience("http://lb:1234/x")
    for url in ("http://gw.example:8081/x", "http://10.9.9.9:9003/x"):  # no DNS lookup
        with pytest.raises(HttpRefused, match="another server"):
            audience(url)
    with pytest.raises(ConfigError, match="http_window_s"):
        HttpPolicy(window_s=31)
    with pytest.raises(ConfigError, match="http_max_skew_s"):
        HttpPolicy(window_s=5, max_skew_s=6)
    with pytest.raises(ConfigError, match="http_window_s"):
        auth.load_auth(env={"KVCAKE_AUTH_SECRET": SECRET.decode(),
                            "KVCAKE_AUTH_HTTP_WINDOW_S": "300"})  # fmt: skip
