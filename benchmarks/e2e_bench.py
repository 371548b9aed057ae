"""End-to-end serving benchmarks of a local kvcake cluster (issue 7).

Two parts (``--part prefix|trace|all``):

* ``prefix`` — real SmolLM2-135M through the proxy of a disaggregated cluster (1 prefill +
  1 decode, torch backend): TTFT of a request whose 1,536-token prompt prefix was seen before plus
  64 new tokens, vs the TTFT of the earlier (cold) request: ``--repeats`` fresh prefixes, median
  of each; goal >= 8x lower. TTFT is measured by the client (first streamed token).
* ``trace`` — a slice of the bundled Mooncake conversation trace replayed (``kvcake replay``'s
  code) against the emulated backend (LLaMA3-70B on 8xA800 cost model, real KV bytes) served
  disaggregated (1 prefill + 1 decode) vs colocated (2 instances each doing both: same number of
  instances); throughput, TTFT and TBT percentiles, prefix hit rate, effective capacity.

Run: ``kvcake bench e2e`` or ``python benchmarks/e2e_bench.py [--help]``. Prints JSON lines and
a table; results recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from kvcake.core.trace import read_trace, scale_time
from kvcake.data import sample_trace_path
from kvcake.launch.launcher import Cluster, load_serve_file
from kvcake.replay.runner import ReplayOptions, run_replay


def cluster(run_dir: Path, **sections: dict[str, Any]) -> Cluster:
    ov: dict[str, dict[str, Any]] = {
        "cluster": {"proxy_port": 0, "run_dir": str(run_dir), "store_servers": 1},
        "instance": {"backend": "emulated"},
        "conductor": {"admission_policy": "none"},
    }
    for k, v in sections.items():
        ov.setdefault(k, {}).update(v)
    return Cluster(load_serve_file(None, ov), run_dir=run_dir / "run", quiet=True)


def ttft(url: str, prompt: list[int]) -> float:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - t0
    raise RuntimeError("no token streamed")


def part_prefix(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    cold, warm = [], []
    c = cluster(tmp / "prefix", instance={"backend": "torch", "kv_blocks": 512,
                                          "threads": args.threads})  # fmt: skip
    with c:
        ttft(c.url, [int(t) for t in rng.integers(300, 40000, size=64)])  # warm-up
        for _ in range(args.repeats):
            prefix = [int(t) for t in rng.integers(300, 40000, size=args.prefix_tokens)]
            first = prefix + [int(t) for t in rng.integers(300, 40000, size=args.new_tokens)]
            later = prefix + [int(t) for t in rng.integers(300, 40000, size=args.new_tokens)]
            cold.append(ttft(c.url, first))
            time.sleep(0.3)  # let the proxy's index learn the new blocks
            warm.append(ttft(c.url, later))
    out = {
        "part": "prefix", "prefix_tokens": args.prefix_tokens, "new_tokens": args.new_tokens,
        "repeats": args.repeats, "cold_ttft_median_s": statistics.median(cold),
        "warm_ttft_median_s": statistics.median(warm),
        "cold_ttft_s": cold, "warm_ttft_s": warm,
    }  # fmt: skip
    out["speedup"] = out["cold_ttft_median_s"] / out["warm_ttft_median_s"]
    return out


def part_trace(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    recs = scale_time(read_trace(args.trace or sample_trace_path(), limit=args.requests),
                      args.speedup)  # fmt: skip
    setups = {
        "disaggregated 1P+1D": {"cluster": {"prefill": 1, "decode": 1}},
        "colocated 2x(P+D)": {"cluster": {"prefill": 2, "decode": 0, "colocated": True}},
    }
    rows = []
    for name, sections in setups.items():
        inst = {"time_scale": args.time_scale, "kv_blocks": 1024, "max_batch": 64,
                "max_context": 65536}  # fmt: skip
        c = cluster(tmp / name.split()[0], instance=inst, kv={"kv_block_tokens": 512},
                    proxy={"max_prompt_tokens": 65536}, **sections)  # fmt: skip
        with c:
            opts = ReplayOptions(
                url=c.url, tokens_per_block=args.tokens_per_block, max_context=65536,
                max_output=args.max_output, ttft_slo_s=args.ttft_slo_s, tbt_slo_s=args.tbt_slo_s,
            )  # fmt: skip
            s = asyncio.run(run_replay(recs, opts))
        row = {"part": "trace", "setup": name, **s.as_dict()}
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--part", choices=("prefix", "trace", "all"), default="all")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prefix-tokens", type=int, default=1536)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch threads per instance")
    p.add_argument("--trace", help="trace JSONL (default: the bundled sample)")
    p.add_argument("--requests", type=int, default=200, help="first N requests of the trace")
    p.add_argument("--speedup", type=float, default=0.5, help="replay this much faster")
    p.add_argument("--tokens-per-block", type=int, default=512)
    p.add_argument("--time-scale", type=float, default=0.25, help="emulated time x this")
    p.add_argument("--max-output", type=int, default=64, help="cap output lengths")
    p.add_argument("--ttft-slo-s", type=float, default=30.0)
    p.add_argument("--tbt-slo-s", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvcake-e2e-") as d:
        if args.part in ("prefix", "all"):
            results.append(part_prefix(args, Path(d)))
            print(json.dumps(results[-1]), flush=True)
        if args.part in ("trace", "all"):
            for row in part_trace(args, Path(d)):
                results.append(row)
                print(json.dumps(row), flush=True)
    _table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _table(results: list[dict[str, Any]]) -> None:
    for r in results:
        if r["part"] == "prefix":
            print(f"\nprefix reuse: cold TTFT {r['cold_ttft_median_s'] * 1000:.0f} ms, "
                  f"warm {r['warm_ttft_median_s'] * 1000:.0f} ms -> {r['speedup']:.1f}x "
                  f"(median of {r['repeats']})")  # fmt: skip
    rows = [r for r in results if r["part"] == "trace"]
    if rows:
        cols = ("setup", "completed", "requests_per_s", "output_tokens_per_s", "ttft_p50",
                "ttft_p99", "tbt_p50", "tbt_p99", "prefix_hit_rate", "effective_capacity")  # fmt: skip
        print("\n" + " | ".join(cols))
        for r in rows:
            print(" | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols))


if __name__ == "__main__":
    sys.exit(main())
