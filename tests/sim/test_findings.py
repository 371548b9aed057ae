"""Report texts follow the data and the trace: cache models, paper cache ratios by trace kind,
capacity findings when baselines (or everything) are 0."""

from __future__ import annotations

import pytest

from kvcake.core.trace import TraceRecord
from kvcake.sim.experiments.cache import lru_hit_rate
from kvcake.sim.experiments.common import ExpResult
from kvcake.sim.experiments.findings import compare, paper_cache_ratio


def test_block_lru_is_block_weighted_and_evicts_the_head_first() -> None:
    recs = [TraceRecord(0, 1024, 1, (1, 2)), TraceRecord(1, 1024, 1, (1, 2)),
            TraceRecord(2, 1000, 1, (1, 3))]  # fmt: skip
    assert lru_hit_rate(recs, 10**9, model="block-lru") == pytest.approx(3 / 6)
    # one block of room, in-order LRU: the head (1) is touched first, so the deepest block (2)
    # survives and no later request hits its first block
    assert lru_hit_rate(recs, 512, model="block-lru") == 0.0
    assert lru_hit_rate(recs, 512, model="paper") > 0  # the paper model keeps the head
    with pytest.raises(ValueError):
        lru_hit_rate(recs, 512, model="fifo")


def test_paper_cache_ratio_by_trace_kind() -> None:
    assert paper_cache_ratio("conversation") == "40%"
    assert paper_cache_ratio("conversation_sample") == "40%"
    assert paper_cache_ratio("toolagent").startswith("59%")
    assert paper_cache_ratio("synthetic-synth").startswith("66%")
    assert "not one of the paper's" in paper_cache_ratio("my_trace")


def _capacity(moon: float, base: float) -> ExpResult:
    th = [100, 200, 300]
    run = {"avg_tbt_s": 0.02}
    d = {"thresholds_ms": th, "speeds": [0.5, 1.0], "rate": 1.0,
         "mooncake": {"capacity_rps": [moon] * 3, "runs": [run]},
         **{k: {"capacity_rps": [base] * 3, "runs": [run]}
            for k in ("vllm", "vllm-prefix", "vllm-chunked")}}  # fmt: skip
    return ExpResult("capacity", "t", [], [], d)


def test_capacity_findings_when_baselines_are_zero() -> None:
    text = " ".join(compare(_capacity(0.8, 0.0)).diffs)
    assert "unbounded" in text and "narrower" not in text
    text = " ".join(compare(_capacity(0.0, 0.0)).diffs)
    assert "No system meets" in text and "narrower" not in text
    text = " ".join(compare(_capacity(0.9, 0.5)).diffs)
    assert "+80%, within the paper's" in text
