"""KV events (issue 11 §3): the consumer-side view's rules (gaps, publishers, tiers), and the
proxy's pool index fed by a real master's zmq events while the pool evicts under pressure."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time

from kvcake.core.api import KVIndex, PoolView, StoreEvent, StoreEventKind, StoreSnapshot
from kvcake.core.hashing import block_key
from kvcake.core.ids import BlockHash, ClientId, SegmentName
from kvcake.proxy.pool_events import PoolEvents, block_of
from kvcake.serve.events import POOL
from kvcake.store import protocol as P
from kvcake.store.client import Client
from kvcake.store.config import MasterConfig
from kvcake.store.events import ENCODER, EventLog, EventPublisher
from kvcake.store.master_state import MasterState
from kvcake.store.vllm_events import BlockTable, VllmEventStream
from tests.store.conftest import Factory
from tests.store.test_master_state import Clock
from tests.waits import wait_until

K = StoreEventKind


def ev(
    seq: int, kind: StoreEventKind, *keys: str, tier: str = "memory", pub: str = "m"
) -> StoreEvent:
    return StoreEvent(seq, pub, kind, keys, tier)


def test_pool_view_tiers_gaps_and_publishers() -> None:
    v = PoolView()
    assert v.apply(ev(1, K.STORED, "a")) is None  # not loaded yet
    assert v.load(StoreSnapshot("m", 3, {"a": ("memory",)})) == (["a"], [])
    assert v.apply(ev(2, K.STORED, "x")) == ([], [])  # older than the snapshot: ignored
    assert v.apply(ev(4, K.STORED, "b")) == (["b"], [])
    assert v.apply(ev(5, K.STORED, "b", tier="disk")) == ([], [])
    assert v.apply(ev(6, K.EVICTED_MEMORY, "b", "a")) == ([], ["a"])  # b still on disk
    assert v.apply(ev(7, K.SEGMENT_LOST, "b", tier="disk")) == ([], ["b"])
    assert v.apply(ev(9, K.STORED, "c")) is None and not v.in_sync  # gap
    v.load(StoreSnapshot("m", 9, {"c": ("memory",)}))
    assert v.apply(ev(10, K.REMOVED, "c", tier="")) == ([], ["c"])
    assert v.apply(ev(11, K.STORED, "d", pub="m2")) is None  # master restarted


def test_state_publishes_every_change_in_order() -> None:
    clock = Clock()
    st = MasterState(
        MasterConfig(
            high_watermark=0.8, eviction_ratio=0.2, offload_on_evict=False, evict_step_ms=0
        ),
        clock,
    )
    st.mount(ClientId("n"), "h", SegmentName("seg"), 10_000)
    view = PoolView()
    view.load(st.kv_snapshot())
    w = ClientId("w")
    for i in range(8):
        st.put_start(w, "h", f"k{i}", 1000)
        st.put_end(w, f"k{i}")
    st.put_start(w, "h", "never", 1000)  # PROCESSING: never published
    st.maybe_evict()
    st.remove("k7")
    st.put_start(w, "h", "k6", 1000, upsert=True)  # invisible while rewritten
    for e in st.events.take(0.0, 10_000):
        assert view.apply(e) is not None
    assert set(view.tiers) == set(st.kv_snapshot().keys)
    assert {"k4", "k5"} <= set(view.tiers) and not {"k0", "k6", "k7", "never"} & set(view.tiers)
    st.unmount(ClientId("n"), SegmentName("seg"))
    for e in st.events.take(0.0, 10_000):
        assert view.apply(e) is not None
    assert view.tiers == {}


def test_subscriber_resyncs_on_gap() -> None:
    index = KVIndex()
    pe = PoolEvents(index, "127.0.0.1:1")
    key = str(block_key("m", "f", 32, BlockHash(0xABC)))
    pe.view.load(StoreSnapshot("m", 0, {}))
    assert pe.on_batch(ENCODER.encode([ev(1, K.STORED, key, "not-a-block")]))
    assert index.holders(BlockHash(0xABC)) == {POOL} and block_of("not-a-block") is None
    assert not pe.on_batch(ENCODER.encode([ev(3, K.REMOVED, key)]))  # gap: resync needed
    assert pe.on_tick(ENCODER.encode(["m", 1])) and not pe.on_tick(ENCODER.encode(["m", 2]))


def test_proxy_pool_index_follows_eviction(procs: Factory) -> None:
    """Put 3x the pool's memory as KV blocks: the master evicts; the index built from its
    events must end equal to what the store holds (and empty when the node dies)."""
    master = procs("master", "--port", "0", "--http-port", "-1", "--client-ttl-s", "1")
    rpc = master.info["rpc"]
    node = procs("store-server", "--master", rpc, "--segment-size", "4MiB")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    index = KVIndex()
    pe = PoolEvents(index, rpc)
    stop = asyncio.Event()
    fut = asyncio.run_coroutine_threadsafe(pe.run(stop), loop)
    try:
        wait_until(lambda: pe.resyncs >= 1, timeout=15, what="a resync")
        hashes = [BlockHash(0x1000 + i) for i in range(192)]
        keys = [str(block_key("smollm2", "f32", 32, h)) for h in hashes]
        with Client(master=rpc) as c:
            for i in range(0, len(keys), 8):
                c.batch_put(keys[i : i + 8], [bytes([i % 251]) * 65536] * 8)

            def held() -> set[BlockHash]:
                return {h for h in hashes if POOL in index.holders(h)}

            def truth() -> set[BlockHash]:
                snap = c.conn.call(P.KvSnapshot(c.id)).snapshot
                return {h for h, k in zip(hashes, keys, strict=True) if k in snap.keys}

            wait_until(
                lambda: held() == truth() and len(truth()) < len(hashes),
                timeout=15,
                what="an eviction, and the index equal to the store",
            )
            assert 0 < len(held()) < 80  # 4 MiB holds at most 64 of them: most were evicted
            time.sleep(0.3)  # let the housekeeper's eviction run finish
            wait_until(lambda: held() == truth(), timeout=15, what="the index equal to the store")
            victim = next(h for h in hashes if h in truth())
            c.remove(keys[hashes.index(victim)], force=True)
            wait_until(
                lambda: victim not in held() and held() == truth(),
                timeout=15,
                what="the removed block out of the index",
            )
            node.stop(signal.SIGKILL)  # segment lost
            wait_until(lambda: not held(), timeout=10, what="an empty index after the node died")
    finally:
        loop.call_soon_threadsafe(stop.set)
        fut.result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def test_a_stopped_publisher_frees_its_fixed_port_before_stop_returns() -> None:
    """A master restarted on a fixed events port binds it at once. With zmq's shared context
    close() left the port to zmq's I/O thread: here 41 and 78 of 300 immediate rebinds failed
    ("Address already in use"), and CI's Dynamo failover test failed on it."""
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        ports = a.getsockname()[1], b.getsockname()[1]
    for _ in range(50):
        pub = EventPublisher(EventLog(), port=ports[0])
        stream = VllmEventStream(BlockTable(), port=ports[1])
        pub.start()
        stream.start()
        stream.stop()
        pub.stop()
