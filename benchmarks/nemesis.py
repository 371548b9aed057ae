"""The nemesis (issue 30 §3): Jepsen-style faults against an HA store, and a checker.

Each schedule starts its own pool: etcd, three HA masters, two storage nodes and several client
processes (``--workers``) running a seeded mix of checksummed puts, upserts, removes, gets and
batch gets over keys with one and with two replicas, every call recorded with its invoke and
completion time and its outcome. A seeded schedule injects faults for ``--duration`` seconds
(SIGSTOP/SIGCONT, SIGKILL + restart of leader, standby, storage node, client; etcd paused;
partitions between emulated hosts with per-pair nftables drop rules). Then every key is read
back and the checker reports (a) wrong reads (another key's bytes, torn bytes, a version that
was superseded before the read began, or never written), (b) acknowledged objects lost although
a node holding them stayed alive, (c) the outage after each fault. An eviction fails the run.

    python benchmarks/nemesis.py --seed 1 --duration 120 --schedules 3 --out results/nemesis/x

Network namespaces (root, ``ip``, ``nft``: ``apt-get install nftables``) carry the hosts; without
them everything runs on 127.0.0.1 and partitions are left out (the summary says why). Exit
status 1 when any schedule had a wrong read, a lost object or an eviction. docs/benchmarks.md,
"Nemesis".
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.nemesis.cluster import Settings
from benchmarks.nemesis.hosts import netns_unavailable
from benchmarks.nemesis.run import recheck, run_schedule

from kvcake.core.stats import percentile


def say(line: str) -> None:
    print(line, flush=True)


def summary(results: list[dict[str, Any]]) -> list[str]:
    """Totals, then per fault kind: the outage (longest time without any answer after the
    injection) p50/p95/max and the time to the first answer to a call sent after it."""
    gaps: dict[str, list[float]] = {}
    firsts: dict[str, list[float]] = {}
    for r in results:
        for f in r["faults"]:
            gaps.setdefault(f["kind"], []).append(f["outage_s"])
            first = f["first_answer_s"]
            firsts.setdefault(f["kind"], []).append(math.inf if first is None else first)
    lines = [f"schedules {len(results)}, {sum(r['seconds'] for r in results) / 60:.1f} min, "
             f"{sum(r['ops'] for r in results)} calls; wrong reads "
             f"{sum(r['wrong_reads'] for r in results)}, lost objects "
             f"{sum(r['lost_objects'] for r in results)} (excused by dead nodes "
             f"{sum(r['excused_losses'] for r in results)}), reads that found an acknowledged "
             f"object gone {sum(r.get('vanished_reads', 0) for r in results)}, evicted "
             f"{sum(r['evicted'] for r in results)}; storage nodes down at the end "
             f"{sum(len(r.get('stores_down', [])) for r in results)}",
             f"{'fault':22s} {'n':>3s} {'outage p50':>10s} {'p95':>6s} {'max':>6s}   "
             f"{'first answer p50':>16s} {'max':>6s}"]  # fmt: skip
    leader = [g for k, v in gaps.items() if "leader" in k for g in v]
    gaps["(all leader faults)"] = leader
    firsts["(all leader faults)"] = [g for k, v in firsts.items() if "leader" in k for g in v]
    for kind in sorted(gaps):
        if not gaps[kind]:
            continue
        g = [percentile(gaps[kind], q) for q in (50, 95, 100)]
        f = [percentile(firsts[kind], q) for q in (50, 100)]
        lines.append(f"{kind:22s} {len(gaps[kind]):3d} {g[0]:10.2f} {g[1]:6.2f} {g[2]:6.2f}   "
                     f"{f[0]:16.2f} {f[1]:6.2f}")  # fmt: skip
    return lines


def interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # unwinds through every Cluster's cleanup


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):  # also when started with SIGINT ignored (&)
        signal.signal(sig, interrupt)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=120, help="seconds of faults per schedule")
    ap.add_argument("--schedules", type=int, default=1, help="schedules, seeds seed..seed+K-1")
    ap.add_argument("--out", default="results/nemesis/run")
    ap.add_argument("--workers", type=int, default=3, help="client processes")
    ap.add_argument("--keys", type=int, default=16, help="keys each client writes")
    ap.add_argument("--client-ttl-s", type=float, default=10.0)
    ap.add_argument("--max-hold-s", type=float, default=30.0, help="longest pause/partition")
    ap.add_argument("--loopback", action="store_true", help="no namespaces, no partitions")
    ap.add_argument("--faults", default="", help="only these kinds (comma-separated)")
    ap.add_argument(
        "--report",
        nargs="+",
        metavar="DIR",
        help="no run: the summary of the result.json files under these directories",
    )
    ap.add_argument("--recheck", action="store_true",
                    help="with --report: run the checker again over the stored histories")  # fmt: skip
    args = ap.parse_args()
    if args.report:
        found = sorted(p for d in args.report for p in Path(d).rglob("result.json"))
        if args.recheck:
            results = [recheck(p.parent) for p in found]
        else:
            results = [json.loads(p.read_text()) for p in found]
        say(f"seeds {sorted(r['seed'] for r in results)}")
        for line in summary(results):
            say(line)
        return 0
    why = "--loopback" if args.loopback else netns_unavailable()
    if why:
        say(f"partitions skipped, everything on 127.0.0.1: {why}")
    results = []
    for i in range(args.schedules):
        seed = args.seed + i
        s = Settings(workers=args.workers, keys=args.keys, client_ttl_s=args.client_ttl_s,
                     seed=seed)  # fmt: skip
        run = Path(args.out) / f"seed-{seed}"
        say(f"schedule {i + 1}/{args.schedules} seed {seed} -> {run}")
        t = time.monotonic()
        kinds = [k for k in args.faults.split(",") if k]
        r = run_schedule(s, run, args.duration, not why, args.max_hold_s, say, kinds)
        results.append(r)
        say(f"  seed {seed}: {r['ops']} calls in {time.monotonic() - t:.0f} s, wrong reads "
            f"{r['wrong_reads']}, lost {r['lost_objects']} (excused {r['excused_losses']}), "
            f"vanished {r['vanished_reads']}, "
            f"evicted {r['evicted']} ({r['eviction_scrapes']} reads of the counters), "
            f"storage nodes down at the end {r.get('stores_down', [])}")  # fmt: skip
        for p in r["problems"][:5]:
            say(f"    {p['kind']} {p['key']}: {p['detail']}")
    lines = summary(results)
    for line in lines:
        say(line)
    (Path(args.out) / "summary.txt").write_text("\n".join(lines) + "\n")
    bad = any(r["wrong_reads"] or r["lost_objects"] or r["vanished_reads"] or r["evicted"]
              for r in results)  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("interrupted: every process and namespace of the run was stopped")
        sys.exit(130)
