"""Per-request metrics and cluster aggregates of one simulation run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvcake.core.stats import meets_slo, percentile
from kvcake.sim.request import Outcome, SimRequest, tbt_many

_OUTCOME_CODE = {
    Outcome.DONE: 0,
    Outcome.REJECTED: 1,
    Outcome.REJECTED_AFTER_PREFILL: 2,
    Outcome.PENDING: 3,
}


@dataclass
class LoadSeries:
    """Load over time: prefill load = mean predicted queue time / TTFT SLO; decode load = mean
    predicted iteration time / TBT SLO (the paper's "load relative to the SLO")."""

    t: list[float] = field(default_factory=list)
    prefill: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)


@dataclass
class SimResult:
    """Arrays are indexed by request (trace order). Times in seconds; NaN where not reached
    (and ``tbt`` NaN for a request with one output token: no gap, no TBT; core.stats)."""

    arrival: np.ndarray
    ttft: np.ndarray
    tbt: np.ndarray
    queue: np.ndarray
    prefill_compute: np.ndarray
    transfer: np.ndarray
    prompt_tokens: np.ndarray
    hit_tokens: np.ndarray
    local_hit_tokens: np.ndarray
    output_tokens: np.ndarray
    outcome: np.ndarray  # 0 done, 1 rejected at arrival, 2 rejected after prefill, 3 unfinished
    finish: np.ndarray
    events: int = 0
    wall_s: float = 0.0
    sim_end_s: float = 0.0
    load: LoadSeries = field(default_factory=LoadSeries)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_requests(cls, reqs: Sequence[SimRequest]) -> SimResult:
        def arr(f: Callable[[SimRequest], float | None]) -> np.ndarray:
            return np.array([f(r) for r in reqs], dtype=float)

        done = np.array([r.outcome is Outcome.DONE for r in reqs], dtype=bool)
        tbt = tbt_many([r.gaps for r in reqs])
        tbt[~done] = np.nan
        return cls(
            arrival=arr(lambda r: r.arrival),
            ttft=arr(lambda r: r.ttft),
            tbt=tbt,
            queue=arr(lambda r: r.queue_time),
            prefill_compute=arr(lambda r: r.prefill_compute),
            transfer=arr(lambda r: r.transfer),
            prompt_tokens=arr(lambda r: r.prompt_len),
            hit_tokens=arr(lambda r: r.hit_tokens),
            local_hit_tokens=arr(lambda r: r.local_hit_tokens),
            output_tokens=arr(lambda r: r.output_len),
            outcome=np.array([_OUTCOME_CODE[r.outcome] for r in reqs], dtype=np.int8),
            finish=arr(lambda r: r.finish),
        )

    # --- aggregates -------------------------------------------------------------------------

    @property
    def n(self) -> int:
        return len(self.arrival)

    @property
    def completed(self) -> np.ndarray:
        return np.asarray(self.outcome == 0)

    def rejected(self) -> int:
        return int(np.count_nonzero((self.outcome == 1) | (self.outcome == 2)))

    def rejected_after_prefill(self) -> int:
        return int(np.count_nonzero(self.outcome == 2))

    def effective(self, tbt_threshold_s: float, ttft_threshold_s: float = 30.0) -> np.ndarray:
        """Requests served with TTFT and TBT within the thresholds (paper §5); a request
        without a TBT (one output token: NaN) meets any TBT threshold."""
        ok = self.completed
        with np.errstate(invalid="ignore"):
            out: np.ndarray = ok & (self.ttft <= ttft_threshold_s)
        return np.asarray(out & meets_slo(self.tbt, tbt_threshold_s))

    def effective_share(self, tbt_threshold_s: float, ttft_threshold_s: float = 30.0) -> float:
        return float(self.effective(tbt_threshold_s, ttft_threshold_s).mean()) if self.n else 0.0

    def goodput(self, tbt_threshold_s: float, ttft_threshold_s: float = 30.0) -> float:
        """Effective requests per second of replayed trace time."""
        span = float(np.nanmax(self.arrival)) if self.n else 0.0
        return float(self.effective(tbt_threshold_s, ttft_threshold_s).sum()) / max(span, 1e-9)

    def hit_rate(self) -> float:
        """Share of prompt tokens (of requests that were prefilled) served from cache."""
        m = ~np.isnan(self.ttft)
        tot = self.prompt_tokens[m].sum()
        return float(self.hit_tokens[m].sum() / tot) if tot else 0.0

    def mean(self, name: str, completed_only: bool = True) -> float:
        a = getattr(self, name)
        a = a[self.completed] if completed_only else a
        a = a[~np.isnan(a)]
        return float(a.mean()) if a.size else float("nan")

    def summary(self, tbt_threshold_s: float = 0.1) -> dict[str, float]:
        return {
            "requests": float(self.n),
            "completed": float(self.completed.sum()),
            "rejected": float(self.rejected()),
            "rejected_after_prefill": float(self.rejected_after_prefill()),
            "avg_ttft_s": self.mean("ttft"),
            "p90_ttft_s": percentile(self.ttft[self.completed], 90),
            "avg_tbt_s": self.mean("tbt"),
            "p90_tbt_s": percentile(self.tbt[self.completed], 90),
            "avg_queue_s": self.mean("queue"),
            "avg_prefill_compute_s": self.mean("prefill_compute", completed_only=False),
            "total_prefill_compute_s": float(np.nansum(self.prefill_compute)),
            "avg_transfer_s": self.mean("transfer"),
            "hit_rate": self.hit_rate(),
            "effective_share": self.effective_share(tbt_threshold_s),
            "events": float(self.events),
            "wall_s": self.wall_s,
            "events_per_s": self.events / self.wall_s if self.wall_s else 0.0,
        }
