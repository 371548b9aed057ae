"""The real Mooncake, measured in the same topology as kvcake's transfer and store benchmarks.

Run by the Python of a separate venv that has the Mooncake wheel
(``pip install mooncake-transfer-engine-non-cuda``); it never imports kvcake, and kvcake never
imports Mooncake: ``benchmarks/transfer_bench.py`` and ``benchmarks/store_bench.py`` start this
script with ``--mooncake PYTHON`` and read its JSON.

    PYTHON benchmarks/mooncake_peer.py transfer [--sizes 4K,64K,1M,16M] [--repeats 5] [--json F]
    PYTHON benchmarks/mooncake_peer.py store [--sizes 4KB,64KB,1MB,16MB] [--repeats 5] [--json F]
    PYTHON benchmarks/mooncake_peer.py stream [--layers 30] [--blocks 16] [--block-bytes 48K]

``transfer``: a target process (``TransferEngine`` over TCP, P2PHANDSHAKE metadata, one managed
buffer) and this initiator; batches of 16 blocks at non-adjacent target offsets, READ and WRITE,
``batch_transfer_sync_read/write``; GB/s median/min/max of the repeats (each moves at least
``--min-bytes`` or lasts ``--repeat-s``, at least ``--min-batches`` batches); then the 4 KB
``transfer_sync_read`` round trip p50/p99.

``stream``: layer-wise streaming of one request's KV (``--layers`` batches of ``--blocks``
blocks of ``--block-bytes``, the layout of :func:`stream_layout`) to a target process, per
layer ``batch_transfer_sync_write`` (``sync``) or every layer ``batch_transfer_async_write``
and one ``get_batch_transfer_status`` (``async``); ms per request.

``store``: a ``mooncake_master`` process, a store-server process (``MooncakeDistributedStore``
mounting a ``--segment`` DRAM segment) and this client (no segment); per value size single
``put``/``get`` and ``put_batch``/``get_batch`` of 16; op/s, GB/s, per-call latency p50/p99 and
CPU µs per op summed over the three processes (the same loop as store_bench.py).

All addresses are 127.0.0.1 (Mooncake's own listeners bind every interface; nothing else
connects to them). Every child process is stopped on exit, on an error, on SIGTERM, and (through
PR_SET_PDEATHSIG) when this process dies. JSON goes to stdout (or ``--json FILE``); Mooncake's
logs go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

BATCH = 16
KB, MB = 1024, 1024 * 1024
HERE = os.path.abspath(__file__)
CHILDREN: list[subprocess.Popen[str]] = []
SERVER_PIDS: list[int] = []
TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- processes


def _die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the parent dies (PR_SET_PDEATHSIG = 1)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def start(cmd: list[str], **kw: Any) -> subprocess.Popen[str]:
    proc = subprocess.Popen(cmd, preexec_fn=_die_with_parent, text=True, **kw)
    CHILDREN.append(proc)
    return proc


def terminate(proc: subprocess.Popen[str], grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; a no-op for a process that already ended."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def stop_all() -> None:
    while CHILDREN:
        terminate(CHILDREN.pop(), 10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_ready(proc: subprocess.Popen[str], what: str, timeout: float = 60) -> str:
    """The child's first stdout line (its ready message)."""
    assert proc.stdout is not None
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise RuntimeError(f"{what} did not start within {timeout:.0f} s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{what} exited during start-up (rc={proc.wait()})")
    return line


def cpu_seconds() -> float:
    total = time.process_time()
    for pid in SERVER_PIDS:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(I?B)?\s*", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return int(m.group(1)) * {"": 1, "K": KB, "M": MB, "G": 1 << 30}[m.group(2)]


