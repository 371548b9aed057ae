"""Overload-oriented scheduling (arXiv report §7, Table 3): rejections under per-stage, early
and prediction-based early rejection, with prefill/decode load over time."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvcake.sim.config import SimConfig
from kvcake.sim.experiments.common import (
    Context,
    ExpResult,
    decode_step_s,
    new_figure,
    pmap,
    run,
    workload,
)

POLICIES = [
    ("per-stage", "baseline (per-stage)"),
    ("early-rejection", "early rejection"),
    ("prediction", "prediction-based"),
]
PAPER = {"per-stage": 4183, "early-rejection": 3771, "prediction": 3589}
SPEEDUP = 2.0  # the paper's replay speed
# Rule (not a constant tuned to one trace): the decode SLO must bind for overload to exist, so
# the TBT SLOs are multiples of the trace's uncontended decode step (one sequence at its median
# context on the cost model): 1.1x binds hard, 1.3x is milder and shows how sensitive the
# counts are. (On the conversation trace: ~15.4 and ~18.2 ms.)
TBT_STEP_MULTIPLES = [1.1, 1.3]
TTFT_SLO_S = 30.0


def tbt_slos(spec: str) -> list[float]:
    step = decode_step_s(spec)
    return [round(m * step, 5) for m in TBT_STEP_MULTIPLES]


def _run(arg: tuple[str, str, float]) -> dict[str, Any]:
    spec, policy, slo = arg
    cfg = SimConfig(speedup=SPEEDUP).with_(
        admission_policy=policy, tbt_slo_s=slo, ttft_slo_s=TTFT_SLO_S
    )
    r = run(spec, cfg)
    s: dict[str, Any] = r.summary(slo)
    s["load_t"], s["load_prefill"], s["load_decode"] = r.load.t, r.load.prefill, r.load.decode
    pl, dl = np.array(r.load.prefill), np.array(r.load.decode)
    s["load_corr"] = (
        float(np.corrcoef(pl, dl)[0, 1]) if len(pl) > 2 and pl.std() and dl.std() else float("nan")
    )
    return s


def overload(ctx: Context) -> ExpResult:
    spec = ctx.main_trace
    slos = tbt_slos(spec)[:1] if ctx.quick else tbt_slos(spec)
    grid = [(spec, p, slo) for slo in slos for p, _ in POLICIES]
    out = pmap(_run, grid, ctx.jobs)
    rows, data = [], {}
    k = len(POLICIES)
    for i, slo in enumerate(slos):
        runs = out[k * i : k * (i + 1)]
        base = runs[0]["rejected"]
        for (p, lab), o in zip(POLICIES, runs, strict=True):
            rel = (o["rejected"] - base) / base if base else float("nan")
            prel = (PAPER[p] - PAPER["per-stage"]) / PAPER["per-stage"]
            rows.append(
                [
                    f"{slo * 1000:g}",
                    lab,
                    int(o["rejected"]),
                    int(o["rejected_after_prefill"]),
                    f"{rel:+.1%}",
                    PAPER[p],
                    f"{prel:+.1%}",
                    f"{o['effective_share']:.1%}",
                    f"{o['load_corr']:.2f}",
                ]
            )
            data[f"{p}@{slo * 1000:g}ms"] = o
    runs = out[:k]  # the plot: the first (binding) SLO
    fig, axes = new_figure(k, width=5.0)
    for ax, (_p, lab), o in zip(axes, POLICIES, runs, strict=True):
        t = np.array(o["load_t"]) / 60
        ax.plot(t, o["load_prefill"], lw=0.8, label="prefill load (queue / TTFT SLO)")
        ax.plot(t, o["load_decode"], lw=0.8, label="decode load (iteration / TBT SLO)")
        ax.axhline(1.0, color="grey", ls=":", lw=0.8)
        ax.set_title(f"{lab}: {int(o['rejected'])} rejected (TBT SLO {slos[0] * 1000:g} ms)")
        ax.set_xlabel("replay time (min, trace at 2x)")
        ax.set_ylabel("mean load relative to SLO")
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    cols = [
        "TBT SLO ms",
        "policy",
        "rejected",
        "after prefill",
        "vs baseline",
        "paper",
        "paper vs baseline",
        "effective",
        "corr(prefill, decode load)",
    ]
    res = ExpResult("overload", "Overload scheduling (arXiv Table 3)", cols, rows, data)
    res.notes.append(
        f"8P+8D, {workload(spec)[0]} trace at {SPEEDUP}x, TTFT SLO {TTFT_SLO_S} s; "
        f"TBT SLOs {', '.join(f'{m:g}' for m in TBT_STEP_MULTIPLES)} x the "
        f"uncontended decode step ({decode_step_s(spec) * 1000:.2f} ms); "
        "effective = completed within both SLOs; load sampled every 10 s."
    )
    return res.with_figure(fig, ctx.out_dir)
