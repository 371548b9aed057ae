"""Cache experiments: hit rate vs capacity (Fig. 9), global vs local cache (Fig. 10) and
replica counts of the hottest blocks (Fig. 11)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvcake.core.ids import InstanceId
from kvcake.core.trace import TraceRecord
from kvcake.sim.cache import LRUBlockCache
from kvcake.sim.config import SimConfig
from kvcake.sim.experiments.common import (
    Context,
    ExpResult,
    new_figure,
    pmap,
    save_figure,
    workload,
)  # fmt: skip
from kvcake.sim.runner import simulate

CAPACITIES = [int(v) for v in (1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 1e8, 3e8, 1e9)]
SYNTH = ["toolagent-synth", "synthetic-synth"]


def lru_hit_rate(records: Sequence[TraceRecord], capacity_tokens: int, block: int = 512) -> float:
    """One global LRU over blocks; a request hits its longest cached prefix (tokens)."""
    cache = LRUBlockCache(capacity_tokens // block, InstanceId("global"), None)
    hit = total = 0
    for r in records:
        n = cache.prefix_len(r.hash_ids)
        hit += min(n * block, r.input_length)
        total += r.input_length
        cache.insert(r.hash_ids)
    return hit / total if total else 0.0


def _cap_point(arg: tuple[str, int]) -> float:
    spec, cap = arg
    return lru_hit_rate(workload(spec)[1], cap)


def cache_capacity(ctx: Context) -> ExpResult:
    specs = [*ctx.traces, *SYNTH]
    caps = CAPACITIES[::2] if ctx.quick else CAPACITIES
    grid = [(s, c) for s in specs for c in [*caps, 10**13]]
    rates = pmap(_cap_point, grid, ctx.jobs)
    data: dict[str, Any] = {"capacities": caps, "series": {}}
    rows = []
    fig, (ax,) = new_figure()
    for i, spec in enumerate(specs):
        name = workload(spec)[0]
        k = len(caps) + 1
        ys, best = rates[i * k : i * k + len(caps)], rates[i * k + len(caps)]
        data["series"][name] = {"hit_rate": ys, "max": best}
        rows.append([name, *[f"{y:.1%}" for y in ys], f"{best:.1%}"])
        line = ax.plot(caps, ys, marker="o", label=name)[0]
        ax.axhline(best, ls=":", color=line.get_color(), lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (tokens, one global LRU over 512-token blocks)")
    ax.set_ylabel("prefix hit rate (share of prompt tokens)")
    ax.set_title("Cache hit rate vs capacity (dotted: unbounded cache)")
    ax.axvline(3e6, color="grey", lw=0.8, ls="--")
    ax.text(3e6, 0.02, " 3M tokens", color="grey")
    ax.legend()
    ax.grid(alpha=0.3)
    cols = ["workload", *[f"{c:.0e}" for c in caps], "unbounded"]
    res = ExpResult("cache-capacity", "Hit rate vs cache capacity (Fig. 9)", cols, rows, data)
    res.png = save_figure(fig, ctx.out_dir, res.name)
    return res


def _gl_point(arg: tuple[str, str]) -> dict[str, float]:
    spec, policy = arg
    cfg = SimConfig(prefill_nodes=10, decode_nodes=6, cache_tokens=3_000_000,
                    prefill_policy=policy)  # fmt: skip
    r = simulate(workload(spec)[1], cfg)
    return {"hit_rate": r.hit_rate(), "prefill_s": r.summary()["total_prefill_compute_s"],
            "avg_ttft_s": r.mean("ttft")}  # fmt: skip


def global_vs_local(ctx: Context) -> ExpResult:
    specs = [*ctx.traces, *SYNTH]
    pols = ["local-cache-aware", "global-cache-aware"]
    out = pmap(_gl_point, [(s, p) for s in specs for p in pols], ctx.jobs)
    rows, data = [], {}
    for i, spec in enumerate(specs):
        loc, glo = out[2 * i], out[2 * i + 1]
        name = workload(spec)[0]
        ratio = glo["hit_rate"] / loc["hit_rate"] if loc["hit_rate"] else float("nan")
        saved = 1 - glo["prefill_s"] / loc["prefill_s"] if loc["prefill_s"] else float("nan")
        data[name] = {"local": loc, "global": glo, "hit_ratio": ratio, "prefill_saved": saved}
        rows.append([name, f"{loc['hit_rate']:.1%}", f"{glo['hit_rate']:.1%}", f"{ratio:.2f}x",
                     f"{loc['prefill_s']:,.0f}", f"{glo['prefill_s']:,.0f}", f"{saved:.1%}"])  # fmt: skip
    fig, (a1, a2) = new_figure(2, width=5.5)
    names = list(data)
    x = np.arange(len(names))
    for j, (key, lab) in enumerate([("local", "local cache"), ("global", "global cache")]):
        a1.bar(x + (j - 0.5) * 0.38, [data[n][key]["hit_rate"] for n in names], 0.38, label=lab)
        a2.bar(x + (j - 0.5) * 0.38, [data[n][key]["prefill_s"] / 3600 for n in names], 0.38,
               label=lab)  # fmt: skip
    for ax, yl, t in ((a1, "hit rate", "Cache hit rate"), (a2, "prefill GPU time (instance-hours)",
                                                           "Prefill computation time")):  # fmt: skip
        ax.set_xticks(x, names)
        ax.set_ylabel(yl)
        ax.set_title(f"{t}: 10 prefill nodes x 3M tokens")
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
    cols = ["workload", "hit local", "hit global", "ratio", "prefill s local",
            "prefill s global", "prefill saved"]  # fmt: skip
    res = ExpResult("global-vs-local", "Global vs local KV cache (Fig. 10)", cols, rows, data)
    res.notes.append("10 prefill + 6 decode nodes, 3M-token DRAM cache per prefill node; "
                     "local = local-cache-aware scheduling without fetches.")  # fmt: skip
    res.png = save_figure(fig, ctx.out_dir, res.name)
    return res


def replicas(ctx: Context) -> ExpResult:
    name, recs = workload(ctx.main_trace)
    counts = Counter(h for r in recs for h in r.hash_ids)
    hot = [h for h, _ in counts.most_common(10)]
    t: list[float] = []
    series: list[list[int]] = []

    def observe(now: float, cluster: Any) -> None:
        t.append(now)
        series.append(cluster.replica_counts(hot))

    cfg = SimConfig()
    simulate(recs, cfg, observers=[(30.0, observe)])
    arr = np.array(series) if series else np.zeros((0, len(hot)))
    fig, (ax,) = new_figure(width=8)
    for j, h in enumerate(hot):
        ax.plot(np.array(t) / 60, arr[:, j], label=f"block {h} ({counts[h]} uses)", lw=1.2)
    ax.set_xlabel("trace time (min)")
    ax.set_ylabel(f"replicas (of {cfg.prefill_nodes} prefill nodes)")
    ax.set_title(f"Replicas of the 10 hottest blocks over time ({name}, global-cache-aware)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    rows = [[f"{h}", counts[h], f"{arr[:, j].mean():.2f}", int(arr[:, j].max())]
            for j, h in enumerate(hot)]  # fmt: skip
    res = ExpResult("replicas", "Replica counts of the hottest blocks (Fig. 11)",
                    ["block", "uses", "mean replicas", "max replicas"], rows,
                    {"t": t, "blocks": hot, "replicas": arr.tolist()})  # fmt: skip
    res.png = save_figure(fig, ctx.out_dir, res.name)
    return res
