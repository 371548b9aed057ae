"""The live-path model (``fetch_source = "pool"``): store pool tiers and accounting, both NICs,
index lag, noisy predictors, node failures."""

from __future__ import annotations

import pytest

from kvcake.conductor import PrefixIndex
from kvcake.core.costmodel import preset
from kvcake.core.errors import ConfigError
from kvcake.core.trace import TraceRecord
from kvcake.sim.config import SimConfig, parse_failures
from kvcake.sim.events import EventQueue
from kvcake.sim.pool import POOL_HOLDER, LaggedIndex, StorePool
from kvcake.sim.pooled import PooledCluster
from kvcake.sim.runner import simulate
from kvcake.sim.sched import noisy_predictors


def _shared(n: int = 40, gap_ms: float = 2000.0) -> list[TraceRecord]:
    """Requests sharing a 16-block document, one private block each, well spaced."""
    doc = tuple(range(16))
    return [TraceRecord(i * gap_ms, 17 * 512, 8, (*doc, 100 + i)) for i in range(n)]


def test_pool_tiers_demote_promote_and_keep_the_index_exact() -> None:
    idx = PrefixIndex()
    pool = StorePool(dram_blocks=4, ssd_blocks=4, nodes=2, index=idx)
    pool.put([1, 2, 3, 4])
    pool.put([5, 6])  # 6 deepest of the new put; DRAM keeps the 4 most recent: 5, 6, 1, 2
    assert set(pool.dram) == {5, 6, 1, 2} and set(pool.ssd) == {3, 4}
    dram, ssd = pool.read([3, 4])  # SSD reads promote to DRAM
    assert sum(ssd.values()) == 2 and not dram and 3 in pool.dram
    pool.put([7, 8, 9, 10, 11, 12])  # overflow both tiers: some blocks leave the pool
    assert len(pool.dram) <= 4 and len(pool.ssd) <= 4 and not set(pool.dram) & set(pool.ssd)
    held = set(pool.dram) | set(pool.ssd)
    assert idx.blocks_of(POOL_HOLDER) == len(held) == len(pool)
    assert all(POOL_HOLDER in idx.holders(b) for b in held)
    assert pool.evictions == 12 - len(held)


def test_lagged_index_delivers_in_order_after_the_delay() -> None:
    eq, idx = EventQueue(), PrefixIndex()
    lag = LaggedIndex(idx, eq, 0.5)
    lag.add(POOL_HOLDER, [1, 2])
    lag.remove(POOL_HOLDER, [1])
    assert idx.blocks_of(POOL_HOLDER) == 0
    eq.run(until=0.4)
    assert idx.blocks_of(POOL_HOLDER) == 0
    eq.run()
    assert idx.holders(2) == frozenset({POOL_HOLDER}) and not idx.holders(1)


def test_pool_fetches_reuse_and_slow_links_cost_ttft() -> None:
    recs = _shared()
    base = SimConfig(prefill_nodes=2, decode_nodes=1, fetch_source="pool", cache_tokens=0)
    fast = simulate(recs, base)
    slow = simulate(recs, base.with_(link_gbps=5.0))
    nopool = simulate(recs, base.with_(pool_tokens_per_node=0, prefill_policy="least-load"))
    assert fast.hit_rate() > 0.85 and nopool.hit_rate() == 0.0  # no local cache, no pool
    assert fast.mean("ttft") < nopool.mean("ttft")
    assert slow.mean("ttft") > fast.mean("ttft") + 0.5  # KV streams + fetches at 5 Gbps
    cl = fast.extra["cluster"]
    assert isinstance(cl, PooledCluster) and len(cl.pool) == 16 + len(recs)


def test_decode_nic_is_shared_by_prefill_nodes_streaming_to_it() -> None:
    """Two simultaneous 16k-token prompts on two prefill nodes, one decode node: at 10 Gbps
    the second KV stream waits for the first on the decode node's receive side."""
    recs = [TraceRecord(0.0, 16384, 2, tuple(range(32))),
            TraceRecord(0.0, 16384, 2, tuple(range(100, 132)))]  # fmt: skip
    cfg = SimConfig(prefill_nodes=2, decode_nodes=1, fetch_source="pool", link_gbps=10.0,
                    pool_tokens_per_node=0).with_(prefill_policy="least-load")  # fmt: skip
    r = simulate(recs, cfg)
    stream = 16384 * preset().model.kv_bytes_per_token / (10e9 / 8)
    t = sorted(r.ttft)
    assert t[1] - t[0] == pytest.approx(stream, rel=0.02)


def test_noisy_predictors_are_fitted_and_drive_the_conductor() -> None:
    cm = preset()
    exact, noisy = noisy_predictors(cm, 0.0), noisy_predictors(cm, 0.3, seed=3)
    assert exact.prefill.coefficients == cm.prefill
    assert noisy.prefill.coefficients != cm.prefill and noisy.prefill.fit_error > 0.05
    rel = abs(noisy.prefill.time(8000) / cm.prefill_time(8000) - 1)
    assert 0 < rel < 0.5
    r = simulate(_shared(), SimConfig(fetch_source="pool", predictor_noise=0.3))
    assert r.completed.all()


def test_failures_reroute_prefill_and_lose_decode_requests() -> None:
    recs = [TraceRecord(i * 100.0, 4096, 200, tuple(range(i * 8, i * 8 + 8))) for i in range(60)]
    cfg = SimConfig(prefill_nodes=2, decode_nodes=2, fetch_source="pool")
    ok = simulate(recs, cfg)
    assert ok.completed.all()
    r = simulate(recs, cfg.with_(failures="p0@1,d1@2"))
    cl = r.extra["cluster"]
    assert r.rejected() > 0  # requests on d1 at t=2 are lost
    after = [q for q in cl.finished if q.arrival > 2.0]
    assert after and all(q.prefill_inst == 1 and q.decode_inst == 0 for q in after)
    assert cl.index.blocks_of(cl.prefill[0].iid) == 0
    assert all(d.kv_used == 0 for d in cl.decode)


def test_failure_spec_is_validated() -> None:
    assert parse_failures("p0@300, d1@600.5", 2, 2) == [("p", 0, 300.0), ("d", 1, 600.5)]
    for bad in ("x0@1", "p0", "p9@1", "p0@-1"):
        with pytest.raises(ConfigError):
            SimConfig(prefill_nodes=2, decode_nodes=2, failures=bad)


def test_prefill_batching_shares_one_call_overhead() -> None:
    """Three 1024-token prompts at t=0 on one prefill node: the first runs alone (the queue was
    empty), the other two run as one batch that pays the per-call overhead c0 once."""
    recs = [TraceRecord(0.0, 1024, 2, (10 * i, 10 * i + 1)) for i in range(3)]
    base = SimConfig(prefill_nodes=1, decode_nodes=1, fetch_source="pool",
                     pool_tokens_per_node=0).with_(prefill_policy="least-load")  # fmt: skip
    one, batched = simulate(recs, base), simulate(recs, base.with_(prefill_batch_tokens=4096))
    cm = preset()
    t = cm.chunked_prefill_time(1024, 0, 4096)
    assert one.queue[2] == pytest.approx(2 * t)  # serial: waits for two prefills
    assert batched.queue[1] == batched.queue[2] == pytest.approx(t)  # batched: start together
    end = t + 2 * t - cm.prefill.c0
    cl = batched.extra["cluster"]
    assert cl.prefill[0].busy_s == pytest.approx(end)
    assert batched.completed.all() and all(d.kv_used == 0 for d in cl.decode)
