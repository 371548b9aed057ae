"""Keys that cannot cross tensor-parallel ranks (issue 30 §4): one pool object per (block, rank,
TP size); the scheduler counts a block only when every rank's object exists; the proxy's pool
index, fed by the master's events, names the block once by its rank-free hash."""

from __future__ import annotations

import pytest

from kvcake.core.api import KVIndex, StoreEvent, StoreEventKind, StoreSnapshot
from kvcake.core.hashing import block_hashes, block_key, parse_block_key, rank_key
from kvcake.core.ids import BlockHash
from kvcake.integrations.vllm.keys import BlockNamer
from kvcake.integrations.vllm.plan import Planner
from kvcake.proxy.pool_events import PoolEvents, block_of
from kvcake.serve.events import POOL
from kvcake.store.events import ENCODER

K = StoreEventKind
TP2 = BlockNamer("m@vllm", "float32", 4, tp_size=2)
PROMPT = list(range(13))  # 3 full blocks


def test_two_ranks_name_two_objects_of_one_block() -> None:
    blocks = TP2.keys(PROMPT)
    hashes = block_hashes(PROMPT, 4)
    assert blocks == [block_key("m@vllm", "float32", 4, h) for h in hashes]  # rank-free
    r0 = [TP2.for_rank(k, 0) for k in blocks]
    r1 = [TP2.for_rank(k, 1) for k in blocks]
    assert r0[0] == f"{blocks[0]}/tp0of2" and r1[0] == f"{blocks[0]}/tp1of2"
    assert not set(r0) & set(r1) and not set(r0) & set(blocks)  # no rank reads another's
    # another TP size names other objects too (its ranks hold other heads)
    tp4 = BlockNamer("m@vllm", "float32", 4, tp_size=4)
    assert not {tp4.for_rank(k, r) for k in blocks for r in range(4)} & set(r0 + r1)
    assert TP2.objects(PROMPT) == [o for a, b in zip(r0, r1, strict=True) for o in (a, b)]
    # both ranks' objects parse back to the one block hash the events and index use
    for h, a, b, k in zip(hashes, r0, r1, blocks, strict=True):
        assert parse_block_key(a) == (h, 0, 2) and parse_block_key(b) == (h, 1, 2)
        assert parse_block_key(k) == (h, 0, 1) and block_of(a) == block_of(b) == h
    with pytest.raises(ValueError):
        rank_key(blocks[0], 2, 2)


@pytest.mark.parametrize(
    "key",
    ["not-a-block", "m/f/4/xyz", "m/f/4/00000000000000ab/tp2of2", "m/f/4/00000000000000ab/tpxof2",
     "m/f/4/0000_00000000000a", "m/f/4/00000000000000AB/tp0of1"],
)  # fmt: skip
def test_other_keys_are_not_blocks(key: str) -> None:
    assert parse_block_key(key) is None and block_of(key) is None


def test_scheduler_counts_a_block_only_when_every_rank_has_it() -> None:
    blocks = TP2.keys(PROMPT)
    pool = {TP2.for_rank(blocks[0], 0), TP2.for_rank(blocks[0], 1), TP2.for_rank(blocks[1], 0)}
    asked: list[list[str]] = []

    def exists(keys: list[str]) -> list[bool]:
        asked.append(keys)
        return [k in pool for k in keys]

    p = Planner(TP2)
    assert p.match("r", PROMPT, 0, exists) == 4  # block 1 lacks rank 1's object
    assert asked == [TP2.objects(PROMPT)]
    pool.add(TP2.for_rank(blocks[1], 1))
    assert p.match("r", PROMPT, 0, exists) == 8
    p.allocated("r", [7, 8, 9, 10], 8)
    (run,) = p.step([("r", [7, 8, 9, 10], True, 13)]).loads
    assert run.keys == blocks[:2]  # the plan names blocks; each worker maps to its rank


def test_after_a_failed_load_the_request_is_a_local_miss() -> None:
    p = Planner(TP2)
    everything = lambda keys: [True] * len(keys)  # noqa: E731
    assert p.match("r", PROMPT, 0, everything) == 12
    p.allocated("r", [3, 4, 5, 6], 12)
    p.step([("r", [3, 4, 5, 6], True, 13)])
    assert p.match("s", PROMPT, 0, everything) == 12
    p.allocated("s", [20, 21, 22, 23], 12)
    p.step([("s", [20, 21, 22, 23], True, 13)])
    assert p.load_failed({5, 99}) == ["r"]  # one of r's loaded blocks; s's load was fine
    assert p.match("r", PROMPT, 0, everything) == 0  # preempted and looked up again: no load
    assert p.match("s", PROMPT, 0, everything) == 12
    assert p.load_failed({5}) == []  # r's old block ids are no longer its own
    p.finished("r")
    assert p.match("r", PROMPT, 0, everything) == 12  # a new request of that id may load


def store_event(seq: int, kind: StoreEventKind, *keys: str) -> bytes:
    return ENCODER.encode([StoreEvent(seq, "m", kind, keys, "memory")])


def test_pool_index_names_a_block_once_and_only_when_every_rank_is_in() -> None:
    index = KVIndex()
    pe = PoolEvents(index, "127.0.0.1:1")
    b0, b1 = TP2.keys(PROMPT)[:2]
    h0, h1 = (parse_block_key(b)[0] for b in (b0, b1))  # type: ignore[index]
    pe.view.load(StoreSnapshot("m", 0, {}))
    assert pe.on_batch(store_event(1, K.STORED, TP2.for_rank(b0, 0), TP2.for_rank(b1, 0)))
    assert index.holders(h0) == frozenset() == index.holders(h1)  # rank 1 not in yet
    assert pe.on_batch(store_event(2, K.STORED, TP2.for_rank(b0, 1)))
    assert index.holders(h0) == {POOL} and index.blocks_of(POOL) == 1  # once, by its hash
    assert pe.on_batch(store_event(3, K.STORED, b1))  # a TP=1 engine's object of block 1
    assert index.holders(h1) == {POOL} and index.blocks_of(POOL) == 2
    assert pe.on_batch(store_event(4, K.REMOVED, TP2.for_rank(b0, 0)))
    assert index.holders(h0) == frozenset()  # one rank gone: the block is not loadable
    assert pe.on_batch(store_event(5, K.REMOVED, b1))
    assert index.holders(h1) == frozenset()  # TP=2 has only rank 0 of block 1
    # a snapshot (resync) gives the same answer as the events
    pe2 = PoolEvents(KVIndex(), "127.0.0.1:1")
    snap: dict[str, tuple[str, ...]] = {
        k: ("memory",) for k in (TP2.for_rank(b0, 0), TP2.for_rank(b0, 1), b1)
    }
    pe2._mirror(*pe2.view.load(StoreSnapshot("m", 9, snap)))
    assert pe2.index.holders(h0) == {POOL} == pe2.index.holders(h1)
    assert pe2.index.blocks_of(POOL) == 2
    assert pe2.ranks.change("junk", True) == (None, None)
    assert isinstance(h0, int) and BlockHash(h0) == h0
