"""Simulator speed: the full conversation trace (12,031 requests) on 16 nodes (8P+8D Mooncake,
global-cache-aware conductor). Goal: <= 10 s wall on the 2-core VM. Reports wall time, events
and events/s (median of ``--repeats`` runs) and the simulated outcome, so a speed-up that
changes results is visible.

With ``--dynamo PYTHON`` (default: $KVCAKE_DYNAMO_PYTHON) it also times NVIDIA Dynamo's Rust
mocker replay on the same trace with 8 workers in the same run, in that interpreter (a separate
venv with ``ai-dynamo``; kvcake never imports dynamo), interleaving our runs with Dynamo's, and
prints both wall times and their ratio.

    python benchmarks/sim_bench.py [--trace PATH] [--repeats 3] [--system mooncake]
    python benchmarks/sim_bench.py --dynamo /work/dynvenv/bin/python
    kvcake bench sim -- --repeats 3

``--replays N --jobs J`` measures what ``kvcake plan`` needs instead: N full-trace replays of
plan-like configurations (disaggregated with/without the pool, colocated; 8 to 24 nodes, several
P/D splits, live-path model) in J worker processes. Goal: >= 100 replays of the conversation
trace in <= 5 min on 2 cores. Prints wall time, the CPU time of the workers (user+sys of the
children, which a loaded machine does not inflate) and CPU/replay.

    python benchmarks/sim_bench.py --replays 100 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

DEFAULT_TRACE = "/work/shared/traces/conversation_trace.jsonl"

# Run inside the Dynamo interpreter: one offline replay through the public Python API
# (ai-dynamo 1.6 has no ``python -m dynamo.replay`` entry point; its CLI moved to AISimulate).
# Prints one JSON line: our wall around the call, Dynamo's own wall_time_ms and its summary.
DYNAMO_SCRIPT = r"""
import json, sys, time
from dynamo.replay import run_trace_replay
trace, workers, router, block = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
t = time.perf_counter()
rep = run_trace_replay([trace], num_workers=workers, router_mode=router,
                       trace_block_size=block, trace_format="mooncake")
wall = time.perf_counter() - t
s = rep.to_dict()["summary"]
keep = ("num_requests", "completed_requests", "wall_time_ms", "duration_ms", "mean_ttft_ms",
        "mean_tpot_ms", "prefix_cache_reused_ratio", "total_output_tokens")
