"""results/REPORT.md: every experiment's table next to the paper's numbers, with the
differences explained."""

from __future__ import annotations

import time
from pathlib import Path

from kvcake.sim.experiments.common import ExpResult
from kvcake.sim.experiments.findings import finding

PAPER = {
    "cache-capacity": (
        "Fig. 9: a 3M-token local cache reaches under 50% of the theoretical maximum hit rate; "
        "~50M tokens reach nearly all of it.",
        "Compare the 3e+06 column with the `unbounded` column. Our tool&agent and synthetic "
        "curves come from core.synth traces shaped like the paper's (same request counts and "
        "averages, cache ratio ~61-62% instead of 59%/66%), not from the real traces.",
    ),
    "prefill-scheduling": (
        "Fig. 5 (16 nodes, conversation): average TTFT random 19.65 s, load-balancing 5.27 s, "
        "local-cache-aware 3.58 s, global-cache-aware 3.07 s.",
        "Same ordering, and the gains of the cache-aware policies over load balancing are "
        "close to the paper's (see Measured). Absolute TTFTs of the balanced policies are "
        "about half the paper's: the analytic LLaMA3-70B/8xA800 cost model (MFU 0.5, one node "
        "per prefill instance, no CPP group) prefills faster than the paper's testbed, so "
        "queues are shorter; random placement ignores queues and saturates single nodes in "
        "both, so its ratio to load balancing is larger here.",
    ),
    "global-vs-local": (
        "Fig. 10 (10 prefill nodes x 3M tokens): global cache raises the hit rate up to 2.36x "
        "and cuts prefill GPU time up to 48%.",
        "Against local caches with load-balanced placement (our reading of the paper's "
        "local-cache baseline) the global cache gives 1.8-3.4x the hit rate (paper: up to "
        "2.36x) and 27-39% less prefill time (paper: up to 48%). Against local-cache-aware "
        "placement (affinity routing, no fetches) the gain is small (1-17% hit rate): most of "
        "the benefit comes from steering requests to the holders; fetching helps when the "
        "holder is busy. Tool&agent and synthetic rows use core.synth stand-ins.",
    ),
    "capacity": (
        "Figs. 1/6/7: Mooncake's effective request capacity beats vLLM, vLLM+prefix caching "
        "and vLLM+chunked prefill by +59% to +498% on conversation.",
        "Baselines run on the same cost model and conductor (least-load / local-cache-aware "
        "routing). With 70B/8xA800 decode iterations of ~15-20 ms, Mooncake's TBT stays far "
        "below 100 ms, so its capacity is bounded by TTFT only; vLLM's TBT tail comes from "
        "prefill stalls (whole prompt) or slower mixed iterations (chunked).",
    ),
    "replicas": (
        "Fig. 11: hot blocks get replicated on many prefill nodes by global-cache-aware "
        "scheduling; replica counts follow demand over time.",
        "Replicas are created only by fetches (Algorithm 1) and lost to LRU eviction; a "
        "3M-token cache per node keeps the hottest prefixes on most nodes.",
    ),
    "bandwidth": (
        "Fig. 13 (synthetic workload): below ~100 Gbps per node TTFT degrades sharply.",
        "Reproduced qualitatively: TTFT is flat from 800 down to ~200 Gbps and rises steeply "
        "below 100 Gbps (see Measured). Here the cause is the layer-wise KV stream to the "
        "decode node (TTFT includes its exposed tail) and fetches sharing each node's NIC "
        "FIFO; Algorithm 1 itself backs off from fetching when the link is slow (the transfer "
        "is part of its TTFT estimate). No congestion control or RDMA effects are modelled. "
        "Workload: core.synth trace shaped like the paper's synthetic one, 1x.",
    ),
    "pd-ratio": (
        "Fig. 15: effective capacity peaks at a balanced P/D ratio; too few prefill nodes "
        "hurt TTFT, too few decode nodes hurt TBT.",
        "The TBT threshold is scaled to our decode-time model (see the note).",
    ),
    "overload": (
        "arXiv Table 3 (8P+8D, ~23k real requests at 2x): rejected 4183 (per-stage), 3771 "
        "(early, -9.8%), 3589 (prediction-based, -14.2%).",
        "At 15.5 ms (decode load ~1 at 2x) the paper's mechanism appears: the per-stage "
        "baseline wastes prefills that the decode re-check rejects, early rejection avoids "
        "that waste, and prediction-based rejection rejects least. Our reductions are larger "
        "than the paper's, and prediction-based admission (conductor: system-level average "
        "TBT over all decode instances) under-predicts the chosen instance's TBT, so many "
        "accepted requests then miss the TBT SLO (see the effective column) - fewer "
        "rejections is not the same as more good requests. At 18 ms decode is rarely "
        "overloaded, the baseline rejects little, and early rejection's stricter per-instance "
        "check (running + pending requests) rejects more than the baseline. We replay the "
        "12k-request conversation trace, not the paper's ~23k trace, so compare relative "
        "changes. The anti-phase oscillation is weak at 10-s sampling (correlation column).",
    ),
}


def write_report(results: list[ExpResult], out_dir: Path, command: str, wall_s: float) -> Path:
    lines = [
        "# kvcake simulator: reproduction of the Mooncake paper's scheduling results",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}` in "
        f"{wall_s:.0f} s wall (2-core VM shared with other work).",
        "",
        "Cluster: one node = one 8xA800 instance running LLaMA3-70B (core.costmodel preset "
        "`llama3-70b/8xA800`, analytic, MFU 0.5); 16 nodes = 8 prefill + 8 decode unless a "
        "section says otherwise; 3M-token DRAM cache per prefill node; 800 Gbps per node; "
        "512-token blocks (trace hash_ids used directly). Scheduling is done by "
        "`kvcake.conductor` (the same code as the live proxy). Grids: docs/experiments.md.",
        "",
    ]
    for r in results:
        paper, diff = PAPER.get(r.name, ("", ""))
        lines += [f"## {r.title} — `{r.name}`", ""]
        if paper:
            lines += [f"**Paper:** {paper}", ""]
        lines += ["| " + " | ".join(r.columns) + " |", "|" + "---|" * len(r.columns)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in r.rows]
        lines.append("")
        for n in r.notes:
            lines += [f"_{n}_", ""]
        found = finding(r)
        if found:
            lines += [f"**Measured:** {found}", ""]
        if diff:
            lines += [f"**Differences:** {diff}", ""]
        if r.png:
            lines += [f"![{r.name}]({r.png})", ""]
        lines += [f"(experiment wall time {r.wall_s:.0f} s)", ""]
    path = out_dir / "REPORT.md"
    path.write_text("\n".join(lines))
    return path
