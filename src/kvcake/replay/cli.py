"""``kvcake replay TRACE --url URL``: replay a Mooncake trace with live progress."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvcake.conductor.config import ConductorConfig, load_conductor_config
from kvcake.core.errors import ConfigError
from kvcake.core.trace import read_trace, scale_time, time_window
from kvcake.data import sample_trace_path


def register(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a Mooncake trace against an OpenAI endpoint",
        description="Send the trace's requests at their (scaled) arrival times as token-id "
        "prompts synthesised from hash_ids; print TTFT/TBT percentiles and effective capacity.",
    )
    p.add_argument("trace", nargs="?", help="trace JSONL (default: the bundled sample)")
    p.add_argument("--url", required=True, help="endpoint base, e.g. http://127.0.0.1:8000")
    p.add_argument("--limit", type=int, help="only the first N requests")
    p.add_argument("--start-s", type=float, default=0.0, help="trace window start (s)")
    p.add_argument("--end-s", type=float, default=float("inf"), help="trace window end (s)")
    p.add_argument("--speedup", type=float, default=1.0, help="divide arrival times by this")
    p.add_argument("--tokens-per-block", type=int, default=512,
                   help="tokens per 512-token trace block (e.g. 32 for a small model)")  # fmt: skip
    p.add_argument("--max-context", type=int, default=8192, help="drop longer requests")
    p.add_argument("--max-output", type=int, default=0, help="cap output lengths (0 = trace)")
    p.add_argument("--vocab-size", type=int, default=32000, help="token ids are < this")
    p.add_argument("--ttft-slo-s", type=float, default=None,
                   help="TTFT SLO of the effective-capacity metric (default: conductor.ttft_slo_s "
                   "of --cluster-config, else 30)")  # fmt: skip
    p.add_argument("--tbt-slo-s", type=float, default=None,
                   help="TBT SLO (default: conductor.tbt_slo_s of --cluster-config, "
                   "else 0.3)")  # fmt: skip
    p.add_argument("--model", default="")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write per-request JSON lines here (+ .summary.json)")
    p.add_argument(
        "--compare-sim",
        action="store_true",
        help="also simulate the cluster of --cluster-config; print side by side",
    )
    p.add_argument("--cluster-config", help="the cluster TOML the endpoint was started from")  # fmt: skip
    p.add_argument("--no-probe", action="store_true",
                   help="--compare-sim: skip the overhead probe before the replay (the "
                   "simulator then models neither the proxy's gate nor the serving path)")  # fmt: skip
    p.add_argument(
        "--orders",
        type=int,
        default=8,
        help="--compare-sim: burst orders simulated and pooled (default: %(default)s)",
    )
    p.add_argument("--json", help="--compare-sim: write measured, simulated, overheads here")
    p.set_defaults(func=_replay)


def _replay(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kvcake.replay.runner import ReplayOptions, RequestRecord, run_replay

    if args.compare_sim and not args.cluster_config:
        raise ConfigError("--compare-sim needs --cluster-config (the file given to `kvcake up`)")
    if args.compare_sim:
        _check_modelled(args.cluster_config)
    recs = time_window(read_trace(args.trace or sample_trace_path()), args.start_s * 1000,
                       args.end_s * 1000)  # fmt: skip
    if args.limit:
        recs = recs[: args.limit]
    recs = scale_time(recs, args.speedup)
    slo = _conductor(args.cluster_config)
    opts = ReplayOptions(
        url=args.url.rstrip("/").removesuffix("/v1"), tokens_per_block=args.tokens_per_block,
        max_context=args.max_context, vocab_size=args.vocab_size, max_output=args.max_output,
        model=args.model, seed=args.seed,
        ttft_slo_s=slo.ttft_slo_s if args.ttft_slo_s is None else args.ttft_slo_s,
        tbt_slo_s=slo.tbt_slo_s if args.tbt_slo_s is None else args.tbt_slo_s,
    )  # fmt: skip
    console = Console()
    over, load0 = None, os.getloadavg()
    if args.compare_sim and not args.no_probe:
        over = _probe(console, opts, args.cluster_config)
    counts = {"ok": 0, "rejected": 0, "error": 0, "dropped": 0}
    with Progress(TextColumn("replay"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                  console=console) as bar:  # fmt: skip
        task = bar.add_task("replay", total=len(recs), info="")

        def done(r: RequestRecord) -> None:
            counts[r.status] = counts.get(r.status, 0) + 1
            info = " ".join(f"{k} {v}" for k, v in counts.items() if v)
            bar.update(task, advance=1, info=info)

        summary = asyncio.run(run_replay(recs, opts, done))
    print_summary(console, summary.as_dict(), f"replay of {len(recs)} requests")
    if args.compare_sim:
        _compare(console, recs, summary, opts, args, over, (load0, os.getloadavg()))
    if args.out:
        with Path(args.out).open("w") as fh:
            for r in summary.per_request:
                fh.write(json.dumps(asdict(r)) + "\n")
        Path(args.out + ".summary.json").write_text(json.dumps(summary.as_dict(), indent=2))
    return 0


def _check_modelled(path: str) -> None:
    """compare-sim models kvcake's own instances; a vLLM-backed cluster file would silently be
    read as a default kvcake cluster. The file is loaded now (every section validated), so a
    mistake in it fails before the replay runs."""
    # lazy: CLI start-up
    from kvcake.fleet.cluster import is_vllm_config
    from kvcake.launch.clusterfile import load_serve_file

    if is_vllm_config(path):
        raise ConfigError(f"--cluster-config {path}: a vLLM-backed cluster ([vllm] section); "
                          "--compare-sim models kvcake's own instances only")  # fmt: skip
    load_serve_file(path)


def _conductor(cluster_config: str | None) -> Any:
    """The [conductor] settings the endpoint runs with (defaults without a cluster file)."""

    return load_conductor_config(cluster_config) if cluster_config else ConductorConfig()


# The unit of each summary figure (ReplaySummary): shown in its own column.
_UNITS = {"requests": "requests", "completed": "requests", "rejected": "requests (429)",
          "errors": "requests", "dropped": "requests (never sent)", "duration_s": "s",
          "ttft_p50": "s", "ttft_p90": "s", "ttft_p99": "s", "tbt_p50": "s", "tbt_p99": "s",
          "output_tokens_per_s": "tokens/s", "requests_per_s": "requests/s",
          "prefix_hit_rate": "% of prompt tokens from KV cache",
          "effective_capacity": "% of sent requests meeting both SLOs"}  # fmt: skip
_PERCENT = {"prefix_hit_rate", "effective_capacity"}


def print_summary(console: Any, d: dict[str, Any], title: str) -> None:
    t = Table(title=title)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("unit")
    for k, v in d.items():
        if k in _PERCENT and isinstance(v, float):
            shown = f"{100 * v:.1f}"
        else:
            shown = f"{v:.3f}" if isinstance(v, float) else str(v)
        t.add_row(k, shown, _UNITS.get(k, ""))
    console.print(t)


def _probe(console: Any, opts: Any, path: str) -> Any:
    # lazy: CLI start-up
    from kvcake.launch.launcher import load_serve_file
    from kvcake.replay.compare_sim import probe_sim
    from kvcake.replay.live_probe import run_probe

    console.print("probing the serving path's overheads (warm-up + a burst of 4)...")
    over = run_probe(opts, probe_sim(load_serve_file(path)))
    console.print(f"overheads: gate held {over.dispatch_s * 1000:.1f} ms past the KV, first "
                  f"token +{over.first_token_s * 1000:.1f} ms, TBT +{over.tbt_extra_s * 1000:.1f}"
                  f" ms ({over.burst} x {over.prompt_tokens}-token probes)")  # fmt: skip
    return over


def _compare(
    console: Any, recs: Any, summary: Any, opts: Any, args: Any, over: Any,
    loads: tuple[tuple[float, ...], tuple[float, ...]],
) -> None:  # fmt: skip

    # lazy: CLI start-up
    from kvcake.launch.launcher import load_serve_file
    from kvcake.replay.compare_sim import side_by_side, simulate_like

    cores = os.cpu_count() or 1
    predicted = simulate_like(recs, summary, load_serve_file(args.cluster_config), opts, over,
                              cores, args.orders)  # fmt: skip
    t = Table(title="measured vs simulated (same cluster config and cost model)")
    for col in ("metric", "measured", "simulated", "error"):
        t.add_column(col, justify="right")
    for row in side_by_side(summary.as_dict(), predicted):
        t.add_row(*row)
    console.print(t)
    console.print(f"{cores} cores; load average {loads[0][0]:.2f} before, {loads[1][0]:.2f} after"
                  f"; {args.orders if over else 1} burst orders simulated")  # fmt: skip
    if args.json:
        doc = {"measured": summary.as_dict(), "simulated": predicted, "cores": cores,
               "load_before": loads[0], "load_after": loads[1],
               "overheads": over.as_dict() if over else None}  # fmt: skip
        Path(args.json).write_text(json.dumps(doc, indent=2))
