"""Mooncake shim overhead: ``mooncake.store.MooncakeDistributedStore`` (kvcake's shim) against
``kvcake.store.Client`` on store_bench's topology and ops, interleaved ABAB in one process.

    python benchmarks/compat_bench.py [--protocol tcp|auto] [--repeats 6] [--calls 400]

A master and one store-server process (64 MiB... ``--segment``), then one client of each kind in
this process, neither mounting memory. Per repeat, each side runs the same op loop (the order
alternates between repeats): 4 KB single put, 4 KB single get, 1 MB batch get of 16. Prints op/s
per repeat and the median shim/Client ratio per op; the goal (issue 14) is a ratio >= 0.90.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import store_bench  # noqa: E402  (spawn: a kvcake subprocess and its ready line)

KB, MB = 1024, 1024 * 1024
BATCH = 16


def loop(fn: Callable[[int], Any], n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - t0)


def ops(side: str, obj: Any, tag: str, calls: int) -> dict[str, Callable[[], float]]:
    small, big = os.urandom(4 * KB), os.urandom(MB)
    shim = side == "shim"
    put = obj.put
    get = obj.get
    batch_get = obj.get_batch if shim else obj.batch_get
    clear = (lambda: obj.remove_all(True)) if shim else (lambda: obj.remove_all(force=True))

    def put_4k() -> float:
        rate = loop(lambda i: put(f"{tag}/p/{i}", small), calls)
        clear()
        return rate

    def get_4k() -> float:
        for i in range(calls):
            put(f"{tag}/g/{i}", small)
        rate = loop(lambda i: get(f"{tag}/g/{i}"), calls)
        clear()
        return rate

    def batch_get_1m() -> float:
        n = max(8, calls // 16)
        keys = [[f"{tag}/b/{i}/{j}" for j in range(BATCH)] for i in range(4)]
        for ks in keys:
            for k in ks:
                put(k, big)
        rate = loop(lambda i: batch_get(keys[i % 4]), n)
        clear()
        return rate

    return {"4KB put": put_4k, "4KB get": get_4k, "1MB batch-16 get": batch_get_1m}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", default="tcp", choices=("tcp", "auto"))
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--segment", default="512MiB")
    args = ap.parse_args(argv)

    from kvcake.compat.mooncake.store import MooncakeDistributedStore
    from kvcake.store.client import Client

    master, minfo = store_bench.spawn(["master", "--port", "0", "--http-port", "-1"], "master")
    node, _ = store_bench.spawn(
        ["store-server", "--master", minfo["rpc"], "--segment-size", args.segment], "store-server"
    )
    client = Client(master=minfo["rpc"], protocol=args.protocol)
    shim = MooncakeDistributedStore()
    rc = shim.setup("127.0.0.1", "P2PHANDSHAKE", 0, 64 * MB, args.protocol, "", minfo["rpc"])
    assert rc == 0, rc
    sides = {"client": client, "shim": shim}
    rates: dict[str, dict[str, list[float]]] = {}
    try:
        for r in range(args.repeats):
            order = ("client", "shim") if r % 2 == 0 else ("shim", "client")
            for name in order:
                for op, fn in ops(name, sides[name], f"{name}{r}", args.calls).items():
                    rates.setdefault(op, {}).setdefault(name, []).append(fn())
            print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    finally:
        shim.close()
        client.close()
        for p in (node, master):
            p.terminate()
            p.wait(10)
    print(f"protocol={args.protocol} repeats={args.repeats} calls={args.calls}")
    print("| op | Client op/s (median, min-max) | shim op/s (median, min-max) | shim/Client (median of per-repeat ratios) |")
    print("|---|---:|---:|---:|")
    for op, by in rates.items():
        c, s = by["client"], by["shim"]
        ratio = statistics.median(x / y for x, y in zip(s, c, strict=True))
        print(
            f"| {op} | {statistics.median(c):,.0f} ({min(c):,.0f}-{max(c):,.0f}) | "
            f"{statistics.median(s):,.0f} ({min(s):,.0f}-{max(s):,.0f}) | {ratio:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
