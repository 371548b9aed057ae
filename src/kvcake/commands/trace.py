"""``kvcake trace``: inspect, cut and synthesise Mooncake-format traces."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from kvcake.core import synth
from kvcake.core.trace import (
    read_trace,
    scale_time,
    subsample,
    time_window,
    trace_stats,
    write_trace,
)
from kvcake.data import sample_trace_path


def register(sub: Any) -> None:
    p = sub.add_parser("trace", help="inspect, cut and synthesise Mooncake traces")
    tsub = p.add_subparsers(dest="trace_cmd", metavar="ACTION", required=True)

    s = tsub.add_parser("stats", help="request count, lengths and cache ratio of a trace")
    s.add_argument("path", nargs="?", help="trace JSONL (default: the bundled sample)")
    s.set_defaults(func=_stats)

    c = tsub.add_parser("cut", help="write a scaled / sub-sampled / windowed copy of a trace")
    c.add_argument("path")
    c.add_argument("out")
    c.add_argument("--speedup", type=float, default=1.0, help="divide timestamps by this")
    c.add_argument("--fraction", type=float, help="keep this random share of requests")
    c.add_argument("--start-s", type=float, default=0.0, help="window start (seconds)")
    c.add_argument("--end-s", type=float, default=float("inf"), help="window end (seconds)")
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=_cut)

    g = tsub.add_parser("synth", help="generate a synthetic multi-turn trace")
    g.add_argument("out")
    for f in synth.SynthConfig.__dataclass_fields__.values():
        g.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=type(f.default),
            default=f.default,
            help=f"(default: {f.default})",
        )
    g.set_defaults(func=_synth)


def _stats(args: argparse.Namespace) -> int:
    path = args.path or sample_trace_path()
    st = trace_stats(read_trace(path))
    table = Table(title=f"trace {path}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("requests", f"{st.requests:,}")
    table.add_row("duration", f"{st.duration_s:,.0f} s")
    table.add_row("avg input tokens", f"{st.avg_input:,.0f}")
    table.add_row("avg output tokens", f"{st.avg_output:,.0f}")
    table.add_row("cache ratio (unbounded cache)", f"{st.cache_ratio:.1%}")
    table.add_row("unique blocks", f"{st.unique_blocks:,}")
    Console().print(table)
    return 0


def _cut(args: argparse.Namespace) -> int:
    recs = time_window(read_trace(args.path), args.start_s * 1000, args.end_s * 1000)
    if args.fraction is not None:
        recs = subsample(recs, fraction=args.fraction, seed=args.seed)
    n = write_trace(scale_time(recs, args.speedup), args.out)
    print(f"wrote {n} requests to {args.out}")
    return 0


def _synth(args: argparse.Namespace) -> int:
    names = synth.SynthConfig.__dataclass_fields__
    cfg = synth.SynthConfig(**{k: getattr(args, k) for k in names})
    n = write_trace(synth.generate(cfg), args.out)
    print(f"wrote {n} requests to {args.out}")
    return 0
