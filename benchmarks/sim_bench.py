"""Simulator speed: the full conversation trace (12,031 requests) on 16 nodes (8P+8D Mooncake,
global-cache-aware conductor). Goal: <= 10 s wall on the 2-core VM. Reports wall time, events
and events/s (median of ``--repeats`` runs) and the simulated outcome, so a speed-up that
changes results is visible.

    python benchmarks/sim_bench.py [--trace PATH] [--repeats 3] [--system mooncake]
    kvcake bench sim -- --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

DEFAULT_TRACE = "/work/shared/traces/conversation_trace.jsonl"


def main(argv: Sequence[str] | None = None) -> int:
    from kvcake.core.trace import read_trace
    from kvcake.sim.config import SimConfig
    from kvcake.sim.runner import simulate

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trace", default=DEFAULT_TRACE)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--system", default="mooncake")
    ap.add_argument("--policy", default="global-cache-aware")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    recs = read_trace(args.trace)
    load_s = time.perf_counter() - t
    cfg = SimConfig(system=args.system, prefill_policy=args.policy)
    walls, cpus, res = [], [], None
    for _ in range(args.repeats):
        c = time.process_time()
        res = simulate(recs, cfg)
        cpus.append(time.process_time() - c)
        walls.append(res.wall_s)
    assert res is not None
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    s = res.summary()
    print(f"trace {args.trace}: {len(recs):,} requests (read in {load_s:.2f} s)")
    print(f"cluster: {cfg.system} {cfg.prefill_nodes}P+{cfg.decode_nodes}D, {cfg.prefill_policy}")
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
