from __future__ import annotations

import random

import pytest

from kvcake.conductor import PrefixIndex
from kvcake.core.api import KVEvent, KVEventKind, KVIndex
from kvcake.core.ids import BlockHash, InstanceId

from .util import blocks, iid


def _random_pair(rng: random.Random) -> tuple[PrefixIndex, KVIndex, list[BlockHash]]:
    a, b = PrefixIndex(), KVIndex()
    req = [BlockHash(rng.getrandbits(8)) for _ in range(rng.randint(0, 60))]  # with repeats
    for h in range(rng.randint(1, 80)):  # > 64 holders: masks wider than a machine word
        name = InstanceId(f"h{h}")
        if rng.random() < 0.3:  # not a prefix: holes anywhere
            sel = [x for x in req if rng.random() < 0.9]
        else:
            sel = req[: rng.randint(0, len(req))]
        a.add(name, sel)
        b.add(name, sel)
        if rng.random() < 0.3:
            gone = [x for x in sel if rng.random() < 0.2]
            a.remove(name, gone)
            b.remove(name, gone)
    return a, b, req


def test_prefix_index_matches_core_kvindex() -> None:
    rng = random.Random(7)
    for _ in range(200):
        a, b, req = _random_pair(rng)
        assert a.prefix_matches(req) == b.prefix_matches(req)
        assert len(a) == len(b)
        for blk in req[:5]:
            assert a.holders(blk) == b.holders(blk)
        for h in (InstanceId("h0"), InstanceId("h3"), InstanceId("nobody")):
            assert a.blocks_of(h) == b.blocks_of(h)


def test_match_lengths_by_hand() -> None:
    idx = PrefixIndex()
    req = blocks(6)
    idx.add(iid("a"), req[:4])
    idx.add(iid("b"), req)
    idx.add(iid("c"), (req[0], req[1], req[3]))  # hole at block 2
    idx.add(iid("d"), req[1:])  # lacks block 0: matches nothing
    lens = idx.match_lengths(req)
    assert len(lens) == idx.num_bits + 1 and lens[-1] == 0
    by_name = {n: lens[idx.bit_of(iid(n))] for n in "abcd"}
    assert by_name == {"a": 4, "b": 6, "c": 2, "d": 0}
    assert idx.prefix_matches(req) == {"a": 4, "b": 6, "c": 2}
    assert idx.match_lengths(()) == [0] * 5
    assert idx.match_lengths(blocks(3, base=7)) == [0] * 5
    assert idx.bit_of(iid("zzz")) == -1


def test_events_remove_and_drop_holder_keep_counts() -> None:
    idx = PrefixIndex()
    req = blocks(5)
    idx.apply(KVEvent(1, iid("a"), KVEventKind.STORED, req))
    idx.apply(KVEvent(1, iid("b"), KVEventKind.STORED, req[:2]))
    idx.add(iid("a"), req[:2])  # re-adding is idempotent
    assert (idx.blocks_of(iid("a")), idx.blocks_of(iid("b")), len(idx)) == (5, 2, 5)
    idx.apply(KVEvent(2, iid("a"), KVEventKind.REMOVED, req[3:]))
    assert idx.prefix_matches(req) == {"a": 3, "b": 2}
    idx.remove(iid("a"), req[3:])  # removing absent blocks is a no-op
    idx.remove(iid("nobody"), req)
    assert idx.blocks_of(iid("a")) == 3
    idx.drop_holder(iid("a"))
    assert idx.blocks_of(iid("a")) == 0
    assert idx.prefix_matches(req) == {"b": 2}
    assert len(idx) == 2  # blocks with no holder left are forgotten
    assert idx.holders(req[0]) == frozenset({iid("b")})
    # Total accounting: every block's holders add up to the per-holder counts.
    total = sum(len(idx.holders(blk)) for blk in req)
    assert total == idx.blocks_of(iid("a")) + idx.blocks_of(iid("b"))
    # A dropped holder that comes back keeps its bit; its blocks match again.
    idx.add(iid("a"), req[:1])
    assert idx.prefix_matches(req) == {"a": 1, "b": 2}


@pytest.mark.parametrize("n", [1, 63, 64, 65, 130])
def test_many_holders(n: int) -> None:
    idx = PrefixIndex()
    req = blocks(n + 1)
    for i in range(n):
        idx.add(InstanceId(f"p{i}"), req[: i + 1])
    assert idx.prefix_matches(req) == {f"p{i}": i + 1 for i in range(n)}
