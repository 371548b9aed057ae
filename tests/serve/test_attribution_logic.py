"""serve.attribution: the pure combination of what the prefill instance did and what the
proxy's index knew (the live cluster tests are in test_attribution.py)."""

from __future__ import annotations

import pytest

from kvcake.conductor.index import PrefixIndex
from kvcake.core.ids import BlockHash, InstanceId
from kvcake.serve import attribution as A

BT = 32
H = [BlockHash(1000 + i) for i in range(8)]


def run(n: int, sources: dict[str, int], placed: A.Placement = A.Placement(),
        evicted: frozenset[BlockHash] = frozenset()) -> A.Attribution:  # fmt: skip
    return A.attribute(n, BT, H[: n // BT], sources, placed, evicted.__contains__)


def test_everything_computed_first_time() -> None:
    a = run(200, {A.LOCAL: 0})
    assert a.computed_tokens == 200 and a.cached_tokens == 0
    assert a.miss_reasons == {A.NEVER_SEEN: 192, A.LAST_BLOCK: 8}


def test_local_pool_ssd_and_failures_add_up() -> None:
    src = {A.LOCAL: 1, "memory:store-0": 2, "disk:store-1": 1, A.FETCH_FAILED: 1}
    a = run(250, src)  # 7 full blocks; limit (249 // 32) = 7
    assert a.local_tokens == 32 and a.pool_dram_tokens == {"store-0": 64}
    assert a.ssd_tokens == {"store-1": 32}
    assert a.miss_reasons == {A.FETCH_FAILED_R: 32, A.NEVER_SEEN: 64, A.LAST_BLOCK: 26}
    d = a.as_dict()
    assert d["ssd_tokens"] == 32 and d["computed_tokens"] == 122


def test_not_found_is_evicted_only_when_an_eviction_was_seen() -> None:
    a = run(160, {A.LOCAL: 0, A.FETCH_NOT_FOUND: 4}, evicted=frozenset(H[:2]))
    assert a.miss_reasons == {A.EVICTED: 64, A.FETCH_FAILED_R: 64, A.LAST_BLOCK: 32}
    slow = run(160, {A.LOCAL: 2, A.FETCH_TOO_SLOW: 2})
    assert slow.miss_reasons == {A.TOO_SLOW: 64, A.LAST_BLOCK: 32}


def test_routed_elsewhere_and_a_broken_prefix_inherits_its_reason() -> None:
    placed = A.Placement(elsewhere=2, present=(True, True, False, True, True))
    a = run(192, {A.LOCAL: 0}, placed, evicted=frozenset({H[2]}))
    # blocks 0-1: another holder had them (not fetched); 2 evicted; 3-4 still cached
    # somewhere, but behind the evicted block 2, so they count as evicted too
    assert a.miss_reasons == {A.ROUTED_ELSEWHERE: 64, A.EVICTED: 96, A.LAST_BLOCK: 32}


def test_unreported_sources_are_unknown() -> None:
    assert run(100, {}).miss_reasons == {A.UNKNOWN: 100}
    f = A.fallback(100, 64)
    assert f.local_tokens == 64 and f.miss_reasons == {A.UNKNOWN: 36}


def test_inconsistent_attribution_is_refused() -> None:
    with pytest.raises(ValueError, match="add up"):
        A.Attribution(10, local_tokens=4, computed_tokens=4, miss_reasons={A.NEVER_SEEN: 4})


def test_eviction_memory_is_bounded_and_the_index_feeds_it() -> None:
    mem = A.EvictionMemory(max_blocks=3)
    mem.add(H[:5])
    assert len(mem) == 3 and H[0] not in mem and H[4] in mem
    with pytest.raises(ValueError):
        A.EvictionMemory(0)
    mem2 = A.EvictionMemory()
    index = A.tracking_index(mem2)
    assert isinstance(index, PrefixIndex)
    index.add(InstanceId("p0"), H[:3])
    index.remove(InstanceId("p0"), H[1:2])
    assert H[1] in mem2 and H[0] not in mem2
    p = A.placement(index, H[:3], InstanceId("p1"), 3)
    assert p.elsewhere == 1 and p.present == (True, False, True)
