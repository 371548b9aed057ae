"""Bounded history for the dashboard: a ring of samples of the proxy's cumulative counters,
turned into per-interval rates (hit rate per tier, requests, 429s) when a snapshot is built.

Invariant: at most ``capacity`` samples are kept; a rate is computed only between two samples
of the same process (a counter that went down means the proxy restarted: that interval is
dropped, never shown as a negative rate).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from kvcake.core.promtext import Series, total

HITS, QUERIES = "kvcake:prefix_cache_hits_total", "kvcake:prefix_cache_queries_total"
BY_TIER = "kvcake_proxy_kv_tier_tokens_total"  # the proxy's attribution, labels `tier`, `node`


def series_of(registry: CollectorRegistry) -> Series:
    """Every sample of ``registry`` (the proxy's own ``/metrics``, without the text round trip).
    A proxy exporting only vLLM's names (``vllm:``) is read as if they were ``kvcake:``."""
    out: Series = {}
    for fam in registry.collect():
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    if not any(n.startswith("kvcake:") for n, _ in out):
        out = {(n.replace("vllm:", "kvcake:", 1), lbl): v for (n, lbl), v in out.items()}
    return out


def tier_tokens(series: Series) -> tuple[float, dict[str, float]]:
    """(prompt tokens attributed, reused tokens per tier), cumulative. With the proxy's
    per-tier attribution (``kv_tier_tokens``: local / pool_dram / ssd / computed) each reuse
    tier gets a line and ``all`` is their sum; without it, ``all`` = prefix-cache hits over
    queries."""
    tiers: dict[str, float] = {}
    for (name, labels), v in series.items():
        if name == BY_TIER:
            tier = dict(labels).get("tier", "")
            tiers[tier] = tiers.get(tier, 0.0) + v
    if not tiers:
        return total(series, QUERIES), {"all": total(series, HITS)}
    denom = sum(tiers.values())
    tiers.pop("computed", None)
    return denom, {"all": sum(tiers.values()), **tiers}


@dataclass(frozen=True)
class Sample:
    at: float  # wall-clock seconds
    queries: float  # prompt tokens the tier figures are a share of
    tiers: dict[str, float]
    finished: float
    rejected: float


def sample(series: Series, at: float) -> Sample:
    denom, tiers = tier_tokens(series)
    return Sample(
        at=at,
        queries=denom,
        tiers=tiers,
        finished=total(series, "kvcake:request_success_total"),
        rejected=total(series, "kvcake_proxy_request_rejections_total"),
    )


@dataclass
class History:
    capacity: int = 600  # 10 minutes at one sample a second
    samples: deque[Sample] = field(init=False)

    def __post_init__(self) -> None:
        if self.capacity < 2:
            raise ValueError("History.capacity must be >= 2")
        self.samples = deque(maxlen=self.capacity)

    def add(self, s: Sample) -> None:
        self.samples.append(s)

    def points(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Per-interval figures, oldest first: ``hit_rate`` per tier (None when no prompt
        token was looked up in the interval), finished requests and 429s per second."""
        out: list[dict[str, Any]] = []
        pairs = list(zip(self.samples, list(self.samples)[1:], strict=False))
        for a, b in pairs[-limit:] if limit else pairs:
            dt, dq = b.at - a.at, b.queries - a.queries
            if dt <= 0 or dq < 0 or b.finished < a.finished:
                continue  # a restarted proxy: counters went back to zero
            rates = {
                t: (v - a.tiers.get(t, 0.0)) / dq if dq > 0 else None for t, v in b.tiers.items()
            }
            out.append(
                {
                    "at": b.at,
                    "hit_rate": rates,
                    "lookups": dq,
                    "finished_per_s": (b.finished - a.finished) / dt,
                    "rejected_per_s": (b.rejected - a.rejected) / dt,
                }
            )
        return out
