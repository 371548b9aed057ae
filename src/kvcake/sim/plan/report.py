"""``kvcake plan``'s output: ``PLAN.md`` (the answers, then every configuration simulated),
``plan.json`` and two PNG plots. Every number comes from the plan's simulations."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from kvcake.sim.experiments.common import new_figure, save_figure
from kvcake.sim.plan.planner import Plan
from kvcake.sim.plan.search import BY_KEY, VARIANTS, Point


def _s(x: float) -> str:
    return "-" if not math.isfinite(x) else (f"{x:.2f} s" if x >= 1 else f"{x * 1000:.0f} ms")


def _row(p: Point) -> list[str]:
    return [
        p.label,
        f"{p.traffic:g}x",
        f"{p.gbps:g}",
        f"{p.share:.1%}",
        "yes" if p.meets else "no",
        _s(p.ttft_p50),
        _s(p.ttft_p90),
        _s(p.tbt_p50),
        _s(p.tbt_p90),
        f"{p.hit_rate:.1%}",
    ]


COLS = [
    "configuration",
    "traffic",
    "Gbps",
    "within SLOs",
    "meets",
    "TTFT p50",
    "TTFT p90",
    "TBT p50",
    "TBT p90",
    "hit rate",
]


def _table(cols: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
        *["| " + " | ".join(r) + " |" for r in rows],
        "",
    ]


def answers(pl: Plan) -> list[str]:
    """The four questions, answered in sentences."""
    t0 = pl.cfg.traffic[0]
    rec = pl.recommended.get(t0)
    out = []
    if rec is None:
        out.append(
            f"**Cheapest configuration:** none of the architectures meets the SLOs with "
            f"up to {pl.cfg.max_nodes} nodes at the trace's rate; raise --max-nodes, "
            "relax the SLOs or pick faster hardware."
        )
    else:
        out.append(
            f"**Cheapest configuration meeting the SLOs:** `{rec.label}` "
            f"({rec.nodes} nodes): {rec.share:.1%} of requests within both SLOs, TTFT "
            f"p90 {_s(rec.ttft_p90)} (SLO {_s(pl.ttft_slo)}), TBT p90 {_s(rec.tbt_p90)} "
            f"(SLO {_s(pl.tbt_slo)})."
        )
        head, pts = pl.headroom.get("recommended", (1.0, []))
        nxt = next((p for p in pts if not p.meets), None)
        more = f"; at {nxt.traffic / t0:g}x only {nxt.share:.1%} are within the SLOs" if nxt else ""
        out.append(
            f"**Headroom:** it still meets the SLOs at {head:g}x the trace's traffic{more}."
            if head > 1
            else f"**Headroom:** under 10% - it meets the SLOs at 1x but not at 1.1x{more} "
            "(it is the smallest configuration that meets them)."
        )
    out.append(f"**Does pooling pay off?** {pl.verdict.get(t0, '-')}.")
    out += thresholds(pl)
    for t in pl.cfg.traffic[1:]:
        r2 = pl.recommended.get(t)
        what = (
            f"`{r2.label}` ({r2.nodes} nodes, {r2.nodes - rec.nodes:+d} vs 1x)"
            if r2 and rec
            else (f"`{r2.label}`" if r2 else f"nothing within {pl.cfg.max_nodes} nodes")
        )
        out.append(f"**At {t:g}x traffic:** cheapest is {what}; pooling: {pl.verdict.get(t)}.")
    return out


def thresholds(pl: Plan) -> list[str]:
    out = []
    caps = pl.capacity_sweep
    if caps:
        ok = [p for p in caps if p.meets]
        fail = [p for p in caps if not p.meets]
        ref = caps[0]
        if ref.meets:
            out.append(
                f"**From which hit rate on:** with {ref.prefill}P+{ref.decode}D the SLOs "
                f"are met even without a pool (hit rate {ref.hit_rate:.0%} from the "
                "local caches alone): at this size the pool is not needed."
            )
        elif ok:
            lo = min(ok, key=lambda p: p.hit_rate)
            out.append(
                f"**From which hit rate on:** with {ref.prefill}P+{ref.decode}D the pooled "
                f"cluster meets the SLOs from a {lo.hit_rate:.0%} prefix hit rate on "
                f"(pool {lo.pool_tokens / 1e6:g}M tokens/node)"
                + (
                    f"; at {max(fail, key=lambda p: p.hit_rate).hit_rate:.0%} "
                    "(smaller pool) it does not"
                    if fail
                    else ""
                )
                + "."
            )
        else:
            out.append(
                f"**From which hit rate on:** no pool size tried reaches the SLOs with "
                f"{ref.prefill}P+{ref.decode}D (best hit rate "
                f"{max(p.hit_rate for p in caps):.0%})."
            )
    bws = pl.bandwidth_sweep
    if bws:
        ok = [p for p in bws if p.meets]
        out.append(
            "**From which bandwidth on:** "
            + (
                f"the pooled configuration meets the SLOs from {min(p.gbps for p in ok):g} Gbps "
                "per node on"
                if ok
                else "no bandwidth tried meets the SLOs"
            )
            + f" (tried {', '.join(f'{p.gbps:g}' for p in bws)} Gbps). Paper §2.2's reuse "
            f"threshold for this trace's average cached prefix: loading beats recomputing above "
            f"{pl.reuse_gbps:.1f} Gbps."
        )
    return out


def _plot(pl: Plan, out: Path) -> list[str]:
    fig, (a1, a2) = new_figure(2, width=6.0)
    pts = [p for p in pl.points if p.gbps == pl.cfg.network_gbps]
    for v in VARIANTS:
        for t in pl.cfg.traffic:
            mine = sorted(
                (
                    p
                    for p in pts
                    if p.variant == v.key
                    and p.traffic == t
                    and (not v.pooled or p.pool_tokens == pl.cfg.memory[2])
                ),
                key=lambda p: p.nodes,
            )
            best: dict[int, float] = {}
            for p in mine:
                best[p.nodes] = max(best.get(p.nodes, 0.0), p.share)
            if best:
                a1.plot(
                    list(best),
                    list(best.values()),
                    marker="o",
                    ls="-" if t == pl.cfg.traffic[0] else "--",
                    label=f"{v.key} @ {t:g}x",
                )
    a1.axhline(pl.cfg.target, color="grey", ls=":", lw=0.8)
    a1.set_xlabel("nodes")
    a1.set_ylabel("share of requests within both SLOs (best split)")
    a1.set_title(f"{pl.name}: SLO attainment vs cluster size")
    a1.legend(fontsize=7)
    a1.grid(alpha=0.3)
    if pl.bandwidth_sweep:
        b = pl.bandwidth_sweep
        a2.plot([p.gbps for p in b], [p.share for p in b], marker="o", label="vs bandwidth")
        a2.set_xscale("log")
        a2.set_xlabel("per-node bandwidth (Gbps)")
        if pl.capacity_sweep:
            ax = a2.twiny()
            c = pl.capacity_sweep
            ax.plot(
                [p.hit_rate for p in c],
                [p.share for p in c],
                marker="s",
                color="C1",
                label="vs hit rate (pool size)",
            )
            ax.set_xlabel("prefix hit rate (from the pool-size sweep)", color="C1")
        a2.axhline(pl.cfg.target, color="grey", ls=":", lw=0.8)
        a2.set_ylabel("share within both SLOs")
        a2.set_title("pooled configuration: bandwidth and hit rate")
        a2.grid(alpha=0.3)
    return [save_figure(fig, out, "plan")]


def write_plan(pl: Plan, out: Path, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    pngs = _plot(pl, out)
    st = pl.stats
    lines = [
        f"# kvcake plan: {pl.name}",
        "",
        f"Generated by `{command}`: {pl.runs} simulations in {pl.wall_s:.0f} s.",
        "",
        "## Inputs",
        "",
        f"- Trace: {st.requests} requests over {st.duration_s:.0f} s ({pl.rate:.2f} req/s), "
        f"average input {st.avg_input:.0f} / output {st.avg_output:.0f} tokens, cache ratio "
        f"(unbounded) {st.cache_ratio:.0%}.",
        f"- Hardware: `{pl.cfg.hardware}` per node; network {pl.cfg.network_gbps:g} Gbps "
        f"per node; memory per node (tokens): decode KV {pl.cfg.memory[0]:,}, local prefix "
        f"cache {pl.cfg.memory[1]:,}, pool DRAM {pl.cfg.memory[2]:,}.",
        f"- SLOs: TTFT {_s(pl.ttft_slo)}, TBT {_s(pl.tbt_slo)} ({pl.slo_rule}); a "
        f"configuration meets them when >= {pl.cfg.target:.0%} of requests are within both "
        "and none is rejected.",
        "- Model: the live path (fetches from the store pool over both ends' NICs, puts of "
        "computed blocks; docs/sim.md). Cost = nodes; a pool-less configuration wins ties.",
        "",
        "## Answers",
        "",
    ]
    lines += [f"- {a}" for a in answers(pl)] + [""]
    lines += ["## Cheapest per architecture", ""]
    rows = []
    for t in pl.cfg.traffic:
        for v in VARIANTS:
            p = pl.best.get(t, {}).get(v.key)
            rows.append(
                [
                    f"{t:g}x",
                    v.label,
                    *(_row(p)[:1] + _row(p)[3:] if p else ["none within the search"] + ["-"] * 7),
                ]
            )
    lines += _table(["traffic", "architecture", *COLS[:1], *COLS[3:]], rows)
    lines += ["## Pool size and bandwidth sweeps (pooled configuration)", ""]
    lines += _table(COLS, [_row(p) for p in [*pl.capacity_sweep, *pl.bandwidth_sweep]])
    lines += ["## Headroom", ""]
    lines += _table(COLS, [_row(p) for _, pts in pl.headroom.values() for p in pts])
    lines += [f"![plan]({png})" for png in pngs] + [""]
    lines += ["## Every configuration simulated", ""]
    allp = sorted(
        pl.points, key=lambda p: (p.traffic, p.variant, p.nodes, p.prefill, p.pool_tokens, p.gbps)
    )
    lines += _table(COLS, [_row(p) for p in allp])
    path = out / "PLAN.md"
    path.write_text("\n".join(lines))
    (out / "plan.json").write_text(json.dumps(to_json(pl), indent=1) + "\n")
    return path


def to_json(pl: Plan) -> dict[str, object]:
    def pt(p: Point | None) -> dict[str, object] | None:
        return None if p is None else {**asdict(p), "nodes": p.nodes, "label": p.label}

    return {
        "name": pl.name,
        "config": asdict(pl.cfg),
        "rate": pl.rate,
        "ttft_slo_s": pl.ttft_slo,
        "tbt_slo_s": pl.tbt_slo,
        "slo_rule": pl.slo_rule,
        "recommended": {str(t): pt(p) for t, p in pl.recommended.items()},
        "best": {str(t): {k: pt(p) for k, p in b.items()} for t, b in pl.best.items()},
        "verdict": {str(t): v for t, v in pl.verdict.items()},
        "headroom": {k: h for k, (h, _) in pl.headroom.items()},
        "reuse_gbps": pl.reuse_gbps,
        "runs": pl.runs,
        "wall_s": pl.wall_s,
        "points": [pt(p) for p in pl.points],
        "variants": {k: v.label for k, v in BY_KEY.items()},
    }
