"""One transfer cell over time: why its throughput swings between runs (issue 18).

Runs one cell of ``transfer_bench.py`` (16 blocks of ``--block`` at permuted target offsets,
``--op``) back to back for ``--rows`` rows of ``--batches`` batches against ``--peer``:

- ``kvcake``: a ``kvcake transfer-server`` and ``TransferEngine(protocol="tcp")`` (the
  bench's ``tcp`` method);
- ``socket``: the bench's bare Python socket peer (its ``socket`` method).

Per row it prints the µs per batch (mean, p50, p90, max), the CPU µs per batch of the initiator
and of the target process (``/proc/PID/stat``), and ``stacked``: the share of placement samples
(every ``--sample-ms``) in which the initiator's busiest thread and the target's busiest thread
last ran on the same CPU. The summary counts slow rows (mean > 1.5x the median row) and how many
of them were stacked. A slow row with ``stacked`` near 1 is the scheduler keeping both ends on
one vCPU; a slow row with a high target CPU and ``stacked`` near 0 is the sender's kernel copy
running slow (docs/transfer.md, "Why a 64 KB cell still swings").

Run: ``python benchmarks/transfer_phases.py --peer kvcake --op read --block 64K --rows 60``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transfer_bench as tb

CLK = os.sysconf("SC_CLK_TCK")


def stat_fields(path: str) -> list[str]:
    """The fields of a ``/proc/.../stat`` file after the command name (``state`` first)."""
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


def task_stat(pid: int, tid: int) -> tuple[int, int]:
    """(ns on a CPU so far, CPU it last ran on) of one thread; (0, -1) once it is gone.
    ``schedstat``, not ``stat``'s 10 ms ticks: a sample period is about one tick."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            ns = int(f.read().split()[0])
        fields = stat_fields(f"/proc/{pid}/task/{tid}/stat")
    except OSError:
        return 0, -1
    return ns, int(fields[36])


def proc_cpu_s(pid: int) -> float:
    fields = stat_fields(f"/proc/{pid}/stat")
    return (int(fields[11]) + int(fields[12])) / CLK


class Placement:
    """Samples, every ``period_s``, the CPU of each process's busiest thread since the last
    sample; counts samples in which both ran and shared a CPU. Its own thread is left out."""

    def __init__(self, initiator: int, target: int, period_s: float):
        self.pids = (initiator, target)
        self.period_s = period_s
        self.both = 0
        self.same = 0
        self._last: dict[tuple[int, int], int] = {}
        self._stop = threading.Event()
        self._me = 0
        self._thread = threading.Thread(target=self._run, name="placement", daemon=True)
        self._thread.start()

    def take(self) -> float:
        """Share of samples since the last call in which both ends shared a CPU."""
        both, same = self.both, self.same
        self.both = self.same = 0
        return same / both if both else 0.0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _busiest_cpu(self, pid: int) -> int:
        best, cpu = 0, -1
        for name in os.listdir(f"/proc/{pid}/task"):
            tid = int(name)
            if tid == self._me:
                continue
            ticks, where = task_stat(pid, tid)
            delta = ticks - self._last.get((pid, tid), ticks)
            self._last[(pid, tid)] = ticks
            if delta > best:
                best, cpu = delta, where
        return cpu

    def _run(self) -> None:
        self._me = threading.get_native_id()
        while not self._stop.wait(self.period_s):
            a, b = (self._busiest_cpu(p) for p in self.pids)
            if a >= 0 and b >= 0:
                self.both += 1
                self.same += a == b


@dataclass
class PhaseRow:
    mean_us: float
    p50_us: float
    p90_us: float
    max_us: float
    initiator_cpu_us: float
    target_cpu_us: float
    stacked: float


