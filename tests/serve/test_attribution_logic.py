"""serve.attribution: the pure combination of what the prefill instance did and what the
proxy's index knew (the live cluster tests are in test_attribution.py)."""

from __future__ import annotations

from typing import Any

import pytest

from kvcake.conductor.index import PrefixIndex
from kvcake.core.ids import BlockHash, InstanceId
from kvcake.serve import attribution as A
from kvcake.store.protocol import ReplicaDesc

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


class FakeClient:
    """batch_get_into as the store client answers it: sizes or errors, and the replicas."""

    def __init__(self, answers: dict[str, Any], delay_s: float = 0.0, fail: bool = False):
        self.answers, self.delay_s, self.fail, self.calls = answers, delay_s, fail, 0

    def batch_get_into(self, keys: list[str], views: list[Any], sources: list[Any]) -> list[Any]:
        import time

        from kvcake.store.errors import ObjectNotFound

        self.calls += 1
        time.sleep(self.delay_s)
        if self.fail:
            raise ConnectionError("pool unreachable")
        out = []
        for k, v in zip(keys, views, strict=True):
            a = self.answers.get(k)
            if a is None:
                out.append(ObjectNotFound(k))
                sources.append(None)
            elif isinstance(a, Exception):
                out.append(a)
                sources.append(None)
            else:
                out.append(v.nbytes)
                sources.append(ReplicaDesc(a[0], "h", 0, v.nbytes, a[1]))
        return out


def link(answers: dict[int, Any], **kw: Any) -> tuple[Any, list[memoryview]]:
    from kvcake.instance.kvlink import PoolLink

    pl = PoolLink(None, "m", "float32", BT, kw.pop("deadline", 0.0))
    pl.client = FakeClient({pl.key(H[i]): a for i, a in answers.items()}, **kw)
    return pl, [memoryview(bytearray(16)) for _ in H]


def test_pool_reads_report_their_replica_and_misses() -> None:
    from kvcake.store.errors import LeaseExpired, TransferFailed

    pl, views = link({0: ("store-0", "memory"), 1: ("store-1", "disk"), 2: ("store-0", "memory")})
    assert pl.read_prefix(H[:5], views[:5]) == (
        {"memory:store-0": 2, "disk:store-1": 1}, {A.FETCH_NOT_FOUND: 2}
    )  # fmt: skip
    pl, views = link({0: ("s", "memory"), 1: TransferFailed("node down")})
    assert pl.read_prefix(H[:4], views[:4]) == ({"memory:s": 1}, {A.FETCH_FAILED: 3})
    pl, views = link({0: LeaseExpired("late")})
    assert pl.read_prefix(H[:2], views[:2]) == ({}, {A.FETCH_TOO_SLOW: 2})
    pl, views = link({0: ("s", "memory")}, fail=True)
    assert pl.read_prefix(H[:3], views[:3]) == ({}, {A.FETCH_FAILED: 3})
    assert pl.get_into(H[:1], views[:1]) == 0


def test_fetch_deadline_stops_a_slow_read() -> None:
    from kvcake.instance.kvlink import PoolLink

    many = [BlockHash(5000 + i) for i in range(20)]
    pl = PoolLink(None, "m", "float32", BT, 0.01)
    pl.client = FakeClient({pl.key(h): ("s", "memory") for h in many}, delay_s=0.05)
    views = [memoryview(bytearray(8)) for _ in many]
    read, missed = pl.read_prefix(many, views)
    assert read == {"memory:s": PoolLink.FETCH_CHUNK}  # the chunk in flight finishes
    assert missed == {A.FETCH_TOO_SLOW: 20 - PoolLink.FETCH_CHUNK}
    pl.fetch_deadline_s = 0.0  # no deadline: one read of everything
    pl.client.calls = 0
    assert pl.read_prefix(many, views) == ({"memory:s": 20}, {}) and pl.client.calls == 1