def parse_sizes(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def mooncake_version() -> str:
    from importlib import metadata

    for dist in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return "unknown"


# ---------------------------------------------------------------- transfer engine


def new_engine() -> Any:
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    rc = engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError(f"TransferEngine.initialize -> {rc}")
    return engine


def role_te_target(size: int) -> int:
    """Child: one managed buffer; prints 'PORT ADDR', lives until stdin closes."""
    engine = new_engine()
    addr = engine.allocate_managed_buffer(size)
    if not addr:
        raise RuntimeError("allocate_managed_buffer failed")
    print(engine.get_rpc_port(), addr, flush=True)
    sys.stdin.read()
    return 0


def layout(block: int) -> list[tuple[int, int]]:
    """(local offset, target offset) per request: local contiguous, target permuted."""
    return [(i * block, ((i * 5) % BATCH) * block) for i in range(BATCH)]


def calibrate(run: Callable[[], None], block: int, args: argparse.Namespace) -> int:
    """Batches per repeat: enough to move ``--min-bytes`` or to last ``--repeat-s`` (whichever
    is fewer), at least ``--min-batches``. Also warms up connections and mappings."""
    run()
    t = time.perf_counter()
    run()
    one = max(time.perf_counter() - t, 1e-6)
    by_bytes = -(-args.min_bytes // (block * BATCH))
    return max(args.min_batches, min(by_bytes, int(args.repeat_s / one)))


def latency(fn: Callable[[], None], iters: int) -> tuple[float, float]:
    for _ in range(min(200, iters)):
        fn()
    samples = []
    for _ in range(iters):
        t = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t)
    samples.sort()
    return samples[len(samples) // 2] / 1e3, samples[int(len(samples) * 0.99)] / 1e3


def run_transfer(args: argparse.Namespace) -> dict[str, Any]:
    sizes = parse_sizes(args.sizes)
    top = max(sizes) * BATCH
    target = start(
        [sys.executable, HERE, "_te-target", str(top)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    port, raddr = map(int, read_ready(target, "Mooncake transfer target").split())
    SERVER_PIDS[:] = [target.pid]
    seg = f"127.0.0.1:{port}"
    engine = new_engine()
    local = engine.allocate_managed_buffer(top)
    if not local:
        raise RuntimeError("allocate_managed_buffer failed")
    pattern = os.urandom(top)
    ctypes.memmove(local, pattern, top)
    rows: list[dict[str, Any]] = []

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} -> {rc}")

    # Correctness once: write 4 KB at the target's end, read it back elsewhere, compare.
    check(engine.transfer_sync_write(seg, local, raddr + top - 4096, 4096), "transfer_sync_write")
    check(engine.transfer_sync_read(seg, local + 4096, raddr + top - 4096, 4096), "read back")
    if ctypes.string_at(local + 4096, 4096) != pattern[:4096]:
        raise RuntimeError("Mooncake read back different bytes")
    ctypes.memmove(local, pattern, top)
    for block in sizes:
        lay = layout(block)
        ptrs = [local + lo for lo, _ in lay]
        peer = [raddr + to for _, to in lay]
        lengths = [block] * BATCH
        for op in ("write", "read"):
            call = (
                engine.batch_transfer_sync_write
                if op == "write"
                else engine.batch_transfer_sync_read
            )

            def run(
                c: Callable[..., int] = call,
                a: tuple[list[int], list[int], list[int]] = (ptrs, peer, lengths),
                what: str = f"batch_transfer_sync_{op}",
            ) -> None:
                check(c(seg, *a), what)

            n = calibrate(run, block, args)
            per_batch = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                for _ in range(n):
                    run()
                per_batch.append((time.perf_counter() - t) / n)
            rates = [block * BATCH / t / 1e9 for t in per_batch]
            rows.append(
                {
                    "method": "mooncake",
                    "op": op,
                    "block": block,
                    "gbps_med": statistics.median(rates),
                    "gbps_min": min(rates),
                    "gbps_max": max(rates),
                    "ops_med": BATCH / statistics.median(per_batch),
                }
            )
            print(f"  mooncake done {block} {op}", file=sys.stderr, flush=True)
    lat: dict[str, float] = {}
    if args.latency_iters > 0:
        p50, p99 = latency(
            lambda: check(engine.transfer_sync_read(seg, local, raddr, 4096), "sync read"),
            args.latency_iters,
        )
        lat = {"mooncake_read_4k_p50_us": p50, "mooncake_read_4k_p99_us": p99}
    return {"rows": rows, "latency": lat}


# ---------------------------------------------------------------- layer-wise streaming


def stream_layout(layers: int, blocks: int, blk: int) -> list[list[tuple[int, int]]]:
    """Per layer, (local offset, target offset) per block of one request's KV: the sender's
    layer is contiguous (layer-major), the receiver's KV pool holds each block's layers
    together (block-major), so a layer's blocks sit ``layers * blk`` apart: no coalescing."""
    return [
        [((lay * blocks + j) * blk, (j * layers + lay) * blk) for j in range(blocks)]
        for lay in range(layers)
    ]


def time_streams(stream: Callable[[], None], args: argparse.Namespace) -> list[float]:
    """Seconds per streamed request, one figure per repeat (each repeat lasts ~--repeat-s)."""
    stream()
    t = time.perf_counter()
    stream()
    n = max(3, int(args.repeat_s / max(time.perf_counter() - t, 1e-6)))
    out = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        for _ in range(n):
            stream()
        out.append((time.perf_counter() - t) / n)
    return out


def stream_row(
    method: str, mode: str, per: list[float], args: argparse.Namespace
) -> dict[str, Any]:
    total = args.layers * args.blocks * args.block_bytes
    med = statistics.median(per)
    return {
        "method": method,
        "mode": mode,
        "layers": args.layers,
        "blocks": args.blocks,
        "block_bytes": args.block_bytes,
        "ms_med": med * 1e3,
        "ms_min": min(per) * 1e3,
        "ms_max": max(per) * 1e3,
        "gbps_med": total / med / 1e9,
    }


def run_stream(args: argparse.Namespace) -> dict[str, Any]:
    """One request's KV, layer by layer (``--layers`` batches of ``--blocks`` blocks of
    ``--block-bytes``), written to a target process: ``sync`` waits for each layer's batch
    (``batch_transfer_sync_write``), ``async`` submits every layer as it comes
    (``batch_transfer_async_write``) and waits for all at the end."""
    lay = stream_layout(args.layers, args.blocks, args.block_bytes)
    top = args.layers * args.blocks * args.block_bytes
    target = start(
        [sys.executable, HERE, "_te-target", str(top)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    port, raddr = map(int, read_ready(target, "Mooncake transfer target").split())
    seg = f"127.0.0.1:{port}"
    engine = new_engine()
    local = engine.allocate_managed_buffer(top)
    if not local:
        raise RuntimeError("allocate_managed_buffer failed")
    ctypes.memmove(local, os.urandom(top), top)
    batches = [
        (
            [local + lo for lo, _ in layer],
            [raddr + to for _, to in layer],
            [args.block_bytes] * len(layer),
        )
        for layer in lay
    ]

    def sync() -> None:
        for b in batches:
            if engine.batch_transfer_sync_write(seg, *b) != 0:
                raise RuntimeError("batch_transfer_sync_write failed")

    def asyn() -> None:
        ids = [engine.batch_transfer_async_write(seg, *b) for b in batches]
        if any(i == 0 for i in ids) or engine.get_batch_transfer_status(ids) != 0:
            raise RuntimeError("batch_transfer_async_write / get_batch_transfer_status failed")

    rows = []
    for mode, fn in (("sync", sync), ("async", asyn)):
        rows.append(stream_row("mooncake", mode, time_streams(fn, args), args))
        print(f"  mooncake done stream {mode}", file=sys.stderr, flush=True)
    return {"stream": rows}


# ---------------------------------------------------------------- store


def new_store(master: str, segment: int, local_buffer: int) -> Any:
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, local_buffer, "tcp", "", master)
    if rc != 0:
        raise RuntimeError(f"MooncakeDistributedStore.setup -> {rc}")
    return store


def role_store_server(master: str, segment: int) -> int:
    """Child: mounts the DRAM segment, prints 'ready', lives until stdin closes."""
    store = new_store(master, segment, 0)
    print("ready", flush=True)
    sys.stdin.read()
    store.close()
    return 0


def start_master() -> tuple[subprocess.Popen[str], str]:
    import mooncake

    binary = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
    rpc = free_port()
    proc = start(
        [
            binary,
            f"--rpc_port={rpc}",
            "--rpc_address=127.0.0.1",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={free_port()}",
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mooncake_master exited (rc={proc.returncode})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", rpc), 0.5):
            return proc, f"127.0.0.1:{rpc}"
        time.sleep(0.1)
    raise RuntimeError("mooncake_master did not listen within 30 s")


def measure(
    run: Callable[[int], None], calls: int, per_call: int
) -> tuple[float, list[float], float]:
    lat = []
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    for i in range(calls):
        t = time.perf_counter()
        run(i)
        lat.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - t0
    ops = calls * per_call
    return ops / elapsed, lat, (cpu_seconds() - c0) / ops


def store_ops(
    client: Any, keys: list[list[str]], value: bytes, batch: int
) -> tuple[Callable[[int], None], Callable[[int], None]]:
    size = len(value)
    if batch == 1:

        def put1(i: int) -> None:
            rc = client.put(keys[i][0], value)
            if rc != 0:
                raise RuntimeError(f"put -> {rc}")

        def get1(i: int) -> None:
            got = client.get(keys[i][0])
            if len(got) != size:
                raise RuntimeError(f"get returned {len(got)} bytes, expected {size}")

        return put1, get1
    values = [value] * batch

    def put(i: int) -> None:
        rc = client.put_batch(keys[i], values)
        if rc != 0:
            raise RuntimeError(f"put_batch -> {rc}")

    def get(i: int) -> None:
        got = client.get_batch(keys[i])
        if any(len(g) != size for g in got):
            raise RuntimeError(f"get_batch returned sizes {[len(g) for g in got]}")

    return put, get


def cell(rates: list[float], lats: list[float], cpus: list[float], size: int) -> dict[str, float]:
    med = statistics.median(rates)
    return {
        "ops_per_s": med,
        "gbps": med * size / 1e9,
        "p50_ms": pct(lats, 0.5) * 1e3,
        "p99_ms": pct(lats, 0.99) * 1e3,
        "cpu_us": statistics.median(cpus) * 1e6,
    }


def run_store(args: argparse.Namespace) -> dict[str, Any]:
    master, addr = start_master()
    server = start(
        [sys.executable, HERE, "_store-server", addr, str(parse_size(args.segment))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    read_ready(server, "Mooncake store server")
    SERVER_PIDS[:] = [master.pid, server.pid]
    labels = [s.strip() for s in args.sizes.split(",") if s.strip()]
    top = max(parse_size(s) for s in labels)
    # The client's local buffer stages put/get bytes: room for a whole batch of the largest.
    client = new_store(addr, 0, max(64 * MB, top * BATCH + 16 * MB))
    rows: list[dict[str, Any]] = []
    try:
        for label in labels:
            size = parse_size(label)
            value = os.urandom(size)
            # Correctness once per size.
            if client.put(f"check/{label}", value) != 0 or client.get(f"check/{label}") != value:
                raise RuntimeError(f"Mooncake put/get of {label} did not round-trip")
            client.remove_all(True)
            for batch in (1, BATCH):
                calls = max(3, min(300, (128 * MB) // (size * batch)))
                acc: dict[str, tuple[list[float], list[float], list[float]]] = {
                    "put": ([], [], []),
                    "get": ([], [], []),
                }
                for r in range(args.repeats):
                    keys = [
                        [f"{label}/{batch}/{r}/{i}/{j}" for j in range(batch)] for i in range(calls)
                    ]
                    fns = dict(
                        zip(("put", "get"), store_ops(client, keys, value, batch), strict=True)
                    )
                    for name in ("put", "get"):
                        rate, lat, cpu = measure(fns[name], calls, batch)
                        acc[name][0].append(rate)
                        acc[name][1].extend(lat)
                        acc[name][2].append(cpu)
                    client.remove_all(True)
                row = {"size": label, "bytes": size, "batch": batch}
                row.update({k: cell(*v, size) for k, v in acc.items()})
                rows.append(row)
                print(
                    f"  mooncake {label:>5} batch={batch:<2} put {row['put']['ops_per_s']:9,.0f} "
                    f"op/s get {row['get']['ops_per_s']:9,.0f} op/s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        client.close()
    return {"rows": rows}


# ---------------------------------------------------------------- driver (used by kvcake's benches)
# These functions run under kvcake's Python: they only start this script under PYTHON.


def add_mooncake_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """The benches' ``--mooncake PYTHON`` option (default $KVCAKE_MOONCAKE_PYTHON)."""
    parser.add_argument(
        "--mooncake",
        metavar="PYTHON",
        default=os.environ.get("KVCAKE_MOONCAKE_PYTHON"),
        help=f"a Python that can import mooncake: also run the real Mooncake {what} right after "
        "ours (default: $KVCAKE_MOONCAKE_PYTHON)",
    )


def probe(python: str | None) -> tuple[str | None, str]:
    """``(PYTHON, "")`` when PYTHON (else $KVCAKE_MOONCAKE_PYTHON) imports Mooncake, else
    ``(None, reason)``."""
    python = python or os.environ.get("KVCAKE_MOONCAKE_PYTHON") or None
    if not python:
        return None, "KVCAKE_MOONCAKE_PYTHON is not set and no --mooncake PYTHON was given"
    try:
        r = subprocess.run(
            [python, "-c", "import mooncake.engine, mooncake.store"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{python} did not run: {exc}"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"{python} cannot import mooncake ({last})"
    return python, ""


def run_peer(python: str, mode: str, options: list[str]) -> dict[str, Any]:
    """Run this script's ``mode`` under ``python``; its progress lines go to our stderr, its
    JSON is returned. Raises RuntimeError (with the tail of its log) when it fails."""
    import collections
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvcake-mooncake-") as tmp:
        out = os.path.join(tmp, "peer.json")
        proc = subprocess.Popen(
            [python, HERE, mode, *options, "--json", out],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_die_with_parent,
        )
        tail: collections.deque[str] = collections.deque(maxlen=25)
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                tail.append(line.rstrip())
                if line.startswith("  mooncake"):
                    print(line, end="", file=sys.stderr, flush=True)
            rc = proc.wait()
        finally:
            terminate(proc, 30)
        if rc != 0 or not os.path.exists(out):
            log = "\n".join(tail)
            raise RuntimeError(f"Mooncake peer failed (rc={rc}); last lines:\n{log}")
        with open(out) as fh:
            data: dict[str, Any] = json.load(fh)
        return data


# ---------------------------------------------------------------- main


@contextlib.contextmanager
def cleanup() -> Iterator[None]:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    try:
        yield
    finally:
        for proc in CHILDREN:
            if proc.stdin:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        stop_all()


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "_te-target":
        return role_te_target(int(argv[1]))
    if argv and argv[0] == "_store-server":
        return role_store_server(argv[1], int(argv[2]))
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("mode", choices=("transfer", "store", "stream"))
    p.add_argument("--sizes", help="transfer: 4K,64K,1M,16M; store: 4KB,64KB,1MB,16MB")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-bytes", type=int, default=512 << 20, help="transfer: bytes per repeat")
    p.add_argument("--min-batches", type=int, default=5, help="transfer: batches per repeat")
    p.add_argument("--repeat-s", type=float, default=0.5, help="transfer: seconds per repeat")
    p.add_argument("--latency-iters", type=int, default=3000, help="transfer: 4 KB round trips")
    p.add_argument("--segment", default="2GiB", help="store: the server's DRAM segment")
    p.add_argument("--layers", type=int, default=30, help="stream: layers of one request")
    p.add_argument("--blocks", type=int, default=16, help="stream: KV blocks of the request")
    p.add_argument(
        "--block-bytes", type=parse_size, default=48 * KB, help="stream: one layer of one block"
    )
    p.add_argument("--json", help="write the JSON here instead of stdout")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.sizes is None:
        args.sizes = "4K,64K,1M,16M" if args.mode == "transfer" else "4KB,64KB,1MB,16MB"
    t0 = time.time()
    with cleanup():
        runner = {"transfer": run_transfer, "store": run_store, "stream": run_stream}[args.mode]
        result = runner(args)
    result.update(
        {
            "mode": args.mode,
            "mooncake_version": mooncake_version(),
            "repeats": args.repeats,
            "seconds": time.time() - t0,
            "loadavg": os.getloadavg()[0],
        }
    )
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
