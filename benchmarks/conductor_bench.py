"""Conductor decision latency (issue 6 goal: median <= 100 us).

Setup: ``--instances`` prefill instances (default 64), each holding a random 0..N-block prefix of
the request plus ``--unrelated`` other blocks (default 10,000) in the KV index; requests of N
blocks (default 128); 16 decode instances. Every decision gets a *fresh* snapshot (new
``PrefillState`` tuple with random queue times, built just before the decision but outside
the timed region), so no per-tuple
cache is reused; each timed call is one full ``Conductor.schedule`` — prefix match, Algorithm-1
TTFT estimates for every prefill instance, decode choice, admission. Reports the median and p99
over ``--decisions`` decisions (default 10,000) per policy and index type.

Run: ``kvcake bench conductor`` or ``python benchmarks/conductor_bench.py [--help]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Iterator, Sequence

from kvcake.conductor import PREFILL_POLICIES, Conductor, ConductorConfig, PrefixIndex
from kvcake.core.api import ClusterSnapshot, DecodeState, KVIndex, PrefillState, RequestView
from kvcake.core.ids import BlockHash, InstanceId, RequestId
from kvcake.core.stats import percentile

BLOCK_TOKENS = 512
KV_BYTES_PER_TOKEN = 327_680  # LLaMA3-70B, bf16
LINK_BANDWIDTH = 100e9 / 8  # 100 Gbps


def build_index(index: KVIndex, args: argparse.Namespace, request: list[BlockHash]) -> None:
    rng = random.Random(args.seed + 1)
    for i in range(args.instances):
        iid = InstanceId(f"prefill-{i}")
        index.add(iid, request[: rng.randint(0, args.blocks)])
        index.add(iid, [BlockHash(rng.getrandbits(64)) for _ in range(args.unrelated)])


def snapshots(args: argparse.Namespace, index: KVIndex) -> Iterator[ClusterSnapshot]:
    """A fresh snapshot per decision, built just before it (as the simulator and the proxy do),
    with new random queue times: nothing is served from a per-tuple cache."""
    rng = random.Random(args.seed + 2)
    decode = tuple(
        DecodeState(InstanceId(f"decode-{j}"), rng.randint(0, 32), rng.randint(0, 400_000), 10**6)
        for j in range(16)
    )
    names = [InstanceId(f"prefill-{i}") for i in range(args.instances)]  # long-lived ids
    for k in range(args.decisions):
        prefill = tuple(PrefillState(n, rng.uniform(0, 10), rng.randint(0, 4)) for n in names)
        yield ClusterSnapshot(
            float(k), prefill, decode, index, BLOCK_TOKENS, KV_BYTES_PER_TOKEN, LINK_BANDWIDTH
        )


def run(policy: str, index: KVIndex, args: argparse.Namespace, req: list[BlockHash]) -> dict:
    conductor = Conductor(ConductorConfig(prefill_policy=policy))
    snaps = snapshots(args, index)
    blocks = tuple(req)
    times, cpu, ref, fetches = [], [], [], 0
    clock, tclock = time.perf_counter, time.thread_time
    for k, snap in enumerate(snaps):
        request = RequestView(RequestId(f"r{k}"), float(k), args.blocks * BLOCK_TOKENS, blocks, 256)
        c0 = tclock()
        t0 = clock()
        decision = conductor.schedule(request, snap)
        t1 = clock()
        cpu.append(tclock() - c0)
        times.append(t1 - t0)
        fetches += bool(getattr(decision, "fetch", ()))
        t2 = clock()
        _reference()
        ref.append(clock() - t2)
    times.sort()
    ref.sort()
    return {
        "policy": policy,
        "index": type(index).__name__,
        "decisions": len(times),
        "median_us": statistics.median(times) * 1e6,
        "p99_us": percentile(times, 99) * 1e6,
        "min_us": times[0] * 1e6,
        "p10_us": percentile(times, 10) * 1e6,
        # CPU time of this thread: excludes time the scheduler gave to other processes.
        "cpu_median_us": statistics.median(cpu) * 1e6,
        "fetch_decisions": fetches,
        # A fixed pure-Python workload timed right after each decision: its median/min ratio
        # shows how much a shared machine inflates medians (1.0 on an idle machine).
        "reference_slowdown": statistics.median(ref) / ref[0],
    }


def _reference() -> int:
    """Fixed CPU work (~tens of us): dict lookups, int and float arithmetic, like the conductor."""
    d = _REF_DICT
    acc = 0
    for i in range(200):
        acc += d.get(i & 127, 0) * 3 + (i >> 2)
    return acc + int(sum(x * 0.5 for x in range(64)))


_REF_DICT = {i: i * i for i in range(128)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="conductor_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=int, default=64, help="prefill instances (default 64)")
    p.add_argument("--blocks", type=int, default=128, help="request length in blocks")
    p.add_argument("--unrelated", type=int, default=10_000, help="other blocks per instance")
    p.add_argument("--decisions", type=int, default=10_000, help="timed decisions per run")
    p.add_argument("--policy", action="append", choices=sorted(PREFILL_POLICIES),
                   help="policy to time (repeatable; default: all)")  # fmt: skip
    p.add_argument("--index", choices=("prefix", "core", "both"), default="both",
                   help="PrefixIndex (bitmask), core KVIndex (sets), or both")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results to this JSON file")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    req = [BlockHash(rng.getrandbits(64)) for _ in range(args.blocks)]
    kinds = {"prefix": [PrefixIndex], "core": [KVIndex], "both": [PrefixIndex, KVIndex]}
    policies = args.policy or [
        "global-cache-aware",
        *sorted(set(PREFILL_POLICIES) - {"global-cache-aware"}),
    ]
    rows = []
    for cls in kinds[args.index]:
        index = cls()
        build_index(index, args, req)
        for policy in policies if cls is PrefixIndex else policies[:1]:
            rows.append(run(policy, index, args, req))
            r = rows[-1]
            print(f"{r['index']:<12} {r['policy']:<20} median {r['median_us']:8.1f} us  "
                  f"p10 {r['p10_us']:6.1f}  p99 {r['p99_us']:8.1f}  min {r['min_us']:6.1f}  "
                  f"cpu-median {r['cpu_median_us']:6.1f} us  ref-slowdown {r['reference_slowdown']:.2f}  "
                  f"({r['decisions']} decisions, {r['fetch_decisions']} with fetch)", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
