"""Transfer Engine throughput and latency (issue 3 goals), two processes on this machine.

A target process (``kvcake transfer-server --metadata``, one /dev/shm segment) and this
initiator process. For each block size (default 4 KB, 64 KB, 1 MB, 16 MB) it runs batches of 16
requests, READ and WRITE, over

- ``tcp``: the Transfer Engine forced to TCP (sliced, pipelined, zero-copy server);
- ``shm``: the Transfer Engine's same-host path (copies through a mapping of the target file);
- ``socket``: baseline, a bare two-process Python socket stream (``sendall``/``recv_into`` of the
  same bytes, one 9-byte command per block, blocks pipelined, one ack per batch);
- ``memmove``: baseline, ``ctypes.memmove`` of the same blocks inside one process.

Blocks sit at non-adjacent target offsets so the engine cannot coalesce them. Each figure is the
median of ``--repeats`` runs (min and max shown); a run moves at least ``--min-bytes`` or
``--min-batches`` batches. Also the 4 KB round-trip latency (``transfer_sync_read``; p50/p99) and
the same round trip over the bare socket.

Then the layer-wise streaming cell (issue 18; ``--stream-layers 0`` skips it): one request's KV
(``--stream-layers`` x ``--stream-blocks`` blocks of ``--stream-block-bytes``) streamed layer by
layer to a target process, a ``transfer()`` per layer (``sync``) or a ``submit()`` per layer and
``wait()`` for all (``async``); with ``--mooncake`` also Mooncake's batch API in the same layout.

``--mooncake PYTHON`` (default: $KVCAKE_MOONCAKE_PYTHON): right after these runs, the real Mooncake
Transfer Engine over TCP in the same topology (``benchmarks/mooncake_peer.py`` run by PYTHON, a
separate venv with ``mooncake-transfer-engine-non-cuda``), then a side-by-side table with
kvcake/Mooncake ratios. Without it (or when PYTHON cannot import mooncake) one line says so and the
ratios use the figure recorded earlier on this machine kind (mooncake-reference.md).

Run: ``kvcake bench transfer`` or ``python benchmarks/transfer_bench.py [--help]``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# The Mooncake peer script doubles as the shared measuring code (it imports neither kvcake nor,
# at import time, Mooncake). A sibling file: ``kvcake bench`` runs us through runpy, which does
# not put this directory on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mooncake_peer as peer

BATCH = peer.BATCH  # one batch size for ours and the peer (peer.calibrate uses it)
# Mooncake 0.3.13 TCP, same topology, recorded earlier (mooncake-reference.md: 0.5-0.8 GB/s at
# 1 MB and above): the upper end, used for ratios when no live peer runs.
MOONCAKE_TCP_REF_GBPS = 0.8

# The baseline peer: one request per block — op byte + u64 length; W: the bytes follow and
# are received into a buffer (an ack byte per batch when asked), R: the bytes are sent back.
BASELINE_PEER = r"""
import socket, struct, sys
size = int(sys.argv[1])
buf = memoryview(bytearray(size))
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
print(ls.getsockname()[1], flush=True)
c, _ = ls.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
head = bytearray(17); hv = memoryview(head)
def fill(v):
    got = 0
    while got < len(v):
        n = c.recv_into(v[got:])
        if not n: sys.exit(0)
        got += n
while True:
    fill(hv)
    op, n, off = head[0], *struct.unpack_from("<QQ", head, 1)
    if op == ord("W"): fill(buf[off : off + n])
    elif op == ord("A"): c.sendall(b"k")
    elif op == ord("R"): c.sendall(buf[off : off + n])
    else: sys.exit(0)
"""


@dataclass
class Row:
    method: str
    op: str
    block: int
    gbps_med: float
    gbps_min: float
    gbps_max: float
    ops_med: float


def fmt_size(n: int) -> str:
    for unit, k in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def parse_sizes(text: str) -> list[int]:
    from kvcake.core.config import parse_size

    return [parse_size(s.strip().upper().replace("B", "") + "iB") for s in text.split(",")]


def measure_all(
    methods: dict[str, Callable[[], None]], block: int, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Seconds per batch for each method and repeat. Repeats are interleaved (A B C D, A B C D,
    ...) so that every method sees the same share of the machine's background load."""
    counts = {m: peer.calibrate(fn, block, args) for m, fn in methods.items()}
    out: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(args.repeats):
        for m, fn in methods.items():
            n = counts[m]
            t = time.perf_counter()
            for _ in range(n):
                fn()
            out[m].append((time.perf_counter() - t) / n)
    return out


