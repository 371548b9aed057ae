"""The vLLM connector's pool load, outside vLLM (issue 13): N pooled blocks of a SmolLM2-shaped
paged KV (30 layers) read from a store-server on this host into the paged planes, two ways:

* ``staged`` — the old path: ``batch_get_into`` into a fresh host tensor, then
  ``PagedKV.scatter`` (one ``index_copy_`` per plane);
* ``direct`` — ``batch_get_into_ranges`` of each block's layer slices straight into the planes
  (``PagedKV.ranges``), under a ``ReadGuard`` as the connector's loader does.

* ``c-copy`` — the baseline (issue 37): the same scatter list (each block's 30 slices, from
  the store-server's segment as this process maps it into the planes), built once and run as
  one C loop of ``memcpy`` (``core.native.CopyList``): what a load costs with no lookup, no
  lease, no Python per slice and no checksum. Same host only (``--protocol auto``).
* ``c-stream`` — the same loop with non-temporal stores (``native.STREAM``), which the load
  itself uses for its copies: the faster of the two baselines on this machine.
* ``te-read`` (``--protocol tcp``) — the Transfer Engine's own TCP bandwidth for the same
  blocks: one engine batch reading every block whole into a registered buffer (no lookup, no
  checksum, no scatter), the baseline of issue 37's TCP goal.

Modes alternate for ``--repeats`` rounds (the order rotates each round); each round reports the
median of ``--iters`` loads (the first dropped: it maps the segment). The planes are checked to
hold the pooled bytes. The last line gives, per round, each mode's speed over each baseline's.

Run: ``python benchmarks/pool_load_bench.py [--blocks 56] [--repeats 3] [--protocol auto|tcp]
[--integrity]``.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import os
import pstats
import statistics
import time

import torch

from kvcake.core import native
from kvcake.core.ids import SegmentName
from kvcake.core.native import CopyList
from kvcake.fleet.procs import spawn_kvcake
from kvcake.integrations.vllm.paged import PagedKV
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig
from kvcake.store.readguard import ReadGuard
from kvcake.transfer.types import Op, TransferRequest

LAYERS, NUM_BLOCKS = 30, 400
BASELINES = {"c-copy": 0, "c-stream": native.STREAM}
SHAPE = (3, 16, 2 * 64 * 2)  # kv_heads, block_size, 2 * head_size (fp32: 49 KB per layer)


def c_copy_list(c: Client, paged: PagedKV, keys: list[str], ids: list[int], flags: int) -> CopyList:
    """The load's scatter list, source addresses in this process's mapping of the node."""
    copies = []
    for key, block in zip(keys, ids, strict=True):
        rep = c.get_replica_desc(key).replicas[0]
        mapped = c.engine.mapped_span(rep.segment, rep.offset, paged.block_bytes)
        assert mapped is not None, "the c-copy baseline needs a same-host node (--protocol auto)"
        base = native._address(mapped[0])
        copies += [(base + off, buf) for off, buf in paged.ranges(block)]
    return CopyList(copies, flags)


def te_batch(c: Client, keys: list[str], block_bytes: int) -> list[TransferRequest]:
    """One engine batch reading every block whole into a registered local buffer."""
    name = SegmentName("te-read-baseline")
    c.engine.register_memory(name, bytearray(block_bytes * len(keys)))
    reqs = []
    for i, key in enumerate(keys):
        rep = c.get_replica_desc(key).replicas[0]
        seg = SegmentName(rep.segment)
        reqs.append(TransferRequest(Op.READ, name, i * block_bytes, seg, rep.offset, block_bytes))
    return reqs


def load(mode: str, c: Client, paged: PagedKV, keys: list[str], ids: list[int]) -> None:
    if mode == "staged":
        buf = paged.empty(len(keys))
        got = c.batch_get_into(keys, list(buf))
        paged.scatter(ids, buf)
    else:
        got = c.batch_get_into_ranges(keys, paged.tables(ids), ReadGuard())
    assert all(g == paged.block_bytes for g in got), got[:2]


def profile_loads(n: int, c: Client, paged: PagedKV, keys: list[str], ids: list[int]) -> None:
    """Where ``n`` direct loads spend their time, by function (own time, per load)."""
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(n):
        load("direct", c, paged, keys, ids)
    prof.disable()
    wall = (time.perf_counter() - t0) / n * 1e3
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:15]  # type: ignore[attr-defined]
    print(f"profile: {n} direct loads, {wall:.1f} ms each under the profiler; own time per load:")
    for (file, line, fn), (_, calls, own, _cum, _) in rows:
        where = f"{os.path.basename(file)}:{line}({fn})" if line else fn
        print(f"  {own / n * 1e3:7.2f} ms  {calls // n:6d} calls  {where}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=56)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--protocol", default="auto", choices=("auto", "tcp"))
    ap.add_argument(
        "--integrity",
        action="store_true",
        help="compare the direct load with verification on and off (client.verify; "
        "docs/store.md, Integrity) instead of staged vs direct",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the rounds, profile N direct loads (cProfile) and print where their time "
        "goes, top functions by own time (docs/benchmarks.md, 'Where a load's time goes')",
    )
    a = ap.parse_args(argv)
    plain: Client | None = None  # --integrity: the same reads with verification off
    master = spawn_kvcake("master", "--port", "0", "--http-port", "-1")
    store = spawn_kvcake("store-server", "--master", master.info["rpc"], "--segment-size", "512MiB")
    try:
        caches = {f"l{i}": torch.zeros(NUM_BLOCKS, *SHAPE) for i in range(LAYERS)}
        paged = PagedKV(caches, NUM_BLOCKS)
        cfg = ClientConfig(master=master.info["rpc"], protocol=a.protocol, tune_malloc=False)
        modes = ["direct", "unverified"] if a.integrity else ["staged", "direct"]
        if a.protocol == "auto" and native.AVAILABLE:
            modes += list(BASELINES)
        if a.protocol == "tcp":
            modes.append("te-read")
        if a.integrity:
            plain = Client(dataclasses.replace(cfg, verify=False))
        with Client(cfg) as c:
            src = paged.empty(a.blocks).normal_(generator=torch.Generator().manual_seed(0))
            keys = [f"block-{i}" for i in range(a.blocks)]
            for k, row in zip(keys, src, strict=True):
                c.put(k, row.numpy())
            ids = list(range(100, 100 + a.blocks))
            mb = paged.block_bytes * a.blocks / 1e6
            rows = []
            baselines = {
                m: c_copy_list(c, paged, keys, ids, flags)
                for m, flags in BASELINES.items()
                if m in modes
            }
            te = te_batch(c, keys, paged.block_bytes) if "te-read" in modes else []
            for r in range(a.repeats):
                for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
                    ts = []
                    reader = plain if mode == "unverified" and plain is not None else c
                    for _ in range(a.iters):
                        if mode in baselines:
                            t0 = time.perf_counter()
                            baselines[mode].run()
                        elif mode == "te-read":
                            t0 = time.perf_counter()
                            c.engine.transfer(te).raise_for_errors()
                        else:
                            t0 = time.perf_counter()
                            load(mode, reader, paged, keys, ids)
                        ts.append(time.perf_counter() - t0)
                    out = paged.empty(a.blocks)
                    paged.gather(ids, out)
                    assert torch.equal(out, src), "the planes do not hold the pooled bytes"
                    med = statistics.median(ts[1:])
                    rows.append({"round": r, "mode": mode, "mb": round(mb, 1),
                                 "median_ms": round(med * 1e3, 1),
                                 "gb_per_s": round(mb / med / 1e3, 2)})  # fmt: skip
                    print(json.dumps(rows[-1]), flush=True)
            ms = {(x["round"], x["mode"]): x["median_ms"] for x in rows}
            rounds = range(a.repeats)
            # staged/direct times; with --integrity the inverse of direct/unverified times:
            # the speed with verification over the speed without
            first, second = modes[0], modes[1]
            name = "verified_over_unverified_speed" if a.integrity else "staged_over_direct"
            pair = [ms[r, first] / ms[r, second] for r in rounds]
            out = {name: [round(x if not a.integrity else 1 / x, 2) for x in pair]}
            for base in [*baselines, *(["te-read"] if te else [])]:  # its time over ours
                for m in modes[:2]:
                    out[f"{m}_over_{base.replace('-', '_')}_speed"] = [
                        round(ms[r, base] / ms[r, m], 2) for r in rounds
                    ]
            print(json.dumps(out))
            if a.profile:
                profile_loads(a.profile, c, paged, keys, ids)
    finally:
        if plain is not None:
            plain.close()
        store.stop()
        master.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
