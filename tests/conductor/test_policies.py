"""Prefill policies on a hand-computed three-instance cluster.

Cluster (BT=10 tokens/block, request 10 blocks = 100 tokens, prefill = 1 + 0.01*(L-P),
transfer 0.001 s/token):

| inst | queued | holds | TTFT local              | TTFT Algorithm 1 (thr 1.2, best = 8 on p2) |
|------|--------|-------|-------------------------|--------------------------------------------|
| p0   | 0.2    | 0     | 0.2 + 1 + 1.0 = 2.2     | 0.2 + 80*0.001 + (1 + 0.2) = 1.48 (fetch)  |
| p1   | 0.5    | 4     | 0.5 + 1 + 0.6 = 2.1     | 0.5 + 40*0.001 + 1.2 = 1.74 (8/4 = 2 > 1.2)|
| p2   | 5.0    | 8     | 5.0 + 1 + 0.2 = 6.2     | 6.2 (best holder itself)                   |
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvcake.conductor import (
    PREFILL_POLICIES,
    Conductor,
    ConductorConfig,
    PrefixIndex,
    TransferTimeModel,
    ViewBuilder,
    make_prefill_policy,
)
from kvcake.core.api import Accept, BlockSource, KVIndex
from kvcake.core.errors import ConfigError

from .util import PRED, index_with, pstate, request, snapshot

INDEXES = [PrefixIndex, KVIndex]
STATES = [pstate("p0", 0.2), pstate("p1", 0.5), pstate("p2", 5.0)]
HOLD = {"p0": 0, "p1": 4, "p2": 8}


def _view(states=STATES, hold=HOLD, cls=PrefixIndex, req=None):  # type: ignore[no-untyped-def]
    return ViewBuilder(PRED).build(req or request(), snapshot(states, index_with(hold, cls)))


def _schedule(policy: str, cls: type[KVIndex] = PrefixIndex, states=STATES, hold=HOLD, **cfg):  # type: ignore[no-untyped-def]
    c = Conductor(ConductorConfig(prefill_policy=policy, **cfg), PRED)
    return c.schedule(request(), snapshot(states, index_with(hold, cls)))


@pytest.mark.parametrize("cls", INDEXES)
def test_view_ttft_by_hand(cls: type[KVIndex]) -> None:
    v = _view(cls=cls)
    assert list(v.local) == [0, 4, 8]
    assert (v.best_len, v.best_holder) == (8, "p2")
    assert v.ttft_local() == pytest.approx([2.2, 2.1, 6.2])
    ttft, fetch = v.ttft_global(1.2)
    assert ttft == pytest.approx([1.48, 1.74, 6.2])
    assert list(fetch) == [True, True, False]
    # Threshold boundary: p1's ratio 8/4 = 2 is not *above* 2.0, so p1 recomputes.
    ttft, fetch = v.ttft_global(2.0)
    assert ttft == pytest.approx([1.48, 2.1, 6.2])
    assert list(fetch) == [True, False, False]


@pytest.mark.parametrize("cls", INDEXES)
def test_global_cache_aware_fetches_from_best_holder(cls: type[KVIndex]) -> None:
    d = _schedule("global-cache-aware", cls)
    assert isinstance(d, Accept)
    assert (d.prefill, d.local_prefix_blocks) == ("p0", 0)
    assert d.fetch == (BlockSource(first_block=0, num_blocks=8, holder="p2"),)
    assert d.expected_ttft_s == pytest.approx(1.48)


def test_global_threshold_decides_fetch_even_when_transfer_is_slow() -> None:
    # Fetch bandwidth 1000 B/s -> 0.1 s/token. Algorithm 1 judges by the prefix ratio only:
    # p0: 0.2 + 80*0.1 + 1.2 = 9.4; p1 (ratio 2 > 1.2): 0.5 + 40*0.1 + 1.2 = 5.7; p2: 6.2.
    states = [pstate("p0", 0.2, bw=1000.0), pstate("p1", 0.5, bw=1000.0), pstate("p2", 5.0)]
    d = _schedule("global-cache-aware", states=states)
    assert isinstance(d, Accept)
    assert (d.prefill, d.fetch) == ("p1", (BlockSource(4, 4, "p2"),))
    assert d.expected_ttft_s == pytest.approx(5.7)
    # A threshold of 2 makes p1 recompute its missing blocks: 0.5 + 1 + 0.6 = 2.1.
    d = _schedule("global-cache-aware", states=states, kvcache_balancing_threshold=2.0)
    assert isinstance(d, Accept)
    assert (d.prefill, d.fetch, d.local_prefix_blocks) == ("p1", (), 4)
    assert d.expected_ttft_s == pytest.approx(2.1)


def test_global_with_partial_fetch_keeps_local_blocks() -> None:
    states = [pstate("p0", 9.0), pstate("p1", 0.5), pstate("p2", 5.0)]
    d = _schedule("global-cache-aware", states=states)
    assert isinstance(d, Accept)
    assert d.prefill == "p1" and d.local_prefix_blocks == 4
    assert d.fetch == (BlockSource(4, 4, "p2"),)
    assert d.expected_ttft_s == pytest.approx(1.74)


def test_best_holder_can_be_a_store_segment() -> None:
    hold = {"p0": 0, "p1": 4, "store-0": 10}
    states = [pstate("p0", 0.0), pstate("p1", 0.0)]
    for cls in INDEXES:
        d = _schedule("global-cache-aware", cls, states=states, hold=hold)
        # p0: 100 tokens * 0.001 + prefill 0 (fully cached) = 0.1; p1: 60*0.001 = 0.06
        assert isinstance(d, Accept)
        assert d.prefill == "p1" and d.fetch == (BlockSource(4, 6, "store-0"),)
        assert d.expected_ttft_s == pytest.approx(0.06)


def test_unhealthy_holder_is_not_a_fetch_source() -> None:
    states = [pstate("p0", 0.2), pstate("p1", 0.5), pstate("p2", 0.0, healthy=False)]
    for cls in INDEXES:
        v = _view(states, cls=cls)
        assert (v.best_len, v.best_holder) == (4, "p1")
        d = _schedule("global-cache-aware", cls, states=states)
        # p0 fetches 4 blocks: 0.2 + 0.04 + (1 + 0.6) = 1.84; p1: 2.1
        assert isinstance(d, Accept) and d.prefill == "p0"
        assert d.fetch == (BlockSource(0, 4, "p1"),)
        assert d.expected_ttft_s == pytest.approx(1.84)


def test_local_cache_aware_and_least_load() -> None:
    d = _schedule("local-cache-aware")
    assert isinstance(d, Accept)
    assert (d.prefill, d.fetch, d.expected_ttft_s) == ("p1", (), pytest.approx(2.1))
    d = _schedule("least-load")
    assert isinstance(d, Accept)
    assert (d.prefill, d.fetch, d.expected_ttft_s) == ("p0", (), pytest.approx(2.2))


def test_ties_go_to_the_first_instance() -> None:
    states = [pstate("a", 1.0), pstate("b", 1.0), pstate("c", 1.0)]
    for policy in ("least-load", "local-cache-aware", "global-cache-aware"):
        d = _schedule(policy, states=states, hold={})
        assert isinstance(d, Accept) and d.prefill == "a", policy


def test_round_robin_cycles_healthy_instances() -> None:
    states = [pstate("p0", 0.0), pstate("p1", 0.0, healthy=False), pstate("p2", 0.0)]
    c = Conductor(ConductorConfig(prefill_policy="round-robin"), PRED)
    snap = snapshot(states, index_with({}))
    got = [c.schedule(request(), snap) for _ in range(4)]
    assert [d.prefill for d in got if isinstance(d, Accept)] == ["p0", "p2", "p0", "p2"]
    # A what-if query does not advance the cursor; committing it does.
    d1 = c.schedule(request(), snap, commit=False)
    d2 = c.schedule(request(), snap, commit=False)
    assert isinstance(d1, Accept) and isinstance(d2, Accept)
    assert d1.prefill == d2.prefill == "p0"
    c.on_accept(request(), d1, 0.0)
    d3 = c.schedule(request(), snap)
    assert isinstance(d3, Accept) and d3.prefill == "p2"


def test_random_is_seeded_and_uniform_over_healthy() -> None:
    states = [pstate(f"p{i}", 0.0, healthy=i != 2) for i in range(5)]
    snap = snapshot(states, index_with({}))
    healthy = [0, 1, 3, 4]

    def run(seed: int) -> list[str]:
        c = Conductor(ConductorConfig(prefill_policy="random", seed=seed), PRED)
        return [d.prefill for d in (c.schedule(request(), snap) for _ in range(400)) if isinstance(d, Accept)]  # fmt: skip

    a = run(3)
    assert a == run(3) and a != run(4)
    rng = random.Random(3)
    assert a[:20] == [f"p{healthy[rng.randrange(4)]}" for _ in range(20)]
    counts = {n: a.count(n) for n in set(a)}
    assert set(counts) == {"p0", "p1", "p3", "p4"}
    assert min(counts.values()) > 60  # 100 expected each


def test_registry() -> None:
    assert set(PREFILL_POLICIES) == {
        "random", "round-robin", "least-load", "local-cache-aware", "global-cache-aware",
    }  # fmt: skip
    p = make_prefill_policy("global-cache-aware", threshold=2.0)
    v = _view()
    choice = p.choose(v)
    assert choice is not None and (choice.index, choice.fetch) == (0, True)
    with pytest.raises(ConfigError):
        make_prefill_policy("nope")
    with pytest.raises(ConfigError):
        make_prefill_policy("random", bogus=1)
    with pytest.raises(ConfigError):
        make_prefill_policy("global-cache-aware", threshold=0.5)


def test_no_blocks_means_no_fetch() -> None:
    req = request(n_blocks=0, prompt_len=95)
    v = _view(req=req)
    assert list(v.local) == [0, 0, 0] and v.best_len == 0 and v.best_holder is None
    ttft, fetch = v.ttft_global(1.2)
    assert not fetch.any()
    assert ttft == pytest.approx(np.array([0.2, 0.5, 5.0]) + 1 + 0.95)


def test_transfer_latency_applies_to_fetching_instances_only() -> None:
    pred = type(PRED)(PRED.prefill, TransferTimeModel(latency_s=0.5), PRED.decode)
    view = ViewBuilder(pred).build(request(), snapshot(STATES, index_with(HOLD)))
    ttft, fetch = view.ttft_global(1.2)
    assert ttft == pytest.approx([1.98, 2.24, 6.2])
    assert list(fetch) == [True, True, False]
    # Per-instance bandwidths (p0: 0.01 s/token, p1: link default 0.001 s/token).
    states = [pstate("p0", 0.2, bw=10_000.0), pstate("p1", 0.5), pstate("p2", 5.0)]
    view = ViewBuilder(pred).build(request(), snapshot(states, index_with(HOLD)))
    ttft, _ = view.ttft_global(1.2)
    assert ttft == pytest.approx([0.2 + 0.5 + 0.8 + 1.2, 2.24, 6.2])
