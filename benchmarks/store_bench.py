"""Store benchmark: master + one store-server process + one client that mounts no memory.

Values of 4 KB / 64 KB / 1 MB / 16 MB; single ops and batches of 16; put and get op/s and GB/s
(median of --repeats) and per-call latency p50/p99; side by side with the Mooncake 0.3.13 figures
measured in the same topology on this machine kind (docs: issue 4, mooncake-reference.md).

    python benchmarks/store_bench.py [--protocol auto|tcp] [--repeats 5] [--mooncake PYTHON]
    kvcake bench store -- --protocol tcp

``--mooncake PYTHON`` (default: $KVCAKE_MOONCAKE_PYTHON): right after kvcake's runs, the real
Mooncake store in the same topology (mooncake_master + a store-server process + a client with no
segment; ``benchmarks/mooncake_peer.py`` run by PYTHON, a separate venv with
``mooncake-transfer-engine-non-cuda``), same sizes, repeats and loop; the table's Mooncake columns
and ratios then come from that live run. Without it (or when PYTHON cannot import mooncake) one
line says so and the recorded figures below are used.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# The Mooncake peer script doubles as the shared measuring code (it imports neither kvcake nor,
# at import time, Mooncake). A sibling file: ``kvcake bench`` runs us through runpy, which does
# not put this directory on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mooncake_peer as peer

KB, MB = 1024, 1024 * 1024
SIZES = {"4KB": 4 * KB, "64KB": 64 * KB, "1MB": MB, "16MB": 16 * MB}
# Mooncake 0.3.13, same topology (op/s): (single put, single get, batch put, batch get)
MOONCAKE = {
    "4KB": (2741, 4517, 51715, 7708),
    "64KB": (1701, 2484, 61311, 4373),
    "1MB": (564, 420, 6143, 428),
    "16MB": (26, 55, 41, 14),
}
BATCH = 16


@dataclass
class Cell:
    ops_per_s: float
    gbps: float
    p50_ms: float
    p99_ms: float
    cpu_us: float  # CPU time per op summed over client, master and store-server processes


def spawn(args: list[str], ready: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcake", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if line.startswith(ready):
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            return proc, dict(re.findall(r"(\w+)=(\S*)", line))
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit(f"kvcake {args[0]} did not start")


def _ops(
    client: Any, keys: list[list[str]], value: bytes, batch: int
) -> tuple[Callable[[int], None], Callable[[int], None]]:
    if batch == 1:
        return (lambda i: client.put(keys[i][0], value)), (lambda i: client.get(keys[i][0]))

    def put(i: int) -> None:
        errs = client.batch_put(keys[i], [value] * batch)
        assert not any(errs), errs

    def get(i: int) -> None:
        got = client.batch_get(keys[i])
        assert all(isinstance(g, bytearray) for g in got), got

    return put, get


def bench_cell(
    client: object, label: str, size: int, batch: int, repeats: int
) -> tuple[Cell, Cell]:
    from kvcake.store.client import Client

    assert isinstance(client, Client)
    value = os.urandom(size)
    calls = max(3, min(300, (128 * MB) // (size * batch)))
    put_rates: list[float] = []
    get_rates: list[float] = []
    put_lat: list[float] = []
    get_lat: list[float] = []
    put_cpu: list[float] = []
    get_cpu: list[float] = []
    for r in range(repeats):
        keys = [[f"{label}/{batch}/{r}/{i}/{j}" for j in range(batch)] for i in range(calls)]
        put, get = _ops(client, keys, value, batch)
        rate, lat, cpu = peer.measure(put, calls, batch)
        put_rates.append(rate)
        put_lat += lat
        put_cpu.append(cpu)
        rate, lat, cpu = peer.measure(get, calls, batch)
        get_rates.append(rate)
        get_lat += lat
        get_cpu.append(cpu)
        client.remove_all(force=True)
    cells = []
    for rates, lats, cpus in ((put_rates, put_lat, put_cpu), (get_rates, get_lat, get_cpu)):
        med = statistics.median(rates)
        p50, p99 = peer.pct(lats, 0.5) * 1e3, peer.pct(lats, 0.99) * 1e3
        cells.append(Cell(med, med * size / 1e9, p50, p99, statistics.median(cpus) * 1e6))
    return cells[0], cells[1]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--protocol", choices=["auto", "tcp"], default="auto")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", default=",".join(SIZES), help="subset of 4KB,64KB,1MB,16MB")
    ap.add_argument("--segment", default="2GiB", help="store-server DRAM segment size")
    ap.add_argument(
        "--no-tune-malloc",
        action="store_true",
        help="client keeps glibc's default malloc thresholds (see kvcake.store.memtune)",
    )
    ap.add_argument(
        "--integrity",
        action="store_true",
        help="the cost of checksums: the same cells with client.verify on and off, "
        "interleaved (one client each, same master and node); prints on/off ratios",
    )
    ap.add_argument(
        "--slice",
        type=int,
        default=16,
        help="with --integrity: operations per slice, slices alternating between the two "
        "modes (0: a whole round per mode)",
    )
    peer.add_mooncake_flag(ap, "store")
    args = ap.parse_args(argv)
    from kvcake.store.client import Client

    if args.integrity:
        return integrity_cost(args)

    mc_python, why = peer.probe(args.mooncake)
    if mc_python is None:
        print(f"Mooncake live peer skipped: {why}; ratios use the recorded figures", flush=True)

    master, minfo = spawn(["master", "--port", "0", "--http-port", "-1"], "master")
    node, _ = spawn(
        ["store-server", "--master", minfo["rpc"], "--segment-size", args.segment], "store-server"
    )
    peer.SERVER_PIDS[:] = [master.pid, node.pid]
    try:
        client = Client(
            master=minfo["rpc"], protocol=args.protocol, tune_malloc=not args.no_tune_malloc
        )
        rows = []
        for label in args.sizes.split(","):
            size = SIZES[label]
            for batch in (1, BATCH):
                put, get = bench_cell(client, label, size, batch, args.repeats)
                rows.append((label, batch, put, get))
                print(
                    f"  {label:>5} batch={batch:<2} put {put.ops_per_s:9,.0f} op/s "
                    f"get {get.ops_per_s:9,.0f} op/s",
                    flush=True,
                )
        client.close()
    finally:
        for p in (node, master):
            p.terminate()
            p.wait(10)
    live: dict[tuple[str, int], tuple[Cell, Cell]] = {}
    if mc_python is not None:
        try:
            live = run_mooncake(mc_python, args)
        except RuntimeError as exc:
            print(f"Mooncake live peer failed, ratios use the recorded figures: {exc}")
    print_table(rows, args, live)
    return 0


def integrity_cost(args: argparse.Namespace) -> int:
    """Verification on vs off (docs/store.md, "Integrity"; benchmarks/integrity_cost.py)."""
    import integrity_cost as ic

    from kvcake.store.client import Client

    master, minfo = spawn(["master", "--port", "0", "--http-port", "-1"], "master")
    node, _ = spawn(
        ["store-server", "--master", minfo["rpc"], "--segment-size", args.segment], "store-server"
    )
    peer.SERVER_PIDS[:] = [master.pid, node.pid]
    kw = {"master": minfo["rpc"], "protocol": args.protocol}
    clients = {v: Client(verify=v, **kw) for v in (True, False)}  # type: ignore[arg-type]
    print(
        f"integrity cost, protocol={args.protocol}, {args.repeats} rounds, slices of "
        f"{args.slice or 'a whole round'} operations alternating between the modes"
    )
    print(
        "ratios: time without verification over time with it (1.0x = free); cpu: the same "
        "for CPU time of client + master + node"
    )
    print(ic.HEADER, flush=True)
    try:
        for label in args.sizes.split(","):
            for batch in (1, BATCH):
                got = ic.cell(clients, label, SIZES[label], batch, args.repeats, args.slice)
                print(ic.report(label, batch, got), flush=True)
    finally:
        for c in clients.values():
            c.close()
        for p in (node, master):
            p.terminate()
            p.wait(10)
    return 0


def run_mooncake(python: str, args: argparse.Namespace) -> dict[tuple[str, int], tuple[Cell, Cell]]:
    """The live Mooncake cells, keyed by (size label, batch)."""
    options = ["--sizes", args.sizes, "--repeats", str(args.repeats), "--segment", args.segment]
    data = peer.run_peer(python, "store", options)
    return {
        (r["size"], int(r["batch"])): (Cell(**r["put"]), Cell(**r["get"])) for r in data["rows"]
    }


def goals(
    rows: list[tuple[str, int, Cell, Cell]],
    args: argparse.Namespace,
    ref: Callable[[str, int], tuple[float, float]],
) -> list[tuple[str, str, bool]]:
    """Issue 4: default path >= 1.0x Mooncake in every cell and >= 5x on gets of 1 MB+;
    --protocol tcp >= 1.0x on single ops."""
    out = []
    for label, batch, put, get in rows:
        mp, mg = ref(label, batch)
        mode = "single" if batch == 1 else f"batch {batch}"
        for op, cell, m in (("put", put, mp), ("get", get, mg)):
            ratio = cell.ops_per_s / m
            if args.protocol == "auto":
                need = 5.0 if op == "get" and SIZES[label] >= MB else 1.0
            elif batch == 1:
                need = 1.0
            else:
                continue
            out.append(
                (f"{label} {mode} {op} >= {need:g}x Mooncake", f"{ratio:.2f}x", ratio >= need)
            )
    return out


def print_table(
    rows: list[tuple[str, int, Cell, Cell]],
    args: argparse.Namespace,
    live: dict[tuple[str, int], tuple[Cell, Cell]] | None = None,
) -> None:
    live = live or {}

    def ref(label: str, batch: int) -> tuple[float, float]:
        if (label, batch) in live:
            p, g = live[(label, batch)]
            return p.ops_per_s, g.ops_per_s
        r = MOONCAKE[label]
        return (r[0], r[1]) if batch == 1 else (r[2], r[3])

    load = os.getloadavg()
    print(
        f"\nkvcake store, protocol={args.protocol}, tune_malloc={not args.no_tune_malloc}, median of {args.repeats} repeats "
        f"(latency per call: one op, or one batch of {BATCH}); load average "
        f"{load[0]:.1f}/{load[1]:.1f} on {os.cpu_count()} CPUs; Mooncake columns: "
        + ("live peer, same run, run right after kvcake" if live else "recorded figures")
        + "\n"
    )
    print(
        "| size | mode | put op/s | put GB/s | put p50/p99 ms | put CPU µs/op | Mooncake put "
        "| ratio | get op/s | get GB/s | get p50/p99 ms | get CPU µs/op | Mooncake get | ratio |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, batch, put, get in rows:
        mp, mg = ref(label, batch)
        mode = "single" if batch == 1 else f"batch {batch}"
        print(
            f"| {label} | {mode} | {put.ops_per_s:,.0f} | {put.gbps:.2f} | "
            f"{put.p50_ms:.2f}/{put.p99_ms:.2f} | {put.cpu_us:,.0f} | {mp:,.0f} | "
            f"{put.ops_per_s / mp:.2f}x | {get.ops_per_s:,.0f} | {get.gbps:.2f} | "
            f"{get.p50_ms:.2f}/{get.p99_ms:.2f} | {get.cpu_us:,.0f} | {mg:,.0f} | "
            f"{get.ops_per_s / mg:.2f}x |"
        )
    if live:
        print(
            "\nMooncake (live, same topology): \n\n"
            "| size | mode | put op/s | put GB/s | put p50/p99 ms | put CPU µs/op "
            "| get op/s | get GB/s | get p50/p99 ms | get CPU µs/op |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label, batch, _, _ in rows:
            if (label, batch) not in live:
                continue
            put, get = live[(label, batch)]
            mode = "single" if batch == 1 else f"batch {batch}"
            print(
                f"| {label} | {mode} | {put.ops_per_s:,.0f} | {put.gbps:.2f} | "
                f"{put.p50_ms:.2f}/{put.p99_ms:.2f} | {put.cpu_us:,.0f} | "
                f"{get.ops_per_s:,.0f} | {get.gbps:.2f} | "
                f"{get.p50_ms:.2f}/{get.p99_ms:.2f} | {get.cpu_us:,.0f} |"
            )
    print("\n| goal | kvcake/Mooncake | met |\n|---|---:|---|")
    for desc, val, ok in goals(rows, args, ref):
        print(f"| {desc} | {val} | {'yes' if ok else 'NO'} |")


if __name__ == "__main__":
    sys.exit(main())