def row(method: str, op: str, block: int, per_batch: list[float]) -> Row:
    rates = [block * BATCH / t / 1e9 for t in per_batch]
    med = statistics.median(per_batch)
    return Row(method, op, block, statistics.median(rates), min(rates), max(rates), BATCH / med)


class Target:
    """The target process: a transfer server hosting the directory and one shm segment."""

    def __init__(self, size: int):
        cmd = [
            sys.executable,
            "-m",
            "kvcake",
            "transfer-server",
            "--metadata",
            "--segment",
            f"target:{size}",
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("transfer-server failed to start")
        self.info = json.loads(line)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


class Baseline:
    """The bare-socket ceiling: a Python peer that receives each block into (or sends it from)
    its buffer at the block's target offset, blocking sockets, one connection. Offsets are the
    same as the engine's (``--socket-offsets target``), so both move the same bytes between the
    same memory; ``one`` puts every block at offset 0 (the yardstick before 2026-12-02, whose
    peer side stayed in cache: 1 block of memory instead of 16)."""

    def __init__(self, size: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BASELINE_PEER, str(size)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        port = int(self.proc.stdout.readline())
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def write(self, blocks: list[memoryview], offsets: list[int]) -> None:
        for b, off in zip(blocks, offsets, strict=True):
            self.sock.sendall(b"W" + struct.pack("<QQ", b.nbytes, off))
            self.sock.sendall(b)
        self.sock.sendall(b"A" + bytes(16))
        self._fill(memoryview(bytearray(1)))

    def read(self, blocks: list[memoryview], offsets: list[int]) -> None:
        for b, off in zip(blocks, offsets, strict=True):
            self.sock.sendall(b"R" + struct.pack("<QQ", b.nbytes, off))
        for b in blocks:
            self._fill(b)

    def _fill(self, v: memoryview) -> None:
        got = 0
        while got < v.nbytes:
            got += self.sock.recv_into(v[got:])

    def stop(self) -> None:
        self.sock.close()
        self.proc.wait(20)


def layout(block: int) -> list[tuple[int, int]]:
    """(local offset, target offset) per request: local contiguous, target permuted."""
    return [(i * block, ((i * 5) % BATCH) * block) for i in range(BATCH)]


def engine_runs(engine, local: str, op, block: int, api: str):  # type: ignore[no-untyped-def]
    from kvcake.core.ids import SegmentName
    from kvcake.transfer import TransferRequest

    reqs = [
        TransferRequest(op, SegmentName(local), lo, SegmentName("target"), to, block)
        for lo, to in layout(block)
    ]

    def run_submit() -> None:
        engine.wait(engine.submit(reqs)).raise_for_errors()

    def run_transfer() -> None:
        engine.transfer(reqs).raise_for_errors()

    return run_submit if api == "submit" else run_transfer


def run_all(args: argparse.Namespace) -> tuple[list[Row], dict[str, float]]:
    import numpy as np

    from kvcake.transfer import Op, TransferConfig, TransferEngine

    sizes = parse_sizes(args.sizes)
    top = max(sizes) * BATCH
    target = Target(top)
    base = Baseline(top)
    rows: list[Row] = []
    lat: dict[str, float] = {}
    local = np.zeros(top, dtype=np.uint8)
    local[:] = np.random.default_rng(0).integers(0, 256, top, dtype=np.uint8)
    dst = np.zeros(top, dtype=np.uint8)  # the memmove baseline's other side
    cfg = TransferConfig(
        streams=args.streams, slice_size=args.slice_size, lane_bytes=args.lane_bytes
    )
    tcp = TransferEngine(target.info["directory"], protocol="tcp", config=cfg)
    shm = TransferEngine(target.info["directory"], protocol="auto", config=cfg)
    tcp.register_memory("local-tcp", local)
    shm.register_memory("local-shm", local)
    try:
        for block in sizes:
            views = [memoryview(local)[lo : lo + block] for lo, _ in layout(block)]
            lo_addr = [local.ctypes.data + lo for lo, _ in layout(block)]
            to_addr = [dst.ctypes.data + to for _, to in layout(block)]
            for op in (Op.WRITE, Op.READ):
                name = op.name.lower()
                pairs = list(zip(to_addr, lo_addr, strict=True))
                if op is Op.READ:
                    pairs = [(s_, d_) for d_, s_ in pairs]
                sock_run = base.write if op is Op.WRITE else base.read
                methods = {"tcp": engine_runs(tcp, "local-tcp", op, block, args.api)}
                if not args.skip_shm:
                    methods["shm"] = engine_runs(shm, "local-shm", op, block, args.api)
                offs = [to if args.socket_offsets == "target" else 0 for _, to in layout(block)]
                methods["socket"] = lambda f=sock_run, v=views, o=offs: f(v, o)
                methods["memmove"] = _memmove_fn(pairs, block)
                for m, times in measure_all(methods, block, args).items():
                    rows.append(row(m, name, block, times))
                print(f"  done {fmt_size(block)} {name}", file=sys.stderr, flush=True)
        if args.latency_iters > 0:
            lat.update(round_trips(tcp, shm, base, args.latency_iters))
    finally:
        tcp.close()
        shm.close()
        base.stop()
        target.stop()
    return rows, lat


def round_trips(tcp, shm, base: Baseline, iters: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """4 KB read round trips: p50 and p99 in µs of the engine (tcp, shm) and the bare socket."""
    one = [memoryview(bytearray(4096))]
    runs = {
        "tcp": lambda: tcp.transfer_sync_read("target", "local-tcp", 0, 0, 4096),
        "shm": lambda: shm.transfer_sync_read("target", "local-shm", 0, 0, 4096),
        "socket": lambda: base.read(one, [0]),
    }
    out: dict[str, float] = {}
    for name, fn in runs.items():
        out[f"{name}_read_4k_p50_us"], out[f"{name}_read_4k_p99_us"] = peer.latency(fn, iters)
    return out


def run_stream(args: argparse.Namespace) -> list[dict[str, object]]:
    """Layer-wise streaming of one request's KV to a target process (the layout and timing
    of ``mooncake_peer.run_stream``): ``sync`` = ``transfer()`` per layer, ``async`` = one
    ``submit()`` per layer as it comes, then ``wait()`` for all."""
    import numpy as np

    from kvcake.core.ids import SegmentName
    from kvcake.transfer import Op, TransferConfig, TransferEngine, TransferRequest

    blk = args.block_bytes
    lay = peer.stream_layout(args.layers, args.blocks, blk)
    top = args.layers * args.blocks * blk
    target = Target(top)
    cfg = TransferConfig(
        streams=args.streams, slice_size=args.slice_size, lane_bytes=args.lane_bytes
    )
    engine = TransferEngine(target.info["directory"], protocol="tcp", config=cfg)
    try:
        local = np.random.default_rng(1).integers(0, 256, top, dtype=np.uint8)
        engine.register_memory("kv-src", local)
        src, dst = SegmentName("kv-src"), SegmentName("target")
        batches = [
            [TransferRequest(Op.WRITE, src, lo, dst, to, blk) for lo, to in layer] for layer in lay
        ]

        def sync() -> None:
            for b in batches:
                engine.transfer(b).raise_for_errors()

        def asyn() -> None:
            ids = [engine.submit(b) for b in batches]
            for i in ids:
                engine.wait(i).raise_for_errors()

        rows = []
        for mode, fn in (("sync", sync), ("async", asyn)):
            rows.append(peer.stream_row("kvcake", mode, peer.time_streams(fn, args), args))
            print(f"  done stream {mode}", file=sys.stderr, flush=True)
        lo, to = lay[-1][-1]  # the last block of the last layer landed where it belongs
        back = np.zeros(blk, dtype=np.uint8)
        engine.read_into("target", to, back)
        if not np.array_equal(back, local[lo : lo + blk]):
            raise SystemExit("stream: the target holds different bytes")
    finally:
        engine.close()
        target.stop()
    return rows


def stream_table(rows: list[dict[str, object]]) -> str:
    if not rows:
        return ""
    r0 = rows[0]
    kv = int(r0["layers"]) * int(r0["blocks"]) * int(r0["block_bytes"])  # type: ignore[call-overload]
    lines = [
        f"Layer-wise streaming of one request's KV: {r0['layers']} layers x {r0['blocks']} "
        f"blocks x {fmt_size(int(r0['block_bytes']))} ({kv / 1e6:.1f} MB), TCP, "  # type: ignore[call-overload]
        "ms per request (median, min-max of the repeats):",
        "",
        "| mode | kvcake ms | Mooncake ms | kvcake GB/s | Mooncake GB/s | kvcake/Mooncake |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode in ("sync", "async"):
        k = next((r for r in rows if r["method"] == "kvcake" and r["mode"] == mode), None)
        m = next((r for r in rows if r["method"] == "mooncake" and r["mode"] == mode), None)
        if k is None:
            continue
        kms = f"{k['ms_med']:.1f} ({k['ms_min']:.1f}-{k['ms_max']:.1f})"
        if m is None:
            lines.append(f"| {mode} | {kms} | - | {k['gbps_med']:.2f} | - | - |")
            continue
        mms = f"{m['ms_med']:.1f} ({m['ms_min']:.1f}-{m['ms_max']:.1f})"
        ratio = float(m["ms_med"]) / float(k["ms_med"])  # type: ignore[arg-type]
        lines.append(
            f"| {mode} | {kms} | {mms} | {k['gbps_med']:.2f} | {m['gbps_med']:.2f} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def _memmove_fn(pairs: list[tuple[int, int]], block: int) -> Callable[[], None]:
    move = ctypes.memmove

    def run() -> None:
        for d, s_ in pairs:
            move(d, s_, block)

    return run


def get(rows: list[Row], method: str, op: str, block: int) -> Row | None:
    return next((r for r in rows if (r.method, r.op, r.block) == (method, op, block)), None)


def check_targets(rows: list[Row], lat: dict[str, float]) -> list[tuple[str, str, bool]]:
    out: list[tuple[str, str, bool]] = []
    mb = 1 << 20
    for op in ("write", "read"):
        for block in (mb, 16 * mb):
            t, b = get(rows, "tcp", op, block), get(rows, "socket", op, block)
            if t and b:
                ratio = t.gbps_med / b.gbps_med
                out.append(
                    (f"tcp {op} {fmt_size(block)} >= 80% of socket", f"{ratio:.0%}", ratio >= 0.8)
                )
                out.append(
                    (
                        f"tcp {op} {fmt_size(block)} >= 1.5 GB/s",
                        f"{t.gbps_med:.2f}",
                        t.gbps_med >= 1.5,
                    )
                )
        t = get(rows, "tcp", op, 64 * 1024)
        if t:
            out.append((f"tcp {op} 64 KB >= 0.8 GB/s", f"{t.gbps_med:.2f}", t.gbps_med >= 0.8))
        for block in (mb, 16 * mb):
            s_, m = get(rows, "shm", op, block), get(rows, "memmove", op, block)
            if s_ and m:
                ratio = s_.gbps_med / m.gbps_med
                out.append(
                    (f"shm {op} {fmt_size(block)} >= 70% of memmove", f"{ratio:.0%}", ratio >= 0.7)
                )
    if "tcp_read_4k_p50_us" in lat:
        v = lat["tcp_read_4k_p50_us"]
        out.append(("tcp 4 KB read p50 <= 100 us", f"{v:.0f} us", v <= 100))
    out += issue18_targets(rows, lat)
    for op in ("write", "read"):
        for block in (mb, 16 * mb):
            t, mc = get(rows, "tcp", op, block), get(rows, "mooncake", op, block)
            if t:
                ref, src = (mc.gbps_med, "live") if mc else (MOONCAKE_TCP_REF_GBPS, "recorded")
                ratio = t.gbps_med / ref
                out.append(
                    (
                        f"tcp {op} {fmt_size(block)} >= 2x Mooncake ({src})",
                        f"{ratio:.2f}x",
                        ratio >= 2.0,
                    )
                )
    return out


Goal = tuple[str, float, float, bool]  # (goal, measured ratio, bound, met)


def issue18_goals(rows: list[Row], lat: dict[str, float]) -> list[Goal]:
    """Issue 18: small-block batches >= 1.0x the live Mooncake, >= 1 MB at >= 90% of the same
    run's bare socket, 4 KB sync read p50 <= the socket's and <= 1.5x Mooncake's."""
    out: list[Goal] = []
    for op in ("write", "read"):
        for block in (4 << 10, 64 << 10):
            t, mc = get(rows, "tcp", op, block), get(rows, "mooncake", op, block)
            if t and mc:
                r = t.gbps_med / mc.gbps_med
                out.append(
                    (f"tcp {op} {fmt_size(block)} >= 1.0x Mooncake (live)", r, 1.0, r >= 1.0)
                )
        for block in sorted({r.block for r in rows if r.block >= 1 << 20}):
            t, b = get(rows, "tcp", op, block), get(rows, "socket", op, block)
            if t and b:
                r = t.gbps_med / b.gbps_med
                out.append((f"tcp {op} {fmt_size(block)} >= 90% of socket", r, 0.9, r >= 0.9))
    k, sock, mc_us = (lat.get(f"{m}_read_4k_p50_us") for m in ("tcp", "socket", "mooncake"))
    if k and sock:
        out.append(("tcp 4 KB read p50 <= socket p50 (ratio)", k / sock, 1.0, k <= sock))
    if k and mc_us:
        out.append(("tcp 4 KB read p50 <= 1.5x Mooncake", k / mc_us, 1.5, k <= 1.5 * mc_us))
    return out


def issue18_targets(rows: list[Row], lat: dict[str, float]) -> list[tuple[str, str, bool]]:
    return [
        (desc, f"{v:.0%}" if "socket" in desc and "p50" not in desc else f"{v:.2f}x", ok)
        for desc, v, _bound, ok in issue18_goals(rows, lat)
    ]


def rounds_table(goals: list[list[Goal]]) -> str:
    """The issue-18 goals over every round: each round's ratio and the median (the verdict)."""
    n = len(goals)
    head = " | ".join(f"round {i + 1}" for i in range(n))
    lines = [f"| goal | {head} | median | met |", "|---|" + "---:|" * (n + 1) + "---|"]
    for k, (desc, _v, bound, _ok) in enumerate(goals[0]):
        vals = [g[k][1] for g in goals if len(g) > k and g[k][0] == desc]
        med = statistics.median(vals)
        upper = "<=" in desc
        met = med <= bound if upper else med >= bound
        cells = " | ".join(f"{v:.2f}" for v in vals)
        lines.append(f"| {desc} | {cells} | **{med:.2f}** | {'yes' if met else 'NO'} |")
    return "\n".join(lines)


def side_by_side(rows: list[Row], lat: dict[str, float]) -> str:
    """kvcake TCP next to Mooncake TCP per cell (live peer, else the recorded figure)."""
    live = any(r.method == "mooncake" for r in rows)
    src = "live peer, same run" if live else f"recorded {MOONCAKE_TCP_REF_GBPS} GB/s at 1 MB+"
    lines = [
        f"Side by side with Mooncake over TCP ({src}):",
        "",
        "| op | block | kvcake tcp GB/s | Mooncake GB/s | kvcake/Mooncake |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        if r.method != "tcp":
            continue
        mc = get(rows, "mooncake", r.op, r.block)
        ref = mc.gbps_med if mc else (MOONCAKE_TCP_REF_GBPS if r.block >= 1 << 20 else None)
        if ref is None:
            lines.append(f"| {r.op} | {fmt_size(r.block)} | {r.gbps_med:.2f} | - | - |")
        else:
            lines.append(
                f"| {r.op} | {fmt_size(r.block)} | {r.gbps_med:.2f} | {ref:.2f} | "
                f"{r.gbps_med / ref:.2f}x |"
            )
    k, m = lat.get("tcp_read_4k_p50_us"), lat.get("mooncake_read_4k_p50_us")
    if k and m:
        k99, m99 = lat["tcp_read_4k_p99_us"], lat["mooncake_read_4k_p99_us"]
        lines += [
            "",
            "| 4 KB sync read | kvcake p50/p99 (µs) | Mooncake p50/p99 (µs) | p50 speed-up |",
            "|---|---:|---:|---:|",
            f"| tcp | {k:.0f}/{k99:.0f} | {m:.0f}/{m99:.0f} | {m / k:.2f}x |",
        ]
    return "\n".join(lines)


def run_mooncake(python: str, args: argparse.Namespace) -> tuple[list[Row], dict[str, float]]:
    options = [
        "--sizes",
        ",".join(str(s) for s in parse_sizes(args.sizes)),
        "--repeats",
        str(args.repeats),
        "--min-bytes",
        str(args.min_bytes),
        "--min-batches",
        str(args.min_batches),
        "--repeat-s",
        str(args.repeat_s),
        "--latency-iters",
        str(args.latency_iters),
    ]
    data = peer.run_peer(python, "transfer", options)
    return [Row(**r) for r in data["rows"]], dict(data["latency"])


def _stream_options(args: argparse.Namespace) -> list[str]:
    return [
        "--layers",
        str(args.layers),
        "--blocks",
        str(args.blocks),
        "--block-bytes",
        str(args.block_bytes),
        "--repeats",
        str(args.repeats),
        "--repeat-s",
        str(args.repeat_s),
    ]


def markdown(rows: list[Row], lat: dict[str, float]) -> str:
    lines = [
        "| method | op | block | GB/s median | min | max | op/s median |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.method} | {r.op} | {fmt_size(r.block)} | {r.gbps_med:.2f} | "
            f"{r.gbps_min:.2f} | {r.gbps_max:.2f} | {r.ops_med:,.0f} |"
        )
    lines += ["", "| 4 KB read round trip | p50 (µs) | p99 (µs) |", "|---|---:|---:|"]
    for m in ("tcp", "shm", "socket"):
        if f"{m}_read_4k_p50_us" in lat:
            lines.append(
                f"| {m} | {lat[f'{m}_read_4k_p50_us']:.0f} | {lat[f'{m}_read_4k_p99_us']:.0f} |"
            )
    lines += ["", "| target | measured | met |", "|---|---:|---|"]
    for desc, val, ok in check_targets(rows, lat):
        lines.append(f"| {desc} | {val} | {'yes' if ok else 'NO'} |")
    return "\n".join(lines)


def one_round(args: argparse.Namespace, mc_python: str | None, peer_first: bool) -> dict[str, Any]:
    """kvcake's cells and the live peer's (if any), printed; the round's JSON record."""
    mooncake: dict[str, object] = {"live": False, "reason": "no peer"}
    mc_rows: list[Row] = []
    mc_lat: dict[str, float] = {}
    mc_stream: list[dict[str, object]] = []

    def run_peer() -> None:
        nonlocal mooncake, mc_rows, mc_lat, mc_stream
        if mc_python is None:
            return
        try:
            mc_rows, mc_lat = run_mooncake(mc_python, args)
            if args.layers > 0 and args.blocks > 0:
                mc_stream = peer.run_peer(mc_python, "stream", _stream_options(args))["stream"]
            mooncake = {"live": True, "python": mc_python}
        except RuntimeError as exc:
            print(f"Mooncake live peer failed, ratios use the recorded figures: {exc}")
            mooncake = {"live": False, "reason": str(exc)}

    if peer_first:
        run_peer()
    rows, lat = run_all(args)
    stream = run_stream(args) if args.layers > 0 and args.blocks > 0 else []
    if not peer_first:
        run_peer()
    rows += mc_rows
    lat.update(mc_lat)
    stream += mc_stream
    print(markdown(rows, lat))
    print()
    print(side_by_side(rows, lat))
    if stream:
        print()
        print(stream_table(stream))
    return {
        "rows": [asdict(r) for r in rows],
        "latency": lat,
        "targets": check_targets(rows, lat),
        "issue18": issue18_goals(rows, lat),
        "mooncake": mooncake,
        "stream": stream,
        "peer_first": peer_first,
    }


def main(argv: Sequence[str] | None = None) -> int:
    from kvcake.transfer import TransferConfig

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", default="4K,64K,1M,16M", help="block sizes (default 4K,64K,1M,16M)")
    p.add_argument("--repeats", type=int, default=5, help="repeats per figure (median, min, max)")
    p.add_argument("--min-bytes", type=int, default=512 << 20, help="bytes per repeat (at most)")
    p.add_argument("--min-batches", type=int, default=5, help="batches per repeat at least")
    p.add_argument("--repeat-s", type=float, default=0.5, help="target seconds per repeat")
    p.add_argument(
        "--latency-iters", type=int, default=3000, help="4 KB round trips timed (0 skips them)"
    )
    p.add_argument(
        "--streams", type=int, default=TransferConfig.streams, help="TCP lanes per batch"
    )
    p.add_argument("--slice-size", type=int, default=1 << 20, help="TCP slice size in bytes")
    p.add_argument(
        "--lane-bytes",
        type=int,
        default=TransferConfig.lane_bytes,
        help="a batch opens one more lane (up to --streams) per this many bytes",
    )
    p.add_argument(
        "--api",
        choices=("transfer", "submit"),
        default="transfer",
        help="batch call: transfer() (synchronous batch, first lane in the caller) or "
        "submit()+wait() (lanes handed to the worker pool)",
    )
    p.add_argument("--skip-shm", action="store_true", help="skip the shm transport")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="whole runs, kvcake and the live peer alternating first (ABBA); with > 1 a table "
        "of the issue-18 goals per round and their medians follows (default 1)",
    )
    p.add_argument(
        "--socket-offsets",
        choices=("target", "one"),
        default="target",
        help="bare-socket baseline: blocks at the engine's target offsets (default), or all "
        "at offset 0 (the peer's memory stays in cache; the yardstick before 2026-12-02)",
    )
    p.add_argument(
        "--stream-layers",
        dest="layers",
        type=int,
        default=30,
        help="layer-wise streaming cell: layers of one request (0 skips the cell; default 30)",
    )
    p.add_argument(
        "--stream-blocks",
        dest="blocks",
        type=int,
        default=16,
        help="layer-wise streaming cell: KV blocks of the request (default 16)",
    )
    p.add_argument(
        "--stream-block-bytes",
        dest="block_bytes",
        type=peer.parse_size,
        default=48 * 1024,
        help="layer-wise streaming cell: bytes of one layer of one block (default 48K: K+V "
        "of 32 SmolLM2 tokens in fp32)",
    )
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument(
        "--auth",
        action="store_true",
        help="a random shared secret for the target and this initiator (issue 15 §3): every "
        "TCP connection then passes the HMAC challenge; compare with a run without it",
    )
    peer.add_mooncake_flag(p, "TE")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.auth:  # inherited by the target process; this process's engines read it too
        import secrets

        os.environ["KVCAKE_AUTH_SECRET"] = secrets.token_hex(32)
        print("auth: shared secret on (HMAC challenge per connection)", flush=True)
    # SIGTERM -> SystemExit, so the child processes are stopped by the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.time()
    mc_python, why = peer.probe(args.mooncake)
    if mc_python is None:
        print(f"Mooncake live peer skipped: {why}; ratios use the recorded figures")
    rounds = []
    for i in range(args.rounds):
        if args.rounds > 1:
            print(f"--- round {i + 1} of {args.rounds}", flush=True)
        # Odd rounds run the peer first (ABBA...): drift in the machine's load cancels out.
        rounds.append(one_round(args, mc_python, peer_first=i % 2 == 1))
    if args.rounds > 1:
        print("\nIssue-18 goals over the rounds (ratios; the verdict is the median):\n")
        print(rounds_table([r["issue18"] for r in rounds]))
    print(
        f"\n(api={args.api}, streams={args.streams}, slice_size={args.slice_size}, "
        f"repeats={args.repeats}, rounds={args.rounds}; "
        f"ran {time.time() - t0:.0f} s; load average {os.getloadavg()[0]:.1f} at the end)"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rounds[0] if args.rounds == 1 else {"rounds": rounds}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
