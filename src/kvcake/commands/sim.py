"""``kvcake sim``: replay traces on a simulated Mooncake / vLLM-like cluster and reproduce the
paper's experiments (results/*.png, *.json, REPORT.md)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from kvcake.data import sample_trace_path


def register(sub: Any) -> None:
    p = sub.add_parser("sim", help="trace-driven cluster simulator and the paper's experiments")
    ssub = p.add_subparsers(dest="sim_cmd", metavar="ACTION", required=True)

    r = ssub.add_parser("run", help="replay one trace on one simulated cluster")
    r.add_argument("--trace", help="trace JSONL or a synth preset (default: bundled sample)")
    r.add_argument("--config", help="TOML file with a [sim] section")
    r.add_argument("--json", help="write the summary as JSON here")
    from kvcake.sim.config import SimConfig

    for f in dataclasses.fields(SimConfig):
        r.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=None,
                       help=f"(default: {f.default})")  # fmt: skip
    r.set_defaults(func=_run)

    e = ssub.add_parser("experiment", help="run one experiment (table, PNG and JSON)")
    e.add_argument("name", help="cache-capacity, prefill-scheduling, global-vs-local, capacity, "
                   "replicas, bandwidth, pd-ratio, overload")  # fmt: skip
    e.add_argument("--trace", action="append", help="trace JSONL (repeatable)")
    e.add_argument("--out", default="results", help="output directory")
    e.add_argument("--jobs", type=int, default=2, help="processes for independent runs")
    e.add_argument("--quick", action="store_true", help="smaller grids")
    e.set_defaults(func=_experiment)

    a = ssub.add_parser("reproduce", help="run every experiment and write results/REPORT.md")
    a.add_argument("--trace", action="append", help="trace JSONL (repeatable)")
    a.add_argument("--out", default="results")
    a.add_argument("--jobs", type=int, default=2)
    a.add_argument("--quick", action="store_true")
    a.add_argument("--only", help="comma-separated subset of experiments")
    a.set_defaults(func=_reproduce)


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from kvcake.core.config import load_config
    from kvcake.sim.config import SimConfig
    from kvcake.sim.runner import simulate
    from kvcake.sim.traces import load_workload

    over = {f.name: getattr(args, f.name) for f in dataclasses.fields(SimConfig)}
    cfg = load_config(SimConfig, toml_path=args.config, section="sim" if args.config else None,
                      overrides=over)  # fmt: skip
    name, recs = load_workload(args.trace or str(sample_trace_path()))
    res = simulate(recs, cfg)
    summ = res.summary(cfg.tbt_slo_s)
    t = Table(title=f"{cfg.system} {cfg.prefill_nodes}P+{cfg.decode_nodes}D on {name}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in summ.items():
        t.add_row(k, f"{v:,.4g}")
    Console().print(t)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(summ, indent=1) + "\n")
    return 0


def _ctx(args: argparse.Namespace) -> Any:
    from kvcake.sim.experiments import Context

    return Context(args.trace or [str(sample_trace_path())], Path(args.out), args.jobs, args.quick)


def _print(res: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from kvcake.sim.experiments.common import fmt

    t = Table(title=res.title)
    for c in res.columns:
        t.add_column(c)
    for row in res.rows:
        t.add_row(*[fmt(v) for v in row])
    Console().print(t)
    for n in res.notes:
        print(n)
    print(f"wrote {res.png} and {res.name}.json ({res.wall_s:.0f} s)")


def run_experiment(name: str, ctx: Any) -> Any:
    from kvcake.core.errors import ConfigError
    from kvcake.sim.experiments import EXPERIMENTS

    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; choose from {', '.join(EXPERIMENTS)}")
    t = time.perf_counter()
    res = EXPERIMENTS[name](ctx)
    res.wall_s = time.perf_counter() - t
    res.save(ctx.out_dir)
    return res


def _experiment(args: argparse.Namespace) -> int:
    _print(run_experiment(args.name, _ctx(args)))
    return 0


def _one(arg: tuple[str, Any]) -> Any:
    name, ctx = arg
    return run_experiment(name, ctx)


def _reproduce(args: argparse.Namespace) -> int:
    from kvcake.sim.experiments import EXPERIMENTS
    from kvcake.sim.experiments.common import pmap
    from kvcake.sim.experiments.report import write_report

    t = time.perf_counter()
    names = args.only.split(",") if args.only else list(EXPERIMENTS)
    ctx = _ctx(args)
    jobs, ctx.jobs = ctx.jobs, 1  # parallel across experiments, not inside them
    heavy_first = sorted(names, key=lambda n: n not in ("capacity", "overload", "global-vs-local"))
    done = {r.name: r for r in pmap(_one, [(n, ctx) for n in heavy_first], jobs)}
    for n in names:
        _print(done[n])
    # the report covers every experiment: earlier results in --out fill in those not rerun
    from kvcake.sim.experiments.common import ExpResult

    results = []
    for n in EXPERIMENTS:
        prev = ctx.out_dir / f"{n}.json"
        if n in done:
            results.append(done[n])
        elif prev.is_file():
            results.append(ExpResult.load(prev))
    cmd = "kvcake sim reproduce " + " ".join(sys.argv[3:])
    path = write_report(results, ctx.out_dir, cmd.strip(), time.perf_counter() - t)
    print(f"wrote {path}")
    return 0