print(json.dumps({"wall_s": wall, "summary": {k: s.get(k) for k in keep}}))
"""
PROBE = "import dynamo.replay, dynamo._core; print(getattr(dynamo.replay, '__file__', ''))"


def dynamo_problem(python: str | None) -> str | None:
    """Why the Dynamo comparison cannot run with this interpreter (None: it can)."""
    if not python:
        return "no --dynamo PYTHON and KVCAKE_DYNAMO_PYTHON is unset"
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        return f"{python} is not an executable file"
    try:
        p = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} failed to start: {exc}"
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"`{python} -c 'import dynamo.replay'` failed: {last}"
    return None


def run_dynamo(python: str, trace: str, workers: int, router: str, block: int) -> dict[str, Any]:
    """One Dynamo replay in a child process; ``outer_s`` includes interpreter start and import."""
    env = {**os.environ, "DYN_LOG": os.environ.get("DYN_LOG", "error")}
    t = time.perf_counter()
    p = subprocess.run([python, "-c", DYNAMO_SCRIPT, trace, str(workers), router, str(block)],
                       capture_output=True, text=True, env=env, timeout=1800)  # fmt: skip
    outer = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"dynamo replay failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1]
    out: dict[str, Any] = json.loads(line)
    out["outer_s"] = outer
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from kvcake.core.trace import read_trace
    from kvcake.sim.config import SimConfig
    from kvcake.sim.runner import simulate

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--trace", default=DEFAULT_TRACE, help="Mooncake trace JSONL (default: %(default)s)"
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="runs of each simulator (default: %(default)s)"
    )
    ap.add_argument("--system", default="mooncake", help="simulated system (default: %(default)s)")
    ap.add_argument(
        "--policy", default="global-cache-aware", help="prefill policy (default: %(default)s)"
    )
    ap.add_argument(
        "--dynamo",
        default=os.environ.get("KVCAKE_DYNAMO_PYTHON"),
        metavar="PYTHON",
        help="python of a venv with ai-dynamo: also time dynamo.replay on the same "
        "trace (default: $KVCAKE_DYNAMO_PYTHON; skipped when unset or unusable)",
    )
    ap.add_argument(
        "--dynamo-workers", type=int, default=8, help="Dynamo mocker workers (default: %(default)s)"
    )
    ap.add_argument(
        "--dynamo-router",
        default="kv_router",
        choices=["kv_router", "round_robin"],
        help="Dynamo router mode (default: %(default)s)",
    )
    ap.add_argument(
        "--block", type=int, default=512, help="trace block size in tokens (default: %(default)s)"
    )
    ap.add_argument("--replays", type=int, default=0,
                    help="throughput mode: this many plan-like full-trace replays")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=2, help="throughput mode: worker processes")
    args = ap.parse_args(argv)
    if args.replays:
        return throughput(args.trace, args.replays, args.jobs)
    dyn_skip = dynamo_problem(args.dynamo)
    t = time.perf_counter()
    recs = read_trace(args.trace)
    load_s = time.perf_counter() - t
    cfg = SimConfig(system=args.system).with_(prefill_policy=args.policy)
    walls, cpus, dyn, res = [], [], [], None
    for _ in range(args.repeats):
        c = time.process_time()
        res = simulate(recs, cfg)
        cpus.append(time.process_time() - c)
        walls.append(res.wall_s)
        if dyn_skip is None:  # interleaved, so both see the same machine load
            dyn.append(run_dynamo(args.dynamo, args.trace, args.dynamo_workers,
                                  args.dynamo_router, args.block))  # fmt: skip
    assert res is not None
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    s = res.summary()
    print(f"trace {args.trace}: {len(recs):,} requests (read in {load_s:.2f} s)")
    print(
        f"cluster: {cfg.system} {cfg.prefill_nodes}P+{cfg.decode_nodes}D, {cfg.conductor.prefill_policy}"
    )
    print("| metric | value |\n|---|---|")
    print(f"| wall s (median of {args.repeats}) | {wall:.2f} |")
    print(f"| CPU s (median) | {cpu:.2f} |")
    print(f"| all runs wall s | {', '.join(f'{w:.2f}' for w in walls)} |")
    print(f"| events | {res.events:,} |")
    print(f"| events/s | {res.events / wall:,.0f} |")
    print(f"| requests/s simulated | {len(recs) / wall:,.0f} |")
    print(f"| decode tokens simulated | {int(res.output_tokens.sum()):,} |")
    print(f"| avg TTFT s / avg TBT ms / hit rate | {s['avg_ttft_s']:.3f} / "
          f"{s['avg_tbt_s'] * 1000:.2f} / {s['hit_rate']:.1%} |")  # fmt: skip
    print(f"| goal <= 10 s wall | {'met' if wall <= 10 else 'MISSED'} |")
    if dyn_skip is not None:
        print(f"\nDynamo comparison skipped: {dyn_skip}")
        return 0
    dyn_walls = [d["wall_s"] for d in dyn]
    dw = statistics.median(dyn_walls)
    do = statistics.median(d["outer_s"] for d in dyn)
    ds = dyn[-1]["summary"]
    print(f"\nDynamo mocker ({args.dynamo}): {args.dynamo_workers} workers, "
          f"{args.dynamo_router}, trace block {args.block}, same trace, interleaved with ours")  # fmt: skip
    print("| metric | kvcake sim | dynamo.replay |\n|---|---|---|")
    print(f"| wall s (median of {args.repeats}) | {wall:.2f} | {dw:.2f} |")
    print(f"| all runs wall s | {', '.join(f'{w:.2f}' for w in walls)} | "
          f"{', '.join(f'{w:.2f}' for w in dyn_walls)} |")  # fmt: skip
    print(f"| dynamo incl. interpreter start + import | - | {do:.2f} |")
    print(f"| dynamo's own wall_time_ms (Rust core) | - | {ds.get('wall_time_ms') or 0:,.0f} |")
    print(
        f"| requests completed | {int(s['completed']):,} | {int(ds.get('completed_requests') or 0):,} |"
    )
    print(f"| avg TTFT s | {s['avg_ttft_s']:.3f} | {(ds.get('mean_ttft_ms') or 0) / 1000:.3f} |")
    print(
        f"| prefix reuse | {s['hit_rate']:.1%} | {ds.get('prefix_cache_reused_ratio') or 0:.1%} |"
    )
    print(f"| ratio dynamo / kvcake wall | {dw / wall:.2f}x "
          f"({'kvcake faster' if wall < dw else 'dynamo faster'}) | |")  # fmt: skip
    return 0


def plan_like_configs(n: int) -> list[tuple[str, Any]]:
    """``n`` distinct configurations of the kind ``kvcake plan`` sweeps."""
    from kvcake.sim.config import SimConfig
    from kvcake.sim.plan.search import VARIANTS, PlanConfig, sim_config

    pc = PlanConfig()
    base = SimConfig().with_(ttft_slo_s=20.0, tbt_slo_s=0.07)
    out: list[tuple[str, Any]] = []
    sizes = [8, 10, 12, 14, 16, 18, 20, 24]
    while len(out) < n:
        for size in sizes:
            for v in VARIANTS:
                splits = [0] if v.colocated else sorted({size // 4, size // 2, 3 * size // 4})
                for p in splits:
                    pp, dd = (size, 0) if v.colocated else (p, size - p)
                    traffic = 1.0 + 0.01 * (len(out) // 200)  # keeps configurations distinct
                    out.append((v.key, sim_config(base, pc, v.key, pp, dd, 3_000_000, 800.0,
                                                  traffic)))  # fmt: skip
                    if len(out) == n:
                        return out
    return out


def throughput(trace: str, n: int, jobs: int) -> int:
    from kvcake.core.trace import read_trace
    from kvcake.sim.plan.search import Evaluator

    recs = read_trace(trace)
    cfgs = plan_like_configs(n)
    t, c0 = time.perf_counter(), os.times()
    with Evaluator(recs, jobs) as ev:
        pts = ev.run(cfgs, 0.9)
    wall, c1 = time.perf_counter() - t, os.times()
    child = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    own = (c1.user - c0.user) + (c1.system - c0.system)
    cpu = child + own
    print(f"trace {trace}: {len(recs):,} requests; {len(pts)} full-trace replays, {jobs} jobs, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| metric | value |\n|---|---|")
    print(f"| wall s | {wall:.1f} |")
    print(f"| CPU s (workers + parent) | {cpu:.1f} |")
    print(f"| CPU s per replay | {cpu / len(pts):.2f} |")
    print(f"| wall s if the {jobs} cores were ours (CPU / jobs) | {cpu / jobs:.1f} |")
    print(f"| replays per 5 min at this wall rate | {len(pts) * 300 / wall:.0f} |")
    print(f"| configurations meeting SLOs | {sum(p.meets for p in pts)} |")
    print(
        f"| goal >= 100 replays in <= 300 s wall | {'met' if wall <= 300 and n >= 100 else 'MISSED'} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
