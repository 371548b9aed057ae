"""The copies the store's memory paths make, in one process (docs/store.md, "Integrity"):

* ``slice`` -- ``dst[:] = src`` (glibc's ``memcpy``), what a Python copy costs;
* ``copy`` -- ``core.native.copy``: the plain copy the store takes from 256 KiB up (non-temporal
  stores into the destination);
* ``sum`` -- ``core.native.copy_sum`` with flags 0: ``memcpy`` per 4 KiB piece, then its sum;
* ``sum-stream`` -- the same, streamed (a put: the writer's own value streamed, then summed from L1);
* ``sum-bounce`` -- streamed through an L1 buffer that is summed (a read out of a peer's memory).

Sources and destinations rotate through ``--buffers`` buffers of each size, so most copies
meet memory that is not in the cache, as a pool's copies do. Reported: GB/s per variant (median
of ``--iters`` copies) and each variant over ``slice``; rounds repeat ``--repeats`` times.

Run: ``python benchmarks/copy_bench.py [--sizes 256KiB,1MiB,16MiB] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from kvcake.core import integrity, native
from kvcake.core.config import parse_size

Copy = Callable[[memoryview, memoryview], object]


def variants(size: int) -> dict[str, Copy]:
    seeds = integrity.chunk_seeds("k", 0, integrity.chunk_count(size))
    chunk = integrity.CHUNK
    stream, bounce = native.STREAM, native.STREAM | native.BOUNCE
    return {
        "slice": lambda s, d: d.__setitem__(slice(None), s),
        "copy": lambda s, d: native.copy(d, s),
        "sum": lambda s, d: native.copy_sum(d, s, chunk, seeds, 0),
        "sum-stream": lambda s, d: native.copy_sum(d, s, chunk, seeds, stream),
        "sum-bounce": lambda s, d: native.copy_sum(d, s, chunk, seeds, bounce),
    }


def one_round(size: int, count: int, iters: int) -> dict[str, float]:
    srcs = [memoryview(bytearray(os.urandom(size))) for _ in range(count)]
    dsts = [memoryview(bytearray(size)) for _ in range(count)]
    out = {}
    for name, fn in variants(size).items():
        times = []
        for i in range(iters):
            src, dst = srcs[i % count], dsts[(7 * i + 3) % count]
            t0 = time.perf_counter()
            fn(src, dst)
            times.append(time.perf_counter() - t0)
        out[name] = size / statistics.median(times) / 1e9
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256KiB,1MiB,16MiB")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--working-set", default="256MiB", help="bytes of buffers per size and side")
    a = ap.parse_args(argv)
    if not native.AVAILABLE:
        raise SystemExit("kvcake.core.native is not built: run `make native`")
    print("| size | round | " + " | ".join(variants(1)) + " | sum-stream/slice | sum-bounce/copy |")
    print("|---|---|" + "---|" * (len(variants(1)) + 2))
    for label in a.sizes.split(","):
        size = parse_size(label)
        count = max(2, parse_size(a.working_set) // size)
        for r in range(a.repeats):
            got = one_round(size, count, max(a.iters, 2 * count))
            cells = " | ".join(f"{v:.1f}" for v in got.values())
            print(f"| {label} | {r} | {cells} | {got['sum-stream'] / got['slice']:.2f}x "
                  f"| {got['sum-bounce'] / got['copy']:.2f}x |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
