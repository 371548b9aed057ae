"""Effective request capacity vs TBT threshold for Mooncake and three vLLM-like baselines on
16 nodes (Figs. 1, 6, 7).

Capacity search: each system replays the trace at every speed of ``SPEEDS``; at a TBT
threshold, a system's capacity is the largest speed at which >= 90% of requests are effective
(TTFT <= 30 s and TBT <= threshold), linearly interpolated between grid points, reported as
requests/s (speed x the trace's native rate). One simulation per (system, speed) serves every
threshold, since the threshold only changes the evaluation.
"""

from __future__ import annotations

from typing import Any

from kvcake.sim.config import SimConfig
from kvcake.sim.experiments.common import (
    Context,
    ExpResult,
    new_figure,
    pmap,
    run,
    span_s,
    workload,
)
from kvcake.sim.experiments.scheduling import best_split

SYSTEMS = [
    ("mooncake", "Mooncake (8P+8D, global-cache-aware)", "global-cache-aware"),
    (
        "mooncake-best",
        "Mooncake (best split of pd-ratio, searched on this trace)",
        "global-cache-aware",
    ),
    ("vllm", "vLLM (16 colocated, least-load)", "least-load"),
    ("vllm-prefix", "vLLM + prefix caching (local-cache-aware)", "local-cache-aware"),
    ("vllm-chunked", "vLLM + chunked prefill (least-load)", "least-load"),
]
SPEEDS = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0]
THRESHOLDS_MS = [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]
TARGET = 0.9


def _run(arg: tuple[str, str, str, float, tuple[int, int]]) -> dict[str, Any]:
    spec, system, policy, speed, split = arg
    cfg = SimConfig(speedup=speed).with_(prefill_policy=policy)
    if system == "mooncake-best":  # the best split of the pd-ratio rule on this trace
        cfg = cfg.with_(prefill_nodes=split[0], decode_nodes=split[1])
    else:
        cfg = cfg.with_(system=system)
    r = run(spec, cfg)
    return {
        "share": [r.effective_share(t / 1000) for t in THRESHOLDS_MS],
        "avg_ttft_s": r.mean("ttft"),
        "avg_tbt_s": r.mean("tbt"),
        "wall_s": r.wall_s,
    }


def capacity_at(speeds: list[float], shares: list[float], target: float = TARGET) -> float:
    """Largest speed with share >= target (interpolated to the next grid point); 0 if none;
    the top of the grid if even that speed is good (then a lower bound)."""
    best = 0.0
    for i, (s, v) in enumerate(zip(speeds, shares, strict=True)):
        if v >= target:
            best = s
            if i + 1 < len(speeds) and shares[i + 1] < target:
                s2, v2 = speeds[i + 1], shares[i + 1]
                best = s + (s2 - s) * (v - target) / (v - v2)
    return best


def capacity(ctx: Context) -> ExpResult:
    spec = ctx.main_trace
    name, recs = workload(spec)  # raises for an empty or zero-span trace
    rate = len(recs) / span_s(spec)
    speeds = SPEEDS[::2] if ctx.quick else SPEEDS
    split, split_share = best_split(ctx, spec)
    grid = [(spec, sysn, pol, sp, split) for sysn, _, pol in SYSTEMS for sp in speeds]
    out = pmap(_run, grid, ctx.jobs)
    data: dict[str, Any] = {
        "speeds": speeds,
        "thresholds_ms": THRESHOLDS_MS,
        "rate": rate,
        "best_split": list(split),
        "best_split_share": split_share,
    }
    rows = []
    fig, (ax,) = new_figure(width=8)
    for k, (sysn, lab, _) in enumerate(SYSTEMS):
        if sysn == "mooncake-best":
            lab = f"Mooncake ({split[0]}P+{split[1]}D, best split on this trace)"
        runs = out[k * len(speeds) : (k + 1) * len(speeds)]
        caps = [
            capacity_at(speeds, [r["share"][j] for r in runs]) * rate
            for j in range(len(THRESHOLDS_MS))
        ]
        data[sysn] = {"capacity_rps": caps, "runs": runs}
        rows.append([lab, *[f"{c:.2f}" for c in caps]])
        ax.plot(THRESHOLDS_MS, caps, marker="o", label=lab)
    ax.set_xlabel("TBT threshold (ms)")
    ax.set_ylabel("effective request capacity (requests/s at >= 90% effective)")
    ax.set_title(f"Capacity vs TBT threshold, 16 nodes, {name} trace")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    cols = ["system", *[f"{t} ms" for t in THRESHOLDS_MS]]
    res = ExpResult(
        "capacity", "Effective request capacity vs TBT threshold (Figs. 1/6/7)", cols, rows, data
    )
    res.notes.append(
        f"speeds {speeds} x native {rate:.2f} req/s; capacity = largest speed with "
        f">= {TARGET:.0%} effective (TTFT <= 30 s, TBT <= threshold), interpolated. "
        f"vLLM baselines: 16 colocated instances; Mooncake {split[0]}P+{split[1]}D is "
        "the best split of the pd-ratio grid under the pd-ratio rule, searched on "
        "this trace."
    )
    return res.with_figure(fig, ctx.out_dir)
