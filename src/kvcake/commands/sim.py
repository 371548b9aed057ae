"""``kvcake sim``: replay traces on a simulated Mooncake / vLLM-like cluster and reproduce the
paper's experiments (results/*.png, *.json, REPORT.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvcake.conductor.config import ConductorConfig
from kvcake.core.config import add_config_flags, flag_overrides
from kvcake.core.errors import ConfigError
from kvcake.data import sample_trace_path
from kvcake.sim.config import SimConfig, load_sim_config

EXPERIMENT_NAMES = ("cache-capacity", "prefill-scheduling", "global-vs-local", "capacity",
                    "replicas", "bandwidth", "pd-ratio", "overload")  # fmt: skip
TRACE_HELP = ("trace JSONL (Mooncake format) or a synthetic preset: toolagent-synth, "
              "synthetic-synth")  # fmt: skip


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` unless the help text already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        h = action.help or ""
        return h if "(default:" in h else super()._get_help_string(action)


def register(sub: Any) -> None:
    fmt = _DefaultsFormatter
    p = sub.add_parser("sim", help="trace-driven cluster simulator and the paper's experiments",
                       description=__doc__)  # fmt: skip
    ssub = p.add_subparsers(dest="sim_cmd", metavar="ACTION", required=True)

    r = ssub.add_parser("run", help="replay one trace on one simulated cluster",
                        description="Replay one trace on one simulated cluster and print the "
                        "summary. Precedence: flags > KVCAKE_SIM_<FIELD> variables > --config > "
                        "defaults.", formatter_class=fmt)  # fmt: skip
    r.add_argument("--trace", metavar="PATH",
                   help=f"{TRACE_HELP} (default: the bundled sample trace)")  # fmt: skip
    r.add_argument(
        "--config", metavar="TOML",
        help="TOML file with [sim] and [conductor] sections (default: none)",
    )  # fmt: skip
    r.add_argument("--json", metavar="PATH", help="also write the summary as JSON here "
                   "(default: not written)")  # fmt: skip
    # the [sim] fields, then the [conductor] ones under their own names (colocated follows
    # --system)
    add_config_flags(r, SimConfig)
    add_config_flags(r, ConductorConfig, skip=("colocated",))
    r.set_defaults(func=_run)

    e = ssub.add_parser("experiment", help="run one experiment (table, PNG and JSON)",
                        description="Run one of the paper's experiments; grids: "
                        "docs/experiments.md.", formatter_class=fmt)  # fmt: skip
    e.add_argument("name", metavar="NAME", help=f"experiment: {', '.join(EXPERIMENT_NAMES)}")
    _common_flags(e)
    e.set_defaults(func=_experiment)

    a = ssub.add_parser("reproduce", help="run every experiment and write results/REPORT.md",
                        description="Run the experiments (two at a time with --jobs 2) and "
                        "write OUT/REPORT.md comparing each with the paper.",
                        formatter_class=fmt)  # fmt: skip
    _common_flags(a)
    a.add_argument("--only", metavar="NAMES", default="all",
                   help="comma-separated subset of experiments; the report also includes "
                   "earlier results found in --out")  # fmt: skip
    a.set_defaults(func=_reproduce)


def _common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", action="append", metavar="PATH", default=None,
                   help=f"{TRACE_HELP}; repeatable, the first is the main trace "
                   "(default: the bundled sample trace)")  # fmt: skip
    p.add_argument("--out", default="results", metavar="DIR",
                   help="output directory for NAME.png, NAME.json (and REPORT.md)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=2, metavar="N",
                   help="worker processes for independent simulations")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="smaller grids (every other grid point; smoke runs and tests)")  # fmt: skip
    p.add_argument("--cache-model", default="paper", choices=("paper", "block-lru"),
                   help="cache-capacity: paper = token-weighted hits, the deepest block of a "
                   "request evicted first; block-lru = block-weighted hits, in-order LRU "
                   "(as other cache simulators)")  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.sim.runner import simulate
    from kvcake.sim.traces import load_workload

    names = [f.name for c in (SimConfig, ConductorConfig) for f in dataclasses.fields(c)]
    over = flag_overrides(args, (n for n in names if n not in ("conductor", "colocated")))
    cfg = load_sim_config(args.config, over)
    spec = args.trace or str(sample_trace_path())
    _check_traces([spec])
    name, recs = load_workload(spec)
    res = simulate(recs, cfg)
    summ = res.summary(cfg.conductor.tbt_slo_s)
    t = Table(title=f"{cfg.system} {cfg.prefill_nodes}P+{cfg.decode_nodes}D on {name}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in summ.items():
        t.add_row(k, f"{v:,.4g}")
    Console().print(t)
    if args.json:
        Path(args.json).write_text(json.dumps(summ, indent=1) + "\n")
    return 0


def _check_traces(specs: list[str]) -> None:
    """Fail before any work (and outside worker processes) when a trace is missing."""
    # lazy: CLI start-up
    from kvcake.sim.traces import SYNTH_PRESETS

    for spec in specs:
        if spec not in SYNTH_PRESETS and not Path(spec).is_file():
            what = "is a directory" if Path(spec).is_dir() else "not found"
            raise ConfigError(f"--trace {spec}: trace file {what} (give a Mooncake-format "
                              f"JSONL file or one of {', '.join(SYNTH_PRESETS)})")  # fmt: skip


def _ctx(args: argparse.Namespace) -> Any:
    # lazy: CLI start-up
    from kvcake.sim.experiments import Context
    from kvcake.sim.experiments.common import workload

    traces = args.trace or [str(sample_trace_path())]
    _check_traces(traces)
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    for spec in traces:  # load (and validate) here, before any worker process forks
        workload(spec)
    return Context(traces, Path(args.out), args.jobs, args.quick, args.cache_model)


def _print(res: Any) -> None:
    # lazy: CLI start-up
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
    # lazy: CLI start-up
    from kvcake.sim.experiments import EXPERIMENTS

    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; choose from {', '.join(EXPERIMENTS)}")
    t = time.perf_counter()
    res = EXPERIMENTS[name](ctx)
    res.wall_s = time.perf_counter() - t
    res.quick = ctx.quick
    res.trace = workload_name(ctx.main_trace)
    res.save(ctx.out_dir)
    return res


def workload_name(spec: str) -> str:
    # lazy: CLI start-up
    from kvcake.sim.experiments.common import workload

    return workload(spec)[0]


def _experiment(args: argparse.Namespace) -> int:
    _print(run_experiment(args.name, _ctx(args)))
    return 0


def _one(arg: tuple[str, Any]) -> Any:
    name, ctx = arg
    return run_experiment(name, ctx)


def _reproduce(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.sim.experiments import EXPERIMENTS
    from kvcake.sim.experiments.common import pmap
    from kvcake.sim.experiments.report import write_report

    t = time.perf_counter()
    names = list(EXPERIMENTS) if args.only in ("", "all") else args.only.split(",")
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise ConfigError(f"--only: unknown experiment(s) {', '.join(unknown)}; choose from "
                          f"{', '.join(EXPERIMENTS)}")  # fmt: skip
    ctx = _ctx(args)
    jobs, ctx.jobs = ctx.jobs, 1  # parallel across experiments, not inside them
    heavy_first = sorted(names, key=lambda n: n not in ("capacity", "overload", "global-vs-local"))
    done = {r.name: r for r in pmap(_one, [(n, ctx) for n in heavy_first], jobs)}
    for n in names:
        _print(done[n])
    # the report covers every experiment: earlier results in --out fill in those not rerun
    # lazy: CLI start-up
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
