"""``kvcake plan``'s search: the cheapest configuration of every architecture that meets the
SLOs, the recommendation, its headroom, whether pooling pays off (and from which hit rate and
bandwidth on), and the same at more traffic.

Cost = nodes (one node = one instance of ``--hardware``); among equally many nodes a
configuration without a pool is preferred (it needs no pool DRAM), then the higher share.

Sizes are searched per architecture, all architectures in parallel rounds: from a lower bound
(prefill work with every reusable block reused, divided by the trace span) sizes grow by 1.5x
until one meets the SLOs, then bisection; a disaggregated size "meets" if one of the P/D splits
P = N/4, N/2, 3N/4 does, and the answer is re-checked with every split at N and N-1.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field

from kvcake.core.costmodel import min_reuse_bandwidth
from kvcake.core.errors import TraceError
from kvcake.core.trace import TraceRecord, TraceStats, trace_stats
from kvcake.sim.config import SimConfig
from kvcake.sim.plan.search import (
    BY_KEY,
    VARIANTS,
    Evaluator,
    PlanConfig,
    Point,
    cost_model_for,
    default_slos,
    resolve_hardware,
    sim_config,
)
from kvcake.sim.traces import ideal_prefill_s

HEADROOM = (1.1, 1.25, 1.5, 2.0, 3.0, 4.0)
BANDWIDTHS = (10.0, 25.0, 50.0, 100.0, 200.0, 400.0, 800.0)
CAPACITY_FACTORS = (0.0, 1 / 16, 1 / 4, 1.0, 4.0)

Search = Generator[list[tuple[str, SimConfig]], list[Point], Point | None]


@dataclass
class Plan:
    cfg: PlanConfig
    name: str
    stats: TraceStats
    rate: float
    ttft_slo: float
    tbt_slo: float
    slo_rule: str
    best: dict[float, dict[str, Point | None]] = field(default_factory=dict)
    recommended: dict[float, Point | None] = field(default_factory=dict)
    headroom: dict[str, tuple[float, list[Point]]] = field(default_factory=dict)
    verdict: dict[float, str] = field(default_factory=dict)
    capacity_sweep: list[Point] = field(default_factory=list)
    bandwidth_sweep: list[Point] = field(default_factory=list)
    reuse_gbps: float = math.nan  # paper §2.2: load beats recompute above this
    runs: int = 0
    wall_s: float = 0.0
    points: list[Point] = field(default_factory=list)

    def pays(self, traffic: float = 1.0) -> bool:
        return self.verdict.get(traffic, "").startswith("pays")


def check_trace(records: Sequence[TraceRecord]) -> float:
    """Span in seconds; a clear error for traces the plan cannot size a cluster for."""
    if not records:
        raise TraceError("the trace has no requests")
    ts = [r.timestamp_ms for r in records]
    span = (max(ts) - min(ts)) / 1000.0
    if len(records) < 2 or span <= 0:
        raise TraceError(
            f"all {len(records)} requests have the same timestamp: the trace has no "
            "time span, so it has no request rate to plan for"
        )
    return span


def lower_bound(records: Sequence[TraceRecord], hardware: str, span: float) -> float:
    """Prefill instance-seconds per second if every block seen before were reused for free."""
    return ideal_prefill_s(records, cost_model_for(hardware)) / span


class Planner:
    def __init__(
        self,
        records: list[TraceRecord],
        cfg: PlanConfig,
        name: str = "trace",
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.records = records
        self.cfg = cfg
        span = check_trace(records)
        ttft, tbt, rule = default_slos(records, cfg.hardware)
        if cfg.ttft_slo_s:
            ttft, rule = cfg.ttft_slo_s, rule.replace("TTFT SLO =", "TTFT SLO given; rule:")
        if cfg.tbt_slo_s:
            tbt, rule = cfg.tbt_slo_s, rule.replace("TBT SLO =", "TBT SLO given; rule:")
        self.plan = Plan(cfg, name, trace_stats(records), len(records) / span, ttft, tbt, rule)
        pname, cal = resolve_hardware(cfg.hardware)
        self.base = SimConfig(
            preset=pname,
            calibration=cal,
            link_gbps=cfg.network_gbps,
            index_lag_s=cfg.index_lag_s,
            predictor_noise=cfg.predictor_noise,
            conductor=cfg.conductor,
        ).with_(ttft_slo_s=ttft, tbt_slo_s=tbt)
        self.work = lower_bound(records, cfg.hardware, span)
        self.progress = progress

    # --- configurations -------------------------------------------------------------------

    def conf(
        self,
        v: str,
        p: int,
        d: int,
        *,
        pool: int | None = None,
        gbps: float | None = None,
        traffic: float = 1.0,
    ) -> tuple[str, SimConfig]:
        pool = self.cfg.memory[2] if pool is None else pool
        gbps = self.cfg.network_gbps if gbps is None else gbps
        return v, sim_config(self.base, self.cfg, v, p, d, pool, gbps, traffic)

    def splits(self, v: str, n: int, full: bool, traffic: float) -> list[tuple[str, SimConfig]]:
        if BY_KEY[v].colocated:
            return [self.conf(v, n, 0, traffic=traffic)]
        raw = range(1, n) if full else [round(n * f) for f in (0.25, 0.5, 0.75)]
        ps = sorted({min(max(p, 1), n - 1) for p in raw})
        if full and len(ps) > 9:  # bounded: nine evenly spaced splits
            ps = sorted({ps[round(i * (len(ps) - 1) / 8)] for i in range(9)})
        return [self.conf(v, p, n - p, traffic=traffic) for p in ps]

    @staticmethod
    def pick(points: Sequence[Point]) -> Point | None:
        ok = [p for p in points if p.meets]
        return max(ok, key=lambda p: (p.share, -p.ttft_p90)) if ok else None

    # --- the size search (a generator per architecture, driven in parallel rounds) -----------

    def size_search(self, v: str, traffic: float, lb: int) -> Search:
        vmin = 1 if BY_KEY[v].colocated else 2
        n, fail = max(vmin, min(lb, self.cfg.max_nodes)), 0
        best: Point | None = None
        shares: list[float] = []
        while best is None:
            pts = yield self.splits(v, n, False, traffic)
            best = self.pick(pts)
            top = max(pts, key=lambda p: p.share)
            shares.append(top.share)
            if best is None:
                # more nodes stopped helping although TTFT is met: TBT-bound (e.g. colocated
                # prefill stalls), more of the same will not get there
                ttft_ok = top.ttft_p90 <= self.plan.ttft_slo
                if n >= self.cfg.max_nodes or (ttft_ok and stalled(shares)):
                    return None
                fail, n = n, min(self.cfg.max_nodes, max(n + 1, math.ceil(n * 1.5)))
        hi = n
        while hi - fail > 1 and hi - 1 >= vmin:
            mid = (fail + hi) // 2
            got = self.pick((yield self.splits(v, mid, False, traffic)))
            if got is not None:
                hi, best = mid, got
            else:
                fail = mid
        if not BY_KEY[v].colocated:
            best = self.pick((yield self.splits(v, hi, True, traffic))) or best
            if hi - 1 >= vmin:
                lower = self.pick((yield self.splits(v, hi - 1, True, traffic)))
                best = lower or best
        return best

    def drive(self, ev: Evaluator, searches: dict[str, Search]) -> dict[str, Point | None]:
        out: dict[str, Point | None] = {}
        pending: dict[str, list[tuple[str, SimConfig]]] = {}
        for k, g in searches.items():
            pending[k] = next(g)
        while pending:
            batch = [c for cs in pending.values() for c in cs]
            ev.run(batch, self.cfg.target)
            nxt: dict[str, list[tuple[str, SimConfig]]] = {}
            for k, cs in pending.items():
                try:
                    nxt[k] = searches[k].send(ev.run(cs, self.cfg.target))
                except StopIteration as stop:
                    out[k] = stop.value
            pending = nxt
        return out

    # --- the plan ---------------------------------------------------------------------------

    def run(self) -> Plan:
        pl, cfg = self.plan, self.cfg
        with Evaluator(self.records, cfg.workers, self.progress) as ev:
            for t in cfg.traffic:
                prev = pl.best.get(cfg.traffic[0], {})
                searches: dict[str, Search] = {}
                for v in VARIANTS:
                    lb = math.ceil(self.work * t) + (0 if v.colocated else 1)
                    p1 = prev.get(v.key)
                    if p1 is not None and t > cfg.traffic[0]:
                        lb = max(lb, p1.nodes)
                    searches[v.key] = self.size_search(v.key, t, lb)
                pl.best[t] = self.drive(ev, searches)
                pl.recommended[t] = cheapest(pl.best[t].values())
            self.refine(ev)
            pl.runs = ev.runs
            pl.points = list(ev.done.values())
        return pl

    def refine(self, ev: Evaluator) -> None:
        """Headroom, pool capacity and bandwidth sweeps, and the verdicts."""
        pl, cfg = self.plan, self.cfg
        t0 = cfg.traffic[0]
        best = pl.best[t0]
        pooled = best.get("disagg-pool")
        others = [p for k, p in best.items() if not BY_KEY[k].pooled and p is not None]
        local = cheapest(others)
        rec = pl.recommended[t0]
        if pooled is not None:  # pool sizes around the hardware's
            caps = [round(cfg.memory[2] * f) for f in CAPACITY_FACTORS]
            pts = ev.run(
                [self.conf("disagg-pool", pooled.prefill, pooled.decode, pool=c) for c in caps],
                cfg.target,
            )
            # the sweep says from which hit rate on the pool pays; the recommendation keeps the
            # hardware's DRAM (shrinking the pool saves no node and costs headroom)
            pl.capacity_sweep = pts
            bws = sorted({b for b in BANDWIDTHS if b < cfg.network_gbps} | {cfg.network_gbps})
            pl.bandwidth_sweep = ev.run(
                [
                    self.conf(
                        "disagg-pool",
                        pooled.prefill,
                        pooled.decode,
                        pool=pooled.pool_tokens,
                        gbps=b,
                    )
                    for b in bws
                ],
                cfg.target,
            )
        for key, p in (("recommended", rec), ("pooled", pooled), ("local", local)):
            if p is not None:
                pts = ev.run(
                    [
                        self.conf(
                            p.variant, p.prefill, p.decode, pool=p.pool_tokens, traffic=t0 * m
                        )
                        for m in HEADROOM
                    ],
                    cfg.target,
                )
                head = 1.0
                for m, q in zip(HEADROOM, pts, strict=True):
                    if not q.meets:
                        break
                    head = m
                pl.headroom[key] = (head, pts)
        for t in cfg.traffic:
            pl.verdict[t] = self.verdict(t)
        hit = [r for r in self.records if r.hash_ids]
        if pooled is not None and hit:
            cm = cost_model_for(cfg.hardware)
            prefix = max(512.0, pooled.hit_rate * sum(r.input_length for r in hit) / len(hit))
            pl.reuse_gbps = min_reuse_bandwidth(cm.model, cm.hardware, int(prefix)) * 8 / 1e9

    def verdict(self, t: float) -> str:
        best = self.plan.best[t]
        pooled = best.get("disagg-pool")
        local = cheapest(p for k, p in best.items() if not BY_KEY[k].pooled)
        if pooled is None and local is None:
            return f"undecided: no configuration up to {self.cfg.max_nodes} nodes meets the SLOs"
        if local is None:
            return f"pays: only the pooled cluster meets the SLOs within {self.cfg.max_nodes} nodes"
        if pooled is None or pooled.nodes > local.nodes:
            return "does not pay: the pool costs nodes (or never meets the SLOs)"
        if pooled.nodes < local.nodes:
            saved = local.nodes - pooled.nodes
            return (
                f"pays: {pooled.nodes} nodes with the pool vs {local.nodes} without "
                f"({saved} fewer, -{saved / local.nodes:.0%})"
            )
        hp = self.plan.headroom.get("pooled", (1.0, []))[0]
        hl = self.plan.headroom.get("local", (1.0, []))[0]
        if t == self.cfg.traffic[0] and hp >= hl * 1.1:
            return (
                f"pays in headroom only: same {pooled.nodes} nodes, but the pooled cluster "
                f"holds {hp:g}x the traffic vs {hl:g}x"
            )
        return f"does not pay: the same {pooled.nodes} nodes meet the SLOs without a pool"


def stalled(shares: list[float], steps: int = 2, gain: float = 0.01) -> bool:
    """More nodes stopped helping: the last ``steps`` growth steps each raised the best share
    by less than ``gain`` (e.g. colocated TBT bound by prefill stalls)."""
    if len(shares) <= steps:
        return False
    tail = shares[-steps - 1 :]
    return all(b - a < gain for a, b in itertools.pairwise(tail))


def cheapest(points: Iterable[Point | None]) -> Point | None:
    ok = [p for p in points if p is not None]
    if not ok:
        return None
    return min(ok, key=lambda p: (p.nodes, BY_KEY[p.variant].pooled, -p.share, p.pool_tokens))
