"""``transfer_engine_bench`` (kvcake's stand-in, written by ``kvcake mooncake-shim install``):
Mooncake's Transfer Engine benchmark over kvcake's, through the compat ``TransferEngine``
(:mod:`.engine`), so the segment names and addresses are Mooncake's.

``--mode=target`` registers ``--buffer_size`` bytes (filled with a known pattern), prints its
segment name and waits for SIGINT/SIGTERM; on exit it prints the buffer's CRC-32.
``--mode=initiator`` opens ``--segment_id``, runs ``--threads`` workers that each submit batches
of ``--batch_size`` ``--block_size`` reads or writes (Mooncake's layout: block ``i`` of thread
``t`` at ``block_size * (i * threads + t)``) for ``--duration`` seconds, prints Mooncake's report
line (``Test completed: duration D, batch count N, throughput R GB/s``), then checks the bytes:
a read run compares what arrived with the target's pattern, a write run reads the written blocks
back. A failed transfer or a mismatch exits 1."""

from __future__ import annotations

import signal
import sys
import threading
import time

import numpy as np

from kvcake.compat.mooncake import te_bench_data as D
from kvcake.compat.mooncake.engine import TransferEngine, TransferOpcode
from kvcake.compat.mooncake.te_bench_flags import PROG, BenchArgs, parse
from kvcake.core.errors import KvcakeError


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except KvcakeError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    engine = TransferEngine()
    metadata = args.metadata_server
    if metadata != "P2PHANDSHAKE" and "://" not in metadata:
        metadata = f"etcd://{metadata}"  # as Mooncake: a bare host:port is an etcd server
    if engine.initialize(args.local_server_name, metadata, args.protocol, "") != 0:
        print(f"{PROG}: error: cannot start the Transfer Engine ({metadata})", file=sys.stderr)
        return 1
    buf = np.zeros(args.buffer_size, dtype=np.uint8)
    if engine.register_memory(buf.ctypes.data, buf.nbytes, "cpu:0") != 0:
        print(f"{PROG}: error: cannot register {buf.nbytes} bytes", file=sys.stderr)
        return 1
    try:
        return target(engine, args, buf) if args.mode == "target" else initiator(engine, args, buf)
    finally:
        engine.unregister_memory(buf.ctypes.data)


def target(engine: TransferEngine, args: BenchArgs, buf: np.ndarray) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    D.fill(buf, D.TARGET_SEED)
    host = args.local_server_name.partition(":")[0] or "127.0.0.1"
    name = f"{host}:{engine.get_rpc_port()}"  # Mooncake's P2P segment name
    D.log_info(f"Transfer Engine target ready: --segment_id={name}")
    print(f"{PROG} target segment={name} buffer={buf.nbytes}", flush=True)
    while not stop.wait(0.2):
        pass
    print(f"{PROG} target crc32={D.crc32(buf):08x}", flush=True)
    return 0


def initiator(engine: TransferEngine, args: BenchArgs, buf: np.ndarray) -> int:
    remote = engine.get_first_buffer_address(args.segment_id)
    if remote == 0:
        print(f"{PROG}: error: unable to get target segment {args.segment_id!r}", file=sys.stderr)
        return 1
    if args.operation == "write":
        D.fill(buf, D.WRITE_SEED, args.span)
    run = Run(engine, args, buf.ctypes.data, remote)
    seconds = run.go()
    total = sum(run.batches)
    D.log_info(
        f"Test completed: duration {seconds:.2f}, batch count {total}, throughput "
        + D.rate(args, total * args.batch_size * args.block_size, seconds)
    )
    if run.error:
        print(f"{PROG}: error: transfer failed: {run.error}", file=sys.stderr)
        return 1
    return check(engine, args, buf, remote, [t for t, n in enumerate(run.batches) if n])


def check(
    engine: TransferEngine, args: BenchArgs, buf: np.ndarray, remote: int, threads: list[int]
) -> int:
    """The bytes moved are the right ones: for a write, read the target's back first."""
    seed = D.TARGET_SEED
    if args.operation == "write":
        seed, buf = D.WRITE_SEED, np.zeros(args.span, dtype=np.uint8)  # fresh, unregistered
        if engine.transfer_sync_read(args.segment_id, buf.ctypes.data, remote, args.span) != 0:
            print(f"{PROG}: error: reading the written blocks back failed", file=sys.stderr)
            return 1
    try:
        checked = D.verify(args, buf, seed, threads)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(f"{PROG} verified={checked} operation={args.operation}", flush=True)
    return 0


class Run:
    """The initiator's workers (one thread each, as Mooncake's)."""

    def __init__(self, engine: TransferEngine, args: BenchArgs, local: int, remote: int):
        self.engine, self.args, self.local, self.remote = engine, args, local, remote
        self.running = threading.Event()
        self.batches = [0] * args.threads
        self.error = ""

    def go(self) -> float:
        self.running.set()
        workers = [
            threading.Thread(target=self.worker, args=(t,)) for t in range(self.args.threads)
        ]
        start = time.monotonic()
        for w in workers:
            w.start()
        deadline = start + self.args.duration
        while self.running.is_set() and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        self.running.clear()
        for w in workers:
            w.join()
        return time.monotonic() - start

    def worker(self, thread: int) -> None:
        a = self.args
        offs = D.block_offsets(a, thread)
        locals_ = [self.local + o for o in offs]
        remotes = [self.remote + o for o in offs]
        lengths = [a.block_size] * a.batch_size
        op = TransferOpcode.Read if a.operation == "read" else TransferOpcode.Write
        while self.running.is_set():
            rc = self.engine.batch_transfer_sync(a.segment_id, locals_, remotes, lengths, op)
            if rc != 0:
                self.error = f"batch of thread {thread} returned {rc}"
                self.running.clear()
                return
            self.batches[thread] += 1


if __name__ == "__main__":
    sys.exit(main())
