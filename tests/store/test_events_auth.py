"""KV events that leak nothing (issue 32 §2): with a shared secret the master's event stream is
CURVE-encrypted and admits only subscribers holding the secret; a plain subscriber, one with the
keys of another secret and one that knows the server's key but not the client's receive
nothing, while the right one (the same helper the proxy and the instances use) receives the
events. The bind rules of both streams, and the refusal without CURVE support."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from kvcake.core import auth, zmq_curve
from kvcake.core.api import STORE_EVENTS_TOPIC, KVIndex
from kvcake.core.errors import ConfigError
from kvcake.core.hashing import block_key
from kvcake.core.ids import BlockHash
from kvcake.proxy.pool_events import PoolEvents
from kvcake.serve.events import POOL
from kvcake.store.client import Client
from kvcake.store.config import MasterConfig, StoreServerConfig
from kvcake.store.events import BATCH_DECODER, TICK_TOPIC, EventLog, EventPublisher
from kvcake.store.events_policy import ecosystem_events_host, own_events_host
from kvcake.store.master_server import Master
from kvcake.store.server import StoreServer
from tests.store.test_events import wait_until

SECRET = b"events-curve-test-secret-0123456789"
GOOD = auth.Authenticator(SECRET)
WRONG = auth.Authenticator(b"someone-elses-secret-987654321")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Master]:
    m = Master(MasterConfig(port=0, http_port=-1, client_ttl_s=3), auth=GOOD)
    m.start()
    try:
        node = StoreServer(
            StoreServerConfig(master=m.rpc_address, segment_size=4 << 20, http_port=-1),
            auth=GOOD,
        )
        node.start()
        try:
            yield m
        finally:
            node.stop()
    finally:
        m.stop()


def _subscriber(ctx: Any, address: str, keys: tuple[bytes, bytes, bytes] | None) -> Any:
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    if keys is not None:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys
    sock.connect(address)
    return sock


def _drain(sock: Any) -> list[list[bytes]]:
    got = []
    while sock.poll(0):
        got.append(sock.recv_multipart())
    return got


def test_only_holders_of_the_secret_receive_events(cluster: Master) -> None:
    m = cluster
    assert m.events_address.startswith("tcp://127.0.0.1:")
    ctx = zmq.Context()
    right = ctx.socket(zmq.SUB)
    right.setsockopt(zmq.LINGER, 0)
    right.setsockopt(zmq.SUBSCRIBE, b"")
    zmq_curve.secure_subscriber(right, GOOD)  # what pool_events / store_watch do
    right.connect(m.events_address)
    wrong_keys = zmq_curve.curve_keys(WRONG)
    good_keys = zmq_curve.curve_keys(GOOD)
    stranger_pub, stranger_sec = zmq.curve_keypair()
    wrong = (wrong_keys.server_public, wrong_keys.client_public, wrong_keys.client_secret)
    others = {
        "plain": _subscriber(ctx, m.events_address, None),
        "wrong secret": _subscriber(ctx, m.events_address, wrong),
        "server key only": _subscriber(
            ctx, m.events_address, (good_keys.server_public, stranger_pub, stranger_sec)
        ),
    }
    try:
        time.sleep(0.3)  # the subscriptions reach the publisher (zmq's slow joiner)
        with Client(master=m.rpc_address, protocol="tcp", auth=GOOD) as c:
            c.put("tenant-a/secret-prefix/0", b"x" * 1000)
        seen: list[list[bytes]] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(
            t == STORE_EVENTS_TOPIC for t, _ in seen
        ):  # fmt: skip
            if right.poll(100):
                seen.append(right.recv_multipart())
        stored = [e for t, p in seen if t == STORE_EVENTS_TOPIC for e in BATCH_DECODER.decode(p)]
        assert any("tenant-a/secret-prefix/0" in e.keys for e in stored), seen
        time.sleep(1.2)  # a tick was sent meanwhile: the right subscriber got it
        assert any(t == TICK_TOPIC for t, _ in _drain(right) + seen)
        for name, sock in others.items():
            assert _drain(sock) == [], name
    finally:
        for sock in [right, *others.values()]:
            sock.close(0)
        ctx.term()


def test_the_proxys_pool_index_subscribes_with_the_secret(
    cluster: Master, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PoolEvents`` (the proxy's pool index) takes the process's secret: the index follows
    the pool through the encrypted stream (events applied, not only the first snapshot)."""
    monkeypatch.setenv("KVCAKE_AUTH_SECRET", SECRET.decode())
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    index, stop = KVIndex(), asyncio.Event()
    pe = PoolEvents(index, cluster.rpc_address)
    fut = asyncio.run_coroutine_threadsafe(pe.run(stop), loop)
    try:
        wait_until(lambda: pe.resyncs >= 1)
        time.sleep(0.2)  # the subscription is through (the resync came after it)
        block = BlockHash(0xC0FFEE)
        with Client(master=cluster.rpc_address, protocol="tcp", auth=GOOD) as c:
            c.put(str(block_key("m", "f32", 32, block)), b"kv" * 512)
        wait_until(lambda: POOL in index.holders(block))
        assert pe.applied >= 1 and pe.resyncs == 1
    finally:
        loop.call_soon_threadsafe(stop.set)
        fut.result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def test_bind_rules_of_both_streams() -> None:
    cfg = MasterConfig(host="10.0.0.1")
    assert own_events_host(cfg, GOOD) == "10.0.0.1"  # CURVE: wherever the master is
    assert own_events_host(MasterConfig(), None) == "127.0.0.1"
    explicit = MasterConfig(events_host="10.0.0.9")
    assert own_events_host(explicit, None) == "10.0.0.9"  # asked for (warned)
    assert own_events_host(explicit, GOOD) == "10.0.0.9"
    assert ecosystem_events_host(MasterConfig(), None) is None  # off by default
    on = MasterConfig(ecosystem_events_port=0)
    assert ecosystem_events_host(on, None) == "127.0.0.1"
    public = MasterConfig(ecosystem_events_port=0, events_public_host="10.0.0.1")
    assert ecosystem_events_host(public, None) == "10.0.0.1"
    with pytest.raises(ConfigError, match="events_allow_plain"):
        ecosystem_events_host(on, GOOD)
    allowed = MasterConfig(ecosystem_events_port=0, events_allow_plain=True)
    assert ecosystem_events_host(allowed, GOOD) == "127.0.0.1"
    with pytest.raises(ConfigError, match="ecosystem_events_port"):
        MasterConfig(ecosystem_events_port=-2)
    with pytest.raises(ConfigError, match="events_allow_plain"):
        Master(MasterConfig(port=0, http_port=-1, ecosystem_events_port=0), auth=GOOD).start()


def test_no_curve_no_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without CURVE in libzmq, a publisher with a secret refuses to start (never plaintext)."""
    monkeypatch.setattr(zmq, "has", lambda what: what != "curve")
    with pytest.raises(ConfigError, match="CURVE"):
        EventPublisher(EventLog(), "127.0.0.1", 0, GOOD)
    EventPublisher(EventLog(), "127.0.0.1", 0, None).stop()  # without a secret: plain, loopback


def test_derived_keys_are_stable_and_distinct() -> None:
    a, b = zmq_curve.curve_keys(GOOD), zmq_curve.curve_keys(auth.Authenticator(SECRET))
    assert a == b  # every holder of the secret derives the same keys
    assert zmq_curve.curve_keys(WRONG).server_public != a.server_public
    assert len({a.server_public, a.server_secret, a.client_public, a.client_secret}) == 4
