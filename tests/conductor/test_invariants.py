"""Seeded random clusters: invariants every decision must satisfy, for every policy."""

from __future__ import annotations

import random

import pytest

from kvcake.conductor import PREFILL_POLICIES, Conductor, ConductorConfig
from kvcake.core.api import Accept, Reject

from .util import PRED, decode, index_with, pstate, request, snapshot


@pytest.mark.parametrize("policy", sorted(PREFILL_POLICIES))
def test_decisions_respect_health_estimates_and_fetch_plan(policy: str) -> None:
    rng = random.Random(11)
    c = Conductor(ConductorConfig(prefill_policy=policy), PRED)
    for _ in range(60):
        n = rng.randint(0, 7)
        states = [
            pstate(f"p{i}", rng.choice([0.0, rng.uniform(0, 3)]), healthy=rng.random() > 0.25)
            for i in range(n)
        ]
        hold = {f"p{i}": rng.randint(0, 10) for i in range(n) if rng.random() < 0.8}
        if rng.random() < 0.3:
            hold["store"] = rng.randint(0, 10)
        snap = snapshot(states, index_with(hold), (decode("d0"), decode("d1", running=3)))
        req = request(prompt_len=rng.choice([100, 95]))
        d = c.schedule(req, snap)
        healthy = [s.instance_id for s in states if s.healthy]
        if not healthy:
            assert isinstance(d, Reject)
            continue
        assert isinstance(d, Accept)
        assert d.prefill in healthy and d.decode == "d0"
        assert d.local_prefix_blocks == hold.get(d.prefill, 0)
        est = c.estimate_ttfts(req, snap)
        i = [s.instance_id for s in states].index(d.prefill)
        if policy == "global-cache-aware":
            assert d.expected_ttft_s == pytest.approx(float(est.min()))
            assert d.expected_ttft_s == pytest.approx(float(est[i]))
        else:
            assert not d.fetch
            local = c.last_view.ttft_local() if c.last_view else None
            assert local is not None and d.expected_ttft_s == pytest.approx(float(local[i]))
            if policy == "local-cache-aware":
                assert d.expected_ttft_s == pytest.approx(float(local.min()))
        for src in d.fetch:  # fetch continues the local prefix up to the best one
            assert src.first_block == d.local_prefix_blocks
            assert src.holder is not None and src.holder != d.prefill
            end = src.first_block + src.num_blocks
            assert end == max(v for k, v in hold.items() if k in healthy or k == "store")
