"""The master's KV events in vLLM's wire format (store/vllm_events.py): frames decoded with
vLLM's own msgspec classes; a real master publishes BlockStored with token ids and parents
for blocks whose writer announced them, BlockRemoved on removal, nothing for objects written
without lineage; a new publisher starts with AllBlocksCleared; the replay socket."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq

from kvcake.core.api import StoreEvent, StoreEventKind
from kvcake.core.hashing import block_key
from kvcake.core.ports import free_port
from kvcake.store.client import Client
from kvcake.store.config import MasterConfig, StoreServerConfig
from kvcake.store.master_server import Master
from kvcake.store.server import StoreServer
from kvcake.store.vllm_events import BlockTable, announce, lineage, translate

kv_events = pytest.importorskip("vllm.distributed.kv_events")
DECODER = msgspec.msgpack.Decoder(kv_events.KVEventBatch)
TOKENS = list(range(1000, 1048))  # three blocks of 16


def _keys(blocks: list[Any]) -> list[str]:
    return [block_key("m", "f16", 16, b.hash) + "/tp0of1" for b in blocks]


def test_translate_only_announced_block_keys() -> None:
    table = BlockTable(capacity=2)
    blocks = lineage(TOKENS, 16)
    for b in blocks:
        table.learn(b.hash, b.parent, b.tokens)  # capacity 2: the first falls out
    keys = [*_keys(blocks), "shim-object", block_key("m", "f16", 16, 7)]
    ev = StoreEvent(1, "p", StoreEventKind.STORED, tuple(keys), "memory")
    out = translate([ev], table)
    assert [e.block_hashes[0] for e in out] == [blocks[1].hash, blocks[2].hash]
    assert out[0].parent_block_hash == blocks[0].hash and out[0].token_ids == TOKENS[16:32]
    assert translate([ev], table) == []  # already published in that medium
    disk = StoreEvent(2, "p", StoreEventKind.STORED, tuple(keys), "disk")  # offloaded
    assert [e.medium for e in translate([disk], table)] == ["STORAGE", "STORAGE"]
    evicted = StoreEvent(3, "p", StoreEventKind.EVICTED_MEMORY, tuple(keys[1:2]), "memory")
    (ev_out,) = translate([evicted], table)
    assert ev_out.block_hashes == [blocks[1].hash] and ev_out.medium == "CPU"
    gone = StoreEvent(4, "p", StoreEventKind.REMOVED, tuple(keys))
    out = [(e.block_hashes[0], e.medium) for e in translate([gone], table)]
    b1, b2 = blocks[1].hash, blocks[2].hash
    assert out == [(b1, "STORAGE"), (b2, "CPU"), (b2, "STORAGE")]
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        table.learn(-5, None, [1])


@pytest.fixture(scope="module")
def master() -> Iterator[Master]:
    m = Master(MasterConfig(port=0, http_port=-1, events_port=-1, ecosystem_events_port=0))
    m.start()
    node = StoreServer(StoreServerConfig(master=m.rpc_address, segment_size=4 << 20, http_port=-1))
    node.start()
    try:
        yield m
    finally:
        node.stop()
        m.stop()


def _recv(sock: Any, timeout: float = 10.0) -> list[Any]:
    """Events of the next batch, decoded by vLLM's classes (three frames, seq big-endian)."""
    assert sock.poll(int(timeout * 1000)), "no KV event batch arrived"
    _topic, seq, payload = sock.recv_multipart()
    assert len(seq) == 8
    return list(DECODER.decode(payload).events)


def test_master_stream_decoded_by_vllm(master: Master) -> None:
    assert master.events_address == ""  # kvcake's own stream is off; only vLLM's is on
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(master.vllm_events.address)
    time.sleep(0.3)  # a PUB drops what it sends before the subscription arrives
    blocks = lineage(TOKENS, 16)
    keys = _keys(blocks)
    try:
        with Client(master=master.rpc_address) as c:
            announce(c, blocks)
            assert all(r is None for r in c.batch_put(keys, [b"x" * 64] * 3))
            c.put("written-without-lineage", b"y" * 64)
            stored = _recv(sub)
            while len(stored) < 4:
                stored += _recv(sub)
            assert stored.pop(0) == kv_events.AllBlocksCleared()  # a new publisher's first batch
            assert all(isinstance(e, kv_events.BlockStored) for e in stored)
            assert [e.block_hashes[0] for e in stored] == [b.hash for b in blocks]
            assert stored[0].parent_block_hash is None
            assert stored[2].parent_block_hash == blocks[1].hash
            assert stored[2].token_ids == TOKENS[32:] and stored[2].block_size == 16
            assert stored[0].medium == "CPU" and stored[0].lora_id is None
            c.remove(keys[2], force=True)
            removed = _recv(sub)
            assert removed == [kv_events.BlockRemoved(block_hashes=[blocks[2].hash], medium="CPU")]
    finally:
        sub.close(0)
    _check_replay(ctx, master.vllm_events.replay_address)


def _check_replay(ctx: Any, address: str) -> None:
    """From the oldest batch kept: the publisher's first is AllBlocksCleared; the stream ends with -1."""
    req = ctx.socket(zmq.DEALER)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(address)
    try:
        req.send_multipart([b"", (0).to_bytes(8, "big")])  # from the oldest kept
        seqs, first = [], None
        while True:
            assert req.poll(5000), "replay did not end"
            _, _topic, seq, payload = req.recv_multipart()
            n = int.from_bytes(seq, "big", signed=True)
            if n == -1:
                break
            seqs.append(n)
            first = first or DECODER.decode(payload).events
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and len(seqs) >= 2
        assert first is not None and first[0] == kv_events.AllBlocksCleared()
    finally:
        req.close(0)


def test_a_new_master_on_the_same_port_starts_with_all_blocks_cleared() -> None:
    """A failover: the next master's stream starts a higher sequence with AllBlocksCleared, received
    by a subscriber that stayed connected (also when no event comes: after CLEAR_AFTER_S)."""
    port = free_port()
    cfg = MasterConfig(port=0, http_port=-1, events_port=-1, ecosystem_events_port=port)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(f"tcp://127.0.0.1:{port}")
    seqs = []
    try:
        for _ in range(2):
            m = Master(cfg)
            m.start()
            try:
                assert sub.poll(10_000), "no batch from the new publisher"
                _, seq, payload = sub.recv_multipart()
                seqs.append(int.from_bytes(seq, "big"))
                assert DECODER.decode(payload).events == [kv_events.AllBlocksCleared()]
            finally:
                m.stop()
    finally:
        sub.close(0)
    assert seqs[1] > seqs[0]  # a new sequence, above the old one
