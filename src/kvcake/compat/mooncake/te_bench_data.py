"""The bytes ``transfer_engine_bench`` moves and how it checks them: a buffer filled with a
position-dependent pattern (period 251, a prime, so a block landing at a wrong offset shows),
the comparison after a run, and Mooncake's throughput line."""

from __future__ import annotations

import sys
import threading
import time
import zlib

import numpy as np

from kvcake.compat.mooncake.te_bench_flags import PROG, RATE_UNITS, BenchArgs

PERIOD = 251
TARGET_SEED, WRITE_SEED = 7, 101  # the target's initial bytes; what an initiator writes
_CHUNK = PERIOD * 4096


def pattern(offset: int, length: int, seed: int) -> np.ndarray:
    """The pattern's bytes at ``[offset, offset + length)``."""
    pos = np.arange(offset, offset + length, dtype=np.int64)
    return ((pos * 31 + seed) % PERIOD).astype(np.uint8)


def fill(buf: np.ndarray, seed: int, length: int | None = None) -> None:
    """Write the pattern into ``buf[:length]`` (all of it by default), a chunk at a time."""
    n = buf.nbytes if length is None else length
    tile = pattern(0, _CHUNK, seed)
    for start in range(0, n, _CHUNK):
        end = min(n, start + _CHUNK)
        buf[start:end] = tile[: end - start]


def crc32(buf: np.ndarray) -> int:
    return zlib.crc32(buf.data) & 0xFFFFFFFF


def block_offsets(args: BenchArgs, thread: int) -> list[int]:
    """Offsets (in both buffers) of one thread's requests, as Mooncake's initiator lays them out."""
    return [args.block_size * (i * args.threads + thread) for i in range(args.batch_size)]


def verify(args: BenchArgs, local: np.ndarray, seed: int, threads: list[int]) -> int:
    """Bytes of ``local`` checked against the pattern (the blocks of ``threads``); raises
    ``ValueError`` at the first block that differs."""
    checked = 0
    for t in threads:
        for off in block_offsets(args, t):
            got = local[off : off + args.block_size]
            if not np.array_equal(got, pattern(off, args.block_size, seed)):
                raise ValueError(f"block at offset {off} differs from what the target holds")
            checked += args.block_size
    return checked


def rate(args: BenchArgs, nbytes: int, seconds: float) -> str:
    per_s = nbytes / seconds / RATE_UNITS[args.report_unit]
    return f"{per_s:.{args.report_precision}f} {args.report_unit}/s"


def log_info(msg: str) -> None:
    """One glog-style INFO line on stderr, where Mooncake's bench writes its report."""
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
    tid = threading.get_native_id()
    print(f"I{stamp} {tid:>6} {PROG}] {msg}", file=sys.stderr, flush=True)
