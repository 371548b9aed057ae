from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcake.core.api import KVEventKind
from kvcake.core.errors import EngineError
from kvcake.core.ids import BlockHash
from kvcake.engine.block_manager import BlockManager, KVCacheFull

H = [BlockHash(1000 + i) for i in range(10)]


def test_allocate_free_accounting() -> None:
    bm = BlockManager(4)
    a = bm.allocate(3)
    assert len(set(a)) == 3 and bm.num_used == 3 and bm.num_free == 1
    bm.check()
    with pytest.raises(KVCacheFull):
        bm.allocate(2)
    bm.free(a)
    assert bm.num_used == 0 and bm.num_free == 4
    bm.check()


def test_prefix_lookup_refcounts_and_lru_eviction() -> None:
    bm = BlockManager(4)
    a = bm.allocate(2)
    bm.register(a, H[:2])
    assert bm.lookup_prefix(H[:3]) == a  # third block not cached
    assert [bm.refcount(b) for b in a] == [2, 2]
    bm.free(a)
    bm.free(a)
    assert bm.num_cached == 2 and bm.num_free == 4  # cached blocks are evictable
    b = bm.allocate(2)  # takes never-used blocks first: the cache survives
    assert set(b).isdisjoint(a) and bm.cached_prefix_len(H) == 2
    bm.lookup_prefix(H[:1])  # touch block 0 -> most recently used
    bm.free([a[0]])
    c = bm.allocate(1)  # must evict: the LRU cached block is a[1]
    assert c == [a[1]] and bm.cached_prefix_len(H) == 1
    ev = bm.events(0)
    assert [e.kind for e in ev] == [KVEventKind.STORED, KVEventKind.REMOVED]
    assert ev[1].block_hashes == (H[1],) and ev[1].seq == ev[0].seq + 1
    bm.check()


def test_register_external_blocks_and_duplicates() -> None:
    bm = BlockManager(4)
    x, y = bm.allocate(1), bm.allocate(1)
    assert bm.register(x, H[:1]) == 1
    assert bm.register(y, H[:1]) == 0  # already named by x: names stay unique
    assert bm.hash_of(y[0]) is None
    bm.free(x + y)
    bm.check()
    assert bm.num_cached == 1


def test_misuse_raises() -> None:
    bm = BlockManager(2)
    with pytest.raises(EngineError):
        bm.free([0])  # never allocated
    with pytest.raises(EngineError):
        bm.register([1], H[:1])  # not allocated
    with pytest.raises(EngineError):
        bm.free([7])
    with pytest.raises(EngineError):
        bm.acquire([0])
    with pytest.raises(EngineError):
        BlockManager(0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "free", "reg", "look"]), st.integers(0, 5))))
def test_random_operations_keep_invariants(ops: list[tuple[str, int]]) -> None:
    bm = BlockManager(6)
    held: list[int] = []
    for op, k in ops:
        if op == "alloc":
            with contextlib.suppress(KVCacheFull):
                held += bm.allocate(k % 3)
        elif op == "free" and held:
            bm.free([held.pop(k % len(held))])
        elif op == "reg" and held:
            bm.register([held[k % len(held)]], [H[k]])
        elif op == "look":
            held += bm.lookup_prefix(H[: k + 1])
        bm.check()
        assert bm.num_used == len(set(held))
    bm.free(held)
    bm.check()
    assert bm.num_used == 0
