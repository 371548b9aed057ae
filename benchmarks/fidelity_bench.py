"""Simulator fidelity (issue 17 §3): ``kvcake replay --compare-sim`` on fresh clusters.

For each configuration: ``kvcake up --detach`` from the shipped TOML (its run_dir moved to a
temporary directory, so every run starts with empty caches), ``kvcake replay ... --compare-sim
--json``, ``kvcake down``. Prints TTFT p50/p90 and TBT p50, measured vs simulated, with the
error (simulated / measured - 1), the probe's overheads and the load average, per run and as
the median error over ``--repeats`` runs.

    python benchmarks/fidelity_bench.py [--configs emulated,cluster] [--repeats 3]
    python benchmarks/fidelity_bench.py --configs cluster --limit 20     # real SmolLM2

Configurations (slices of the bundled conversation sample):
* ``emulated``: configs/emulated.toml (LLaMA3-70B cost model x 0.25, 1P+1D, store), first
  ``--limit`` (60) requests at 0.5x speed, outputs capped at 64, 512-token blocks;
* ``cluster``: configs/cluster.toml (real SmolLM2-135M on CPU, 1P+1D, one torch thread each),
  first ``--limit`` requests at ``--speedup`` 0.05, 32 tokens per trace block (prompts of a
  few hundred tokens), outputs capped at 32.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

METRICS = ("ttft_p50", "ttft_p90", "tbt_p50")
CONFIGS: dict[str, dict[str, Any]] = {
    "emulated": {"toml": "emulated.toml", "limit": 60, "speedup": 0.5, "max_output": 64,
                 "replay": ["--tokens-per-block", "512", "--max-context", "65536"]},
    "cluster": {"toml": "cluster.toml", "limit": 20, "speedup": 0.05, "max_output": 32,
                "replay": ["--tokens-per-block", "32", "--max-context", "8192",
                           "--vocab-size", "49152"]},
}  # fmt: skip


def kvcake(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvcake", *args], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def one_run(name: str, spec: dict[str, Any], work: Path, args: argparse.Namespace) -> dict:
    from kvcake.serve.config import default_cluster_file

    src = default_cluster_file().with_name(spec["toml"]).read_text()
    run_dir = work / "runs"
    conf = work / spec["toml"]
    src = src.replace('run_dir = "runs"', f'run_dir = "{run_dir}"')
    conf.write_text(src.replace("proxy_port = 8000", "proxy_port = 0"))  # a free port
    up = kvcake("up", "--config", str(conf), "--detach")
    if up.returncode != 0:
        raise RuntimeError(f"kvcake up failed: {up.stderr[-2000:]}")
    url = up.stdout.split("cluster up: ")[1].split("/v1")[0]
    out = work / "cmp.json"
    try:
        rep = kvcake("replay", "--url", url, "--limit", str(args.limit or spec["limit"]),
                     "--speedup", str(args.speedup or spec["speedup"]), "--max-output",
                     str(spec["max_output"]), *spec["replay"], "--compare-sim",
                     "--cluster-config", str(conf), "--json", str(out))  # fmt: skip
        if rep.returncode != 0:
            raise RuntimeError(f"kvcake replay failed: {rep.stderr[-2000:]}")
        doc: dict = json.loads(out.read_text())
    finally:
        kvcake("down", "--config", str(conf), timeout=180)
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--configs", default="emulated", help="comma-separated: emulated, cluster")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="requests (default: per config)")
    ap.add_argument("--speedup", type=float, default=0.0, help="default: per config")
    ap.add_argument("--out", help="write every run's JSON here")
    args = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {}
    for name in args.configs.split(","):
        for i in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix=f"kvcake-fid-{name}-") as tmp:
                doc = one_run(name, CONFIGS[name], Path(tmp), args)
            runs.setdefault(name, []).append(doc)
            m, s, o = doc["measured"], doc["simulated"], doc["overheads"] or {}
            cells = " | ".join(f"{m[k]:.3f} / {s[k]:.3f} ({s[k] / m[k] - 1:+.0%})" for k in METRICS)
            print(
                f"| {name} #{i + 1} | {cells} | gate +{o.get('dispatch_s', 0) * 1e3:.0f} ms, "
                f"first +{o.get('first_token_s', 0) * 1e3:.0f} ms, TBT +"
                f"{o.get('tbt_extra_s', 0) * 1e3:.1f} ms | cpu x{s.get('cpu_slowdown', 1):.2f}"
                f" | load {doc['load_before'][0]:.1f}-{doc['load_after'][0]:.1f} |",
                flush=True,
            )
    print("\n| configuration | " + " | ".join(f"{k} error (median)" for k in METRICS) + " |")
    print("|---|" + "---:|" * len(METRICS))
    for name, docs in runs.items():
        errs = [statistics.median(d["simulated"][k] / d["measured"][k] - 1 for d in docs)
                for k in METRICS]  # fmt: skip
        print(f"| {name} ({len(docs)} runs) | " + " | ".join(f"{e:+.0%}" for e in errs) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=2))
    print(f"\n{os.cpu_count()} CPUs; load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