def kvcake_cell(op_name: str, block: int) -> tuple[Callable[[], None], int, Callable[[], None]]:
    import numpy as np

    from kvcake.transfer import Op, TransferEngine

    top = block * tb.BATCH
    target = tb.Target(top)
    local = np.random.default_rng(0).integers(0, 256, top, dtype=np.uint8)
    engine = TransferEngine(target.info["directory"], protocol="tcp")
    engine.register_memory("local", local)
    run = tb.engine_runs(engine, "local", Op[op_name.upper()], block, "transfer")

    def stop() -> None:
        engine.close()
        target.stop()

    return run, target.proc.pid, stop


def socket_cell(op_name: str, block: int) -> tuple[Callable[[], None], int, Callable[[], None]]:
    top = block * tb.BATCH
    base = tb.Baseline(top)
    local = memoryview(bytearray(os.urandom(top)))
    views = [local[lo : lo + block] for lo, _ in tb.layout(block)]
    offsets = [to for _, to in tb.layout(block)]
    fn = base.write if op_name == "write" else base.read
    return lambda: fn(views, offsets), base.proc.pid, base.stop


CELLS = {"kvcake": kvcake_cell, "socket": socket_cell}


def one_row(run: Callable[[], None], n: int, target: int, where: Placement) -> PhaseRow:
    lat = []
    c0, t0 = time.process_time(), proc_cpu_s(target)
    where.take()
    for _ in range(n):
        s = time.perf_counter_ns()
        run()
        lat.append((time.perf_counter_ns() - s) / 1e3)
    stacked = where.take()
    c, t = time.process_time() - c0, proc_cpu_s(target) - t0
    return PhaseRow(
        statistics.fmean(lat),
        tb.peer.pct(lat, 0.5),
        tb.peer.pct(lat, 0.9),
        max(lat),
        c / n * 1e6,
        t / n * 1e6,
        stacked,
    )


def summary(rows: list[PhaseRow]) -> str:
    med = statistics.median(r.mean_us for r in rows)
    slow = [r for r in rows if r.mean_us > 1.5 * med]
    stacked = sum(r.stacked >= 0.5 for r in slow)
    return (
        f"{len(rows)} rows, median row {med:.0f} us/batch; {len(slow)} slow rows "
        f"(> {1.5 * med:.0f} us), {stacked} of them stacked on one CPU"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--peer", choices=sorted(CELLS), default="kvcake", help="what to time")
    p.add_argument("--op", choices=("read", "write"), default="read")
    p.add_argument("--block", default="64K", help="block size, 16 blocks a batch (default 64K)")
    p.add_argument("--rows", type=int, default=60, help="rows to print (default 60)")
    p.add_argument("--batches", type=int, default=2000, help="batches per row (default 2000)")
    p.add_argument("--warmup", type=int, default=200, help="untimed batches first")
    p.add_argument("--sample-ms", type=float, default=10.0, help="placement sampling period")
    p.add_argument("--json", help="also write the rows and the summary to this file")
    args = p.parse_args(argv)
    if args.rows < 1 or args.batches < 1 or args.sample_ms <= 0:
        p.error("--rows and --batches must be >= 1, --sample-ms > 0")
    block = tb.parse_sizes(args.block)[0]
    run, target, stop = CELLS[args.peer](args.op, block)
    where = Placement(os.getpid(), target, args.sample_ms / 1e3)
    rows: list[PhaseRow] = []
    try:
        for _ in range(args.warmup):
            run()
        print("  mean    p50    p90     max  init-cpu  target-cpu  stacked  (us per batch)")
        for _ in range(args.rows):
            r = one_row(run, args.batches, target, where)
            rows.append(r)
            print(
                f"{r.mean_us:6.0f} {r.p50_us:6.0f} {r.p90_us:6.0f} {r.max_us:7.0f} "
                f"{r.initiator_cpu_us:9.0f} {r.target_cpu_us:11.0f} {r.stacked:8.2f}",
                flush=True,
            )
    finally:
        where.stop()
        stop()
    print(summary(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
