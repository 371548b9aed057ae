"""Key comparisons computed from each experiment's data, for REPORT.md (so the text always
matches the numbers of the run it describes)."""

from __future__ import annotations

from collections.abc import Callable

from kvcake.sim.experiments.common import ExpResult
from kvcake.sim.experiments.scheduling import PAPER_TTFT


def _sched(r: ExpResult) -> str:
    d = r.data
    paper = PAPER_TTFT
    parts = []
    for p in ("random", "local-cache-aware", "global-cache-aware"):
        ours = d[p]["avg_ttft_s"] / d["least-load"]["avg_ttft_s"]
        parts.append(f"{p} {ours:.2f}x (paper {paper[p] / paper['least-load']:.2f}x)")
    return "Average TTFT relative to load-balancing: " + ", ".join(parts) + "."


def _cap_cache(r: ExpResult) -> str:
    caps = r.data["capacities"]
    out = []
    for name, s in r.data["series"].items():
        mx = s["max"] or 1.0
        at3m = s["hit_rate"][caps.index(3_000_000)] / mx if 3_000_000 in caps else float("nan")
        near = next((c for c, y in zip(caps, s["hit_rate"], strict=True) if y >= 0.95 * mx), None)
        out.append(f"{name}: 3M tokens reach {at3m:.0%} of the maximum, 95% of it needs "
                   f"{near:.0e} tokens" if near else f"{name}: 3M tokens reach {at3m:.0%}")  # fmt: skip
    return "; ".join(out) + "."


def _gl(r: ExpResult) -> str:
    out = []
    for name, d in r.data.items():
        lb, ca, gl = d["least-load"], d["local-cache-aware"], d["global-cache-aware"]
        out.append(f"{name}: hit rate {gl['hit_rate'] / lb['hit_rate']:.2f}x vs local+LB and "
                   f"{gl['hit_rate'] / ca['hit_rate']:.2f}x vs local+cache-aware; prefill time "
                   f"-{1 - gl['prefill_s'] / lb['prefill_s']:.0%} / "
                   f"-{1 - gl['prefill_s'] / ca['prefill_s']:.0%}")  # fmt: skip
    return "; ".join(out) + "."


def _overload(r: ExpResult) -> str:
    out = []
    for row in r.rows:
        if row[1].startswith("baseline"):
            continue
        out.append(f"{row[1]} at {row[0]} ms: {row[4]} rejections vs baseline (paper "
                   f"{row[6]}), effective {row[7]}")  # fmt: skip
    return "; ".join(out) + "."


def _capacity(r: ExpResult) -> str:
    d, th = r.data, r.data["thresholds_ms"]
    out = []
    for j, t in enumerate(th[:3]):
        for moon in ("mooncake", "mooncake-10p6d"):
            if moon not in d:
                continue
            m = d[moon]["capacity_rps"][j]
            base = {k: d[k]["capacity_rps"][j] for k in ("vllm", "vllm-prefix", "vllm-chunked")}
            rel = ", ".join(f"{m / v - 1:+.0%} vs {k}" if v else f"{k} has 0 capacity"
                            for k, v in base.items())  # fmt: skip
            out.append(f"at {t} ms {moon} {m:.2f} req/s ({rel})")
    return "; ".join(out) + "."


def _bandwidth(r: ExpResult) -> str:
    d = r.data
    keys = list(d)
    lo, hi = d[keys[0]], d[keys[-1]]
    mid = d.get("100")
    s = (f"average TTFT {lo['avg_ttft_s']:.2f} s at {keys[0]} Gbps vs {hi['avg_ttft_s']:.2f} s "
         f"at {keys[-1]} Gbps")  # fmt: skip
    if mid:
        s += f" ({mid['avg_ttft_s']:.2f} s at 100 Gbps)"
    return s + "."


def _pd(r: ExpResult) -> str:
    d = r.data
    best = max(d, key=lambda k: d[k]["effective_share"])
    return (f"best split {best} ({d[best]['effective_share']:.1%} effective); "
            + ", ".join(f"{k}: TTFT {v['avg_ttft_s']:.2f} s, TBT {v['avg_tbt_s'] * 1000:.1f} ms"
                        for k, v in d.items()) + ".")  # fmt: skip


FINDINGS: dict[str, Callable[[ExpResult], str]] = {
    "prefill-scheduling": _sched,
    "cache-capacity": _cap_cache,
    "global-vs-local": _gl,
    "overload": _overload,
    "capacity": _capacity,
    "bandwidth": _bandwidth,
    "pd-ratio": _pd,
}


def finding(r: ExpResult) -> str:
    fn = FINDINGS.get(r.name)
    if fn is None:
        return ""
    try:
        return fn(r)
    except (KeyError, ValueError, ZeroDivisionError, TypeError, IndexError) as exc:
        return f"(could not summarise: {exc!r})"
