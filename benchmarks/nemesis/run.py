"""One nemesis schedule end to end: start the cluster, inject the faults, heal, stop the
workers, read every key back, stop the cluster, check the history."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.nemesis import checker
from benchmarks.nemesis.checker import Fault
from benchmarks.nemesis.cluster import Cluster, Settings
from benchmarks.nemesis.faults import KINDS, PARTITIONS, run_faults
from benchmarks.nemesis.worker import MAX_SIZE

from kvcake.core.config import parse_size

WARMUP_S = 3.0
FINAL_SETTLE_S = 30.0


def check_sizing(s: Settings) -> None:
    """Every key at its largest value on two replicas fits in half the pool: the watermark
    (90 %) is never reached, so nothing may be evicted (an eviction fails the run anyway)."""
    need = s.workers * s.keys * MAX_SIZE * 2
    have = s.stores * parse_size(s.segment)
    if need > have // 2:
        raise ValueError(f"{need} B of values need a pool of at least {2 * need} B, not {have}")


def final_read(cl: Cluster, say: Callable[[str], None]) -> dict[str, Any]:
    """Stop the workers, then read every key from a fresh client on the first client host."""
    for w in cl.workers:
        cl.procs[w].signal(signal.SIGTERM)
    for w in cl.workers:
        p = cl.procs[w].popen
        if p is not None:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                cl.procs[w].signal(signal.SIGKILL)
    argv = [*cl.worker_argv(cl.workers[0], final=True), "--settle-s", str(FINAL_SETTLE_S)]
    r = subprocess.run(cl.hosts.command(cl.workers[0], argv), env=cl.hosts.env(cl.secret),
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    if r.returncode != 0:
        say(f"  final reader failed (rc {r.returncode}): {r.stdout[-1500:]}{r.stderr[-1500:]}")
    out: dict[str, Any] = {}
    path = cl.run / "final.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        out[rec["k"]] = rec["read"]
    return out


def run_schedule(s: Settings, run: Path, duration_s: float, netns: bool, max_hold_s: float,
                 say: Callable[[str], None], only: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """``only``: the fault kinds to draw from (default: all that can run here)."""
    check_sizing(s)
    unknown = set(only or ()) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {sorted(KINDS)}")
    kinds = [k for k in (only or KINDS) if netns or k not in PARTITIONS]
    t0 = time.monotonic()
    with Cluster(s, run, netns) as cl:
        t_start = time.monotonic()
        say(
            f"  cluster up in {t_start - t0:.1f} s (etcd, {s.masters} masters, {s.stores} "
            f"storage nodes, {s.workers} clients)"
        )
        time.sleep(WARMUP_S)
        faults = run_faults(cl, duration_s, s.seed, kinds, max_hold_s, say)
        time.sleep(max(3.0, s.client_ttl_s / 2))  # heartbeats and remounts after the last fault
        cl.scrape_evictions()
        t_end = time.monotonic()
        final = final_read(cl, say)
        cl.scrape_evictions()
        evicted = {"evicted": sum(cl.evicted.values()), "eviction_scrapes": cl.scrapes,
                   "stores_down": cl.stores_down()}  # fmt: skip
    return evaluate(run, s, faults, final, t_end - t_start, t_end, evicted, netns)


def evaluate(run: Path, s: Settings, faults: list[Fault], final: dict[str, Any],
             seconds: float, t_end: float, evicted: dict[str, Any], netns: bool) -> dict[str, Any]:  # fmt: skip
    ops = checker.load_history(sorted(run.glob("hist-*.jsonl")))
    wrong = checker.wrong_reads(ops)
    stores = [f"s{i}" for i in range(s.stores)]
    lost, excused = checker.lost_objects(ops, final, faults, stores)
    vanished = checker.vanished_reads(ops, faults, stores)
    outs = checker.outages(ops, faults, t_end)
    counts: dict[str, int] = {}
    for o in ops:
        counts[f"{o.f}:{o.outcome}"] = counts.get(f"{o.f}:{o.outcome}", 0) + 1
        # reads a checksum stopped (issue 30 §1): an error, never bytes, but worth counting
        errs = [o.err, *(r for r in o.reads if isinstance(r, str))]
        if any("IntegrityError" in e or "ChecksumMismatch" in e for e in errs):
            counts["integrity_errors"] = counts.get("integrity_errors", 0) + 1
    res = {
        "seed": s.seed, "seconds": round(seconds, 1), "t_end": t_end, "netns": netns,
        "ops": len(ops),
        "counts": dict(sorted(counts.items())), "keys_final": len(final),
        "wrong_reads": len(wrong), "lost_objects": len(lost), "excused_losses": excused,
        "vanished_reads": len(vanished),
        **evicted,
        "faults": [{**asdict(f), "first_answer_s": None if o.first is None else round(o.first, 3),
                    "outage_s": round(o.gap, 3)} for f, o in zip(faults, outs, strict=True)],
        "problems": [p.as_dict() for p in (wrong + lost + vanished)[:200]],
    }  # fmt: skip
    (run / "result.json").write_text(json.dumps(res, indent=1))
    return res


def recheck(run: Path) -> dict[str, Any]:
    """Evaluate a stored run (``OUT/seed-N``) again with the current checker."""
    old = json.loads((run / "result.json").read_text())
    fields = ("kind", "target", "start", "end", "node_dead", "wall")
    faults = [Fault(**{k: f[k] for k in fields if k in f}) for f in old["faults"]]
    final: dict[str, Any] = {}
    path = run / "final.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        final[rec["k"]] = rec["read"]
    ops = checker.load_history(sorted(run.glob("hist-*.jsonl")))
    t_end = old.get("t_end") or max(o.complete for o in ops if o.complete < float("inf"))
    evicted = {"evicted": old["evicted"], "eviction_scrapes": old.get("eviction_scrapes", 0),
               "stores_down": old.get("stores_down", [])}  # fmt: skip
    s = Settings(seed=old["seed"])
    return evaluate(run, s, faults, final, old["seconds"], t_end, evicted, old["netns"])
