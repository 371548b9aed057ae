"""Cache experiments: hit rate vs capacity (Fig. 9), global vs local cache (Fig. 10) and
replica counts of the hottest blocks (Fig. 11)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from kvcake.core.ids import InstanceId
from kvcake.core.trace import TraceRecord
from kvcake.sim.cache import LRUBlockCache
from kvcake.sim.config import SimConfig
from kvcake.sim.experiments.common import Context, ExpResult, new_figure, pmap, run, workload
from kvcake.sim.mooncake import MooncakeCluster
from kvcake.sim.runner import Cluster
from kvcake.sim.traces import leading_run

CAPACITIES = [int(v) for v in (1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 1e8, 3e8, 1e9)]
SYNTH = ["toolagent-synth", "synthetic-synth"]


CACHE_MODELS = {
    "paper": "token-weighted hits; within a request the head block is the most recently used, "
    "so at equal recency the deepest block is evicted first (prefix-preserving, as vLLM's "
    "prefix cache)",
    "block-lru": "block-weighted hits (share of prompt blocks); blocks touched in prompt "
    "order, so the head is the least recent (plain in-order LRU, as simple cache simulators do)",
}


def lru_hit_rate(
    records: Sequence[TraceRecord], capacity_tokens: int, block: int = 512, model: str = "paper"
) -> float:
    """One global LRU over blocks; a request hits its longest cached prefix. ``model`` picks
    the weighting and eviction order (:data:`CACHE_MODELS`)."""
    if model == "paper":
        cache = LRUBlockCache(capacity_tokens // block, InstanceId("global"), None)
        hit = total = 0
        for r in records:
            n = cache.prefix_len(r.hash_ids)
            hit += min(n * block, r.input_length)
            total += r.input_length
            cache.insert(r.hash_ids)
        return hit / total if total else 0.0
    if model != "block-lru":
        raise ValueError(f"cache model must be one of {sorted(CACHE_MODELS)}, got {model!r}")
    cap = capacity_tokens // block
    lru: OrderedDict[int, None] = OrderedDict()
    hits = blocks = 0
    for r in records:
        n = leading_run(r.hash_ids, lru)
        hits += n
        blocks += len(r.hash_ids)
        for h in r.hash_ids:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > cap:
            lru.popitem(last=False)
    return hits / blocks if blocks else 0.0


def _cap_point(arg: tuple[str, int, str]) -> float:
    spec, cap, model = arg
    return lru_hit_rate(workload(spec)[1], cap, model=model)


def cache_capacity(ctx: Context) -> ExpResult:
    specs = [*ctx.traces, *SYNTH]
    caps = CAPACITIES[1::2] if ctx.quick else CAPACITIES  # quick keeps 3e6 and 3e7
    grid = [(s, c, ctx.cache_model) for s in specs for c in [*caps, 10**13]]
    rates = pmap(_cap_point, grid, ctx.jobs)
    data: dict[str, Any] = {"capacities": caps, "series": {}, "cache_model": ctx.cache_model}
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
    unit = "tokens" if ctx.cache_model == "paper" else "blocks"
    ax.set_ylabel(f"prefix hit rate (share of prompt {unit})")
    ax.set_title("Cache hit rate vs capacity (dotted: unbounded cache)")
    ax.axvline(3e6, color="grey", lw=0.8, ls="--")
    ax.text(3e6, 0.02, " 3M tokens", color="grey")
    ax.legend()
    ax.grid(alpha=0.3)
    cols = ["workload", *[f"{c:.0e}" for c in caps], "unbounded"]
    res = ExpResult("cache-capacity", "Hit rate vs cache capacity (Fig. 9)", cols, rows, data)
    res.notes.append(
        f"Cache model `{ctx.cache_model}` (--cache-model): "
        f"{CACHE_MODELS[ctx.cache_model]}. The other choice: "
        + "; ".join(f"`{k}`: {v}" for k, v in CACHE_MODELS.items() if k != ctx.cache_model)
        + "."
    )
    return res.with_figure(fig, ctx.out_dir)


def _gl_point(arg: tuple[str, str]) -> dict[str, float]:
    spec, policy = arg
    cfg = SimConfig(prefill_nodes=10, decode_nodes=6, cache_tokens=3_000_000).with_(
        prefill_policy=policy
    )
    r = run(spec, cfg)
    return {
        "hit_rate": r.hit_rate(),
        "prefill_s": r.summary()["total_prefill_compute_s"],
        "avg_ttft_s": r.mean("ttft"),
    }


GL_VARIANTS = [
    ("least-load", "local cache, load-balancing"),
    ("local-cache-aware", "local cache, cache-aware"),
    ("global-cache-aware", "global cache (Algorithm 1)"),
]


def global_vs_local(ctx: Context) -> ExpResult:
    specs = [*ctx.traces, *SYNTH]
    k = len(GL_VARIANTS)
    out = pmap(_gl_point, [(s, p) for s in specs for p, _ in GL_VARIANTS], ctx.jobs)
    rows, data = [], {}
    for i, spec in enumerate(specs):
        runs = out[k * i : k * (i + 1)]
        name = workload(spec)[0]
        glo = runs[-1]
        row: list[Any] = [name]
        for r in runs:
            row.append(f"{r['hit_rate']:.1%}")
        for r in runs[:-1]:
            row.append(f"{glo['hit_rate'] / r['hit_rate']:.2f}x" if r["hit_rate"] else "-")
        for r in runs[:-1]:
            row.append(f"{1 - glo['prefill_s'] / r['prefill_s']:.1%}")
        rows.append(row)
        data[name] = {p: r for (p, _), r in zip(GL_VARIANTS, runs, strict=True)}
    fig, (a1, a2) = new_figure(2, width=5.5)
    names = list(data)
    x = np.arange(len(names))
    w = 0.8 / k
    for j, (p, lab) in enumerate(GL_VARIANTS):
        off = (j - (k - 1) / 2) * w
        a1.bar(x + off, [data[n][p]["hit_rate"] for n in names], w, label=lab)
        a2.bar(x + off, [data[n][p]["prefill_s"] / 3600 for n in names], w, label=lab)
    for ax, yl, t in (
        (a1, "hit rate (share of prompt tokens)", "Cache hit rate"),
        (a2, "prefill GPU time (instance-hours)", "Prefill computation time"),
    ):
        ax.set_xticks(x, names)
        ax.set_ylabel(yl)
        ax.set_title(f"{t}: 10 prefill nodes x 3M tokens")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    cols = [
        "workload",
        "hit: local LB",
        "hit: local CA",
        "hit: global",
        "global/local LB",
        "global/local CA",
        "prefill saved vs LB",
        "prefill saved vs CA",
    ]
    res = ExpResult("global-vs-local", "Global vs local KV cache (Fig. 10)", cols, rows, data)
    res.notes.append(
        "10 prefill + 6 decode nodes, 3M-token DRAM cache per prefill node, 1x. "
        "local LB = each node uses only its own cache, requests placed by load "
        "(least-load); local CA = local-cache-aware placement, no fetches; global = "
        "global-cache-aware (fetches from other nodes)."
    )
    return res.with_figure(fig, ctx.out_dir)


def hottest_prefixes(recs: Sequence[TraceRecord], counts: Counter[int], k: int) -> list[int]:
    """The ``k`` most used blocks, one per distinct prefix: blocks used by exactly the same
    requests (consecutive blocks of one shared document) count once — the deepest is kept."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, r in enumerate(recs):
        for h in r.hash_ids:
            first.setdefault(h, i)
            last[h] = i
    seen: set[tuple[int, int, int]] = set()
    out: list[int] = []
    for h, c in sorted(counts.items(), key=lambda kv: (-kv[1], -kv[0])):
        sig = (c, first[h], last[h])
        if sig not in seen:
            seen.add(sig)
            out.append(h)
            if len(out) == k:
                break
    return out


