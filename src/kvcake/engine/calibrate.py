"""Profile a backend and fit ``core.costmodel`` coefficients (``kvcake calibrate``).

Prefill is timed over a grid of (prompt length, cached prefix length): the prefix is computed
first (untimed), then the suffix prefill is timed. Decode iterations are timed over (batch size,
context per sequence); decode time does not depend on the KV values, so sequences start from
allocated blocks with ``num_computed = context`` instead of a slow real prefill.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvcake.core.api import SamplingParams
from kvcake.core.costmodel import CostModel, fit_decode, fit_prefill
from kvcake.core.ids import RequestId
from kvcake.engine.backend import DecodeSeq, EngineBackend

GREEDY = SamplingParams(max_tokens=1)


@dataclass(frozen=True)
class Grid:
    prefill: tuple[tuple[int, int], ...]  # (prompt_len, prefix_len)
    decode: tuple[tuple[int, int], ...]  # (batch, context per sequence)
    repeats: int = 3


TORCH_GRID = Grid(
    prefill=((32, 0), (128, 0), (256, 0), (384, 0), (512, 0), (512, 256), (512, 448), (768, 512)),
    decode=((1, 64), (1, 512), (2, 256), (4, 64), (4, 512), (8, 64), (8, 256)),
    repeats=2,
)
EMULATED_GRID = Grid(
    prefill=((512, 0), (1024, 0), (2048, 0), (4096, 0), (4096, 2048), (8192, 4096)),
    decode=((1, 1024), (8, 1024), (16, 2048), (32, 512), (32, 4096)),
    repeats=2,
)


def _tokens(n: int, vocab: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(100, vocab, n)]


def time_prefill(be: EngineBackend, prompt_len: int, prefix_len: int, vocab: int) -> float:
    toks = _tokens(prompt_len, vocab, seed=prompt_len)
    table = be.allocate_blocks(be.blocks_needed(prompt_len))
    try:
        if prefix_len:
            be.prefill(toks[:prefix_len], table, 0, GREEDY)
        t0 = time.perf_counter()
        be.prefill(toks, table, prefix_len, GREEDY)
        return time.perf_counter() - t0
    finally:
        be.free_blocks(table)


def time_decode(be: EngineBackend, batch: int, context: int, steps: int = 3) -> float:
    """Median time of one decode iteration over ``batch`` sequences of ``context`` tokens."""
    tables = [be.allocate_blocks(be.blocks_needed(context + steps + 1)) for _ in range(batch)]
    try:
        seqs = [DecodeSeq(RequestId(f"cal{i}"), t, context, 100) for i, t in enumerate(tables)]
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            be.decode(seqs)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        for t in tables:
            be.free_blocks(t)


def calibrate(
    be: EngineBackend,
    grid: Grid,
    vocab: int,
    progress: Callable[[str], None] | None = None,
) -> CostModel:
    """Measure ``grid`` on ``be`` and return its cost model with fitted coefficients and
    ``fit_error`` (mean relative error of each fit)."""
    say = progress or (lambda _msg: None)
    time_prefill(be, grid.prefill[0][0], 0, vocab)  # warm-up (allocations, lazy init)
    pre: list[tuple[int, int, float]] = []
    for L, P in grid.prefill:
        t = statistics.median(time_prefill(be, L, P, vocab) for _ in range(grid.repeats))
        pre.append((L, P, t))
        say(f"prefill L={L:5d} P={P:5d}: {t * 1000:9.2f} ms")
    dec: list[tuple[int, int, float]] = []
    for b, c in grid.decode:
        t = time_decode(be, b, c, steps=grid.repeats + 1)
        dec.append((b, b * (c + 1), t))
        say(f"decode batch={b:3d} ctx={c:5d}: {t * 1000:9.2f} ms")
    pc, pe = fit_prefill(pre)
    dc, de = fit_decode(dec)
    return be.cost_model.with_coefficients(pc, dc, {"prefill": pe, "decode": de})


def grid_fits_memory(be: EngineBackend, grid: Grid) -> bool:
    need = max(
        [be.blocks_needed(L) for L, _ in grid.prefill]
        + [b * be.blocks_needed(c + grid.repeats + 2) for b, c in grid.decode]
    )
    return need <= be.layout.num_blocks
