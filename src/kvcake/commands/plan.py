"""``kvcake plan TRACE``: does KV pooling pay off for my workload? Sweeps cluster size, P/D
split, pool size per node, colocated vs disaggregated, with and without the pool, on the
simulator, and writes OUT/PLAN.md (+ plan.json, plan.png) with the cheapest configuration that
meets the SLOs, its headroom, whether pooling pays off (from which hit rate and bandwidth on)
and what changes at 2x traffic. Walkthrough: docs/plan.md."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from kvcake.conductor.config import load_conductor_config
from kvcake.core.costmodel import PRESETS
from kvcake.core.errors import ConfigError
from kvcake.core.trace import read_trace, write_trace

HARDWARE = tuple(sorted(PRESETS))  # = sim.plan.search.HARDWARE


def _gbps(text: str) -> float:
    t = text.strip().lower().removesuffix("bps").removesuffix("/s")
    scale = 1.0
    if t.endswith("g"):
        t = t[:-1]
    elif t.endswith("m"):
        t, scale = t[:-1], 1e-3
    elif t.endswith("t"):
        t, scale = t[:-1], 1e3
    try:
        v = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a bandwidth: {text!r} (e.g. 100Gbps)") from None
    if v <= 0:
        raise argparse.ArgumentTypeError("bandwidth must be positive")
    return v


def register(sub: Any) -> None:
    p = sub.add_parser("plan", help="size a cluster for a trace; does KV pooling pay off?",
                       description=__doc__,
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument("trace", metavar="TRACE", help="Mooncake JSONL trace (timestamp, "
                   "input_length, output_length, hash_ids) or an OpenAI-style request log "
                   "(JSONL of timestamp + messages/prompt/prompt_token_ids + output length), "
                   "converted with --tokenizer")  # fmt: skip
    p.add_argument("--hardware", default="llama3-70b/8xA800", metavar="PRESET",
                   help=f"one node's model/hardware: a cost-model preset ({', '.join(HARDWARE)}) "
                   "or the path of a `kvcake calibrate` file (e.g. your CPU, measured)")  # fmt: skip
    p.add_argument("--network", type=_gbps, default=800.0, metavar="BW",
                   help="per-node network bandwidth, e.g. 100Gbps (Gbps when no unit)")  # fmt: skip
    p.add_argument("--ttft-slo", type=float, default=0.0, metavar="S",
                   help="TTFT SLO in s (0: 5x the uncontended prefill of the p90 prompt)")  # fmt: skip
    p.add_argument("--tbt-slo", type=float, default=0.0, metavar="S",
                   help="TBT SLO in s (0: 5x one uncontended decode step at the median context)")  # fmt: skip
    p.add_argument("--target", type=float, default=0.9, metavar="SHARE",
                   help="share of requests that must be within both SLOs")  # fmt: skip
    p.add_argument("--max-nodes", type=int, default=64, metavar="N", help="largest cluster tried")
    p.add_argument("--pool-tokens", type=int, default=0, metavar="TOKENS",
                   help="pool DRAM per node in tokens (0: the preset's, 3M for 70B)")  # fmt: skip
    p.add_argument("--traffic", default="1,2", metavar="LIST",
                   help="traffic multipliers to plan for; the first is the baseline")  # fmt: skip
    p.add_argument("--index-lag", type=float, default=0.0, metavar="S",
                   help="KV-index events reach the conductor this late (live-path realism)")  # fmt: skip
    p.add_argument("--predictor-noise", type=float, default=0.0, metavar="REL",
                   help="the conductor's predictors are fitted from timings with this relative "
                   "noise (0: exact)")  # fmt: skip
    p.add_argument("--config", metavar="TOML", default=None,
                   help="a cluster TOML whose [conductor] section (balancing threshold, seed, "
                   "expected output, admission) the simulations use; the prefill policy is "
                   "swept and the SLOs come from --ttft-slo/--tbt-slo or the rule")  # fmt: skip
    p.add_argument("--out", default="plan", metavar="DIR", help="output directory")
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help="worker processes (0: all cores)")  # fmt: skip
    p.add_argument("--tokenizer", default="smollm2", choices=("smollm2", "bytes"),
                   help="request logs only: tokenizer for text (bytes = one token per UTF-8 "
                   "byte, no model files needed)")  # fmt: skip
    p.add_argument("--time-unit", default="auto", choices=("auto", "s", "ms"),
                   help="request logs only: unit of numeric timestamps")  # fmt: skip
    p.add_argument("--save-trace", metavar="PATH", default=None,
                   help="also write the (converted) trace as Mooncake JSONL here")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_plan)


def load_any(path: str, tokenizer: str = "smollm2", time_unit: str = "auto") -> list[Any]:
    """Mooncake records from a trace or a request log (tokenized here, outside the sim)."""
    # lazy: CLI start-up
    from kvcake.core.requestlog import is_mooncake_trace, read_request_log, to_trace

    if is_mooncake_trace(path):
        return read_trace(path)
    reqs = read_request_log(path, time_unit)
    codec: Any
    if tokenizer == "bytes":
        # lazy: CLI start-up
        from kvcake.proxy.textcodec import ByteCodec

        codec = ByteCodec(512)
    else:
        # lazy: CLI start-up
        from kvcake.proxy.textcodec import ModelCodec

        codec = ModelCodec("smollm2")
    return to_trace(reqs, codec.encode_chat, codec.encode)


def _plan(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from kvcake.sim.plan import PlanConfig, Planner
    from kvcake.sim.plan.report import answers, write_plan

    try:
        traffic = tuple(float(x) for x in args.traffic.split(",") if x.strip())
    except ValueError:
        raise ConfigError(
            f"--traffic: not a comma-separated list of numbers: {args.traffic!r}"
        ) from None
    if not traffic:
        raise ConfigError("--traffic: give at least one multiplier")
    cfg = PlanConfig(hardware=args.hardware, network_gbps=args.network, ttft_slo_s=args.ttft_slo,
                     tbt_slo_s=args.tbt_slo, target=args.target, max_nodes=args.max_nodes,
                     pool_tokens_per_node=args.pool_tokens, traffic=traffic, jobs=args.jobs,
                     index_lag_s=args.index_lag, predictor_noise=args.predictor_noise,
                     conductor=load_conductor_config(args.config))  # fmt: skip
    records = load_any(args.trace, args.tokenizer, args.time_unit)
    if args.save_trace:
        write_trace(records, args.save_trace)
    name = Path(args.trace).stem.removesuffix("_trace")
    t = time.perf_counter()
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), disable=args.no_progress, transient=True) as bar:  # fmt: skip
        task = bar.add_task(f"plan {name}: simulations", total=None)

        def tick(done: int, submitted: int) -> None:
            bar.update(task, completed=done, total=submitted)

        planner = Planner(records, cfg, name, progress=tick)
        plan = planner.run()
    plan.wall_s = time.perf_counter() - t
    cmd = "kvcake plan " + " ".join(sys.argv[2:])
    path = write_plan(plan, Path(args.out), cmd.strip())
    for a in answers(plan):
        print("-", a.replace("**", ""))
    print(f"wrote {path} ({plan.runs} simulations, {plan.wall_s:.0f} s)")
    return 0