def replicas(ctx: Context) -> ExpResult:
    name, recs = workload(ctx.main_trace)
    counts = Counter(h for r in recs for h in r.hash_ids)
    hot = hottest_prefixes(recs, counts, 10)
    t: list[float] = []
    series: list[list[int]] = []

    def observe(now: float, cluster: Cluster) -> None:
        t.append(now)
        # SimConfig() below is the default system, mooncake: a MooncakeCluster
        series.append(cast(MooncakeCluster, cluster).replica_counts(hot))

    cfg = SimConfig()
    run(ctx.main_trace, cfg, observers=[(30.0, observe)])
    arr = np.array(series) if series else np.zeros((0, len(hot)))
    fig, (ax,) = new_figure(width=8)
    for j, h in enumerate(hot):
        ax.step(
            np.array(t) / 60, arr[:, j], where="post", lw=1.2, label=f"block {h} ({counts[h]} uses)"
        )
    ax.set_xlabel("trace time (min)")
    ax.set_ylabel(f"replicas (of {cfg.prefill_nodes} prefill nodes)")
    ax.set_title(f"Replicas of the hottest blocks over time ({name}, global-cache-aware)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    rows = [
        [f"{h}", counts[h], f"{arr[:, j].mean():.2f}", int(arr[:, j].max())]
        for j, h in enumerate(hot)
    ]
    res = ExpResult(
        "replicas",
        "Replica counts of the hottest blocks (Fig. 11)",
        ["block", "uses", "mean replicas", "max replicas"],
        rows,
        {"t": t, "blocks": hot, "replicas": arr.tolist()},
    )
    return res.with_figure(fig, ctx.out_dir)
