"""Mooncake shim overhead: ``mooncake.store.MooncakeDistributedStore`` (kvcake's shim) against
``kvcake.store.Client`` on store_bench's topology and ops, interleaved ABAB in one process.

    python benchmarks/compat_bench.py [--protocol tcp|auto] [--rounds 40]

A master and one store-server process (``--segment``), then one client of each kind in this
process, neither mounting memory. Ops: 4 KB single put, 4 KB single get, 1 MB batch get of 16.
Each op runs ``--rounds`` rounds; a round is a short chunk of calls on each side (order
alternating), so both sides see the same machine load. Prints op/s over all rounds, the
shim/Client ratio of the totals and the median (IQR) of per-round ratios; the goal (issue 14)
is a ratio >= 0.90 (the shim adds <= 10%).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mooncake_peer as peer

KB, MB = 1024, 1024 * 1024
BATCH = 16


def timed(fn: Callable[[int], Any], lo: int, hi: int) -> float:
    t0 = time.perf_counter()
    for i in range(lo, hi):
        fn(i)
    return time.perf_counter() - t0


@dataclass
class Op:
    name: str
    calls: int  # per side and round
    prepare: Callable[[Any, str, int], None]  # (store, tag, n): values the loop reads
    run: Callable[[Any, str], Callable[[int], Any]]  # (store, tag) -> call(i)


SMALL, BIG = os.urandom(4 * KB), os.urandom(MB)


def _noop(store: Any, tag: str, n: int) -> None:
    return None


def _put_small(store: Any, tag: str, n: int) -> None:
    for i in range(n):
        store.put(f"{tag}/{i}", SMALL)


def _put_big(store: Any, tag: str, n: int) -> None:
    for j in range(4 * BATCH):
        store.put(f"{tag}/{j}", BIG)


def _batch_keys(tag: str, i: int) -> list[str]:
    return [f"{tag}/{(i % 4) * BATCH + j}" for j in range(BATCH)]


OPS = [
    Op("4KB put", 100, _noop, lambda s, t: lambda i: s.put(f"{t}/{i}", SMALL)),
    Op("4KB get", 100, _put_small, lambda s, t: lambda i: s.get(f"{t}/{i}")),
    Op(
        "1MB batch-16 get",
        4,
        _put_big,
        lambda s, t: (
            (lambda i: s.get_batch(_batch_keys(t, i)))
            if hasattr(s, "get_batch")
            else (lambda i: s.batch_get(_batch_keys(t, i)))
        ),
    ),
]


def spawn(args: list[str], what: str) -> dict[str, str]:
    """A kvcake subprocess (killed with us: PR_SET_PDEATHSIG) and the fields of its ready line."""
    proc = peer.start(
        [sys.executable, "-m", "kvcake", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    line = peer.read_ready(proc, what, timeout=120)
    assert proc.stdout is not None
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe drained
    return dict(re.findall(r"(\w+)=(\S*)", line))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", default="tcp", choices=("tcp", "auto"))
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--segment", default="512MiB")
    args = ap.parse_args(argv)

    from kvcake.compat.mooncake.store import MooncakeDistributedStore
    from kvcake.store.client import Client

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below
    minfo = spawn(["master", "--port", "0", "--http-port", "-1"], "master")
    spawn(["store-server", "--master", minfo["rpc"], "--segment-size", args.segment], "store")
    client = Client(master=minfo["rpc"], protocol=args.protocol)
    shim = MooncakeDistributedStore()
    rc = shim.setup("127.0.0.1", "P2PHANDSHAKE", 0, 64 * MB, args.protocol, "", minfo["rpc"])
    assert rc == 0, rc
    sides = {"client": client, "shim": shim}
    # Fine-grained ABAB: every round runs a short chunk on each side (order alternating), so
    # both see the same load; rates are totals over all rounds, plus per-round ratios.
    results: dict[str, dict[str, Any]] = {}
    try:
        for op in OPS:
            spent = {"client": 0.0, "shim": 0.0}
            ratios = []
            for name in sides:  # values the read ops read, written once per side
                op.prepare(sides[name], f"{op.name}/{name}", op.calls)
            for r in range(args.rounds):
                order = ("client", "shim") if r % 2 == 0 else ("shim", "client")
                t: dict[str, float] = {}
                for name in order:
                    fresh = op.prepare is _noop  # puts write new keys every round
                    tag = f"{op.name}/{name}/{r}" if fresh else f"{op.name}/{name}"
                    t[name] = timed(op.run(sides[name], tag), 0, op.calls)
                    spent[name] += t[name]
                ratios.append(t["client"] / t["shim"])
            client.remove_all(force=True)
            n = op.calls * args.rounds
            results[op.name] = {
                "client": n / spent["client"],
                "shim": n / spent["shim"],
                "ratio": spent["client"] / spent["shim"],
                "median": statistics.median(ratios),
                "q": (sorted(ratios)[len(ratios) // 4], sorted(ratios)[3 * len(ratios) // 4]),
            }
            print(f"{op.name} done", file=sys.stderr, flush=True)
    finally:
        shim.close()
        client.close()
        peer.stop_all()
    print(f"protocol={args.protocol} rounds={args.rounds}")
    print("| op | Client op/s | shim op/s | shim/Client (totals) | per-round ratio median (IQR) |")
    print("|---|---:|---:|---:|---:|")
    for name, res in results.items():
        lo, hi = res["q"]
        print(
            f"| {name} | {res['client']:,.0f} | {res['shim']:,.0f} | {res['ratio']:.3f} | "
            f"{res['median']:.3f} ({lo:.3f}-{hi:.3f}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
