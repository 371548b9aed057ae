"""``kvcake plan`` is held to account: planted traces where pooling obviously pays and where it
obviously does not get the right verdicts, and the recommended configuration, simulated again
on its own, meets the SLOs."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from kvcake.core.trace import TraceRecord
from kvcake.sim.plan import PlanConfig, Planner
from kvcake.sim.plan.report import write_plan
from kvcake.sim.plan.search import sim_config
from kvcake.sim.runner import simulate

SLOS = dict(ttft_slo_s=3.0, tbt_slo_s=0.1)


def shared_prefix_trace(n: int = 500, docs: int = 60, doc_blocks: int = 16, rate: float = 6.0,
                        seed: int = 1) -> list[TraceRecord]:  # fmt: skip
    """Every request = one of ``docs`` long documents + one private block: ~90% reusable, a
    working set (~490k tokens) far larger than one node's 25k-token local cache."""
    rng = random.Random(seed)
    out, fresh = [], docs * doc_blocks
    for i in range(n):
        d = rng.randrange(docs)
        blocks = (*range(d * doc_blocks, (d + 1) * doc_blocks), fresh + i)
        out.append(TraceRecord(i * 1000.0 / rate, 512 * len(blocks), 32, blocks))
    return out


def no_reuse_trace(n: int = 300, blocks: int = 8, rate: float = 3.0) -> list[TraceRecord]:
    return [TraceRecord(i * 1000.0 / rate, 512 * blocks, 32,
                        tuple(range(i * blocks, (i + 1) * blocks))) for i in range(n)]  # fmt: skip


@pytest.fixture(scope="module")
def pays() -> tuple[list[TraceRecord], PlanConfig, object]:
    recs = shared_prefix_trace()
    cfg = PlanConfig(network_gbps=800.0, local_cache_tokens=25_000, traffic=(1.0,), jobs=1,
                     max_nodes=24, **SLOS)  # fmt: skip
    return recs, cfg, Planner(recs, cfg, "pays").run()


def test_pooling_pays_on_long_shared_prefixes_and_a_fast_network(pays, tmp_path: Path) -> None:
    _, _, plan = pays
    assert plan.pays(1.0), plan.verdict
    pooled, local = plan.best[1.0]["disagg-pool"], plan.best[1.0]["disagg-local"]
    assert pooled is not None and pooled.hit_rate > 0.6
    assert local is None or pooled.nodes < local.nodes
    assert plan.recommended[1.0] is not None and plan.recommended[1.0].variant == "disagg-pool"
    md = write_plan(plan, tmp_path, "kvcake plan test").read_text()
    assert "Does pooling pay off?** pays" in md and (tmp_path / "plan.png").is_file()


def test_recommended_configuration_resimulated_meets_its_slos(pays) -> None:
    recs, cfg, plan = pays
    rec = plan.recommended[1.0]
    sc = sim_config(Planner(recs, cfg).base, cfg, rec.variant, rec.prefill, rec.decode,
                    rec.pool_tokens, rec.gbps, 1.0)  # fmt: skip
    r = simulate(recs, sc)
    with np.errstate(invalid="ignore"):
        good = r.completed & (r.ttft <= SLOS["ttft_slo_s"]) & (r.tbt <= SLOS["tbt_slo_s"])
    assert r.rejected() == 0 and good.mean() >= cfg.target
    # and one node fewer (any split) does not: the recommendation is the cheapest
    smaller = [p for p in plan.points if p.variant == rec.variant and p.nodes == rec.nodes - 1
               and p.pool_tokens >= rec.pool_tokens and p.traffic == 1.0 and p.gbps == rec.gbps]  # fmt: skip
    assert all(not p.meets for p in smaller)


def test_pooling_does_not_pay_without_reuse_on_a_slow_network() -> None:
    recs = no_reuse_trace()
    cfg = PlanConfig(network_gbps=10.0, traffic=(1.0,), jobs=1, max_nodes=16, **SLOS)
    plan = Planner(recs, cfg, "no-reuse").run()
    assert plan.verdict[1.0].startswith("does not pay"), plan.verdict
    assert not plan.pays(1.0)
    rec = plan.recommended[1.0]
    assert rec is not None and rec.variant != "disagg-pool"
    pooled = plan.best[1.0]["disagg-pool"]
    assert pooled is None or pooled.hit_rate < 0.01
