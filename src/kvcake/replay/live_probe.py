"""Measure the live serving path's overheads right before a ``--compare-sim`` replay.

A probe is one warm-up request, then a burst of ``k`` equal requests (fresh prompts: no prefix
shared with anything) sent at once through the proxy, with the replayer's own code. The same
records are simulated without overheads; the differences are what the simulator lacks
(:class:`kvcake.sim.livehost.LiveHost`):

* ``dispatch_s``: median gap between successive first tokens of the burst (each one waited for
  the previous one's whole service at the proxy's gate) minus the simulated gap;
* ``first_token_s``: the first TTFT of the burst minus the simulated one and ``dispatch_s``
  (the request's way in and the first token's way out);
* ``tbt_extra_s``: median TBT of the burst minus the simulated one (delivery jitter).

All in real seconds; measured under whatever else the machine is doing at that moment.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kvcake.core.trace import TRACE_BLOCK_TOKENS, TraceRecord
from kvcake.replay.runner import ReplayOptions, ReplaySummary, run_replay

PROBE_HASH_BASE = 1 << 40  # hash ids no trace uses: probe prompts share nothing


@dataclass(frozen=True)
class Overheads:
    dispatch_s: float
    first_token_s: float
    tbt_extra_s: float
    burst: int
    prompt_tokens: int

    def as_dict(self) -> dict[str, float]:
        return {"dispatch_s": self.dispatch_s, "first_token_s": self.first_token_s,
                "tbt_extra_s": self.tbt_extra_s}  # fmt: skip


def probe_records(burst: int, blocks: int, output: int, tag: int = 0) -> list[TraceRecord]:
    """``burst`` requests at t=0, ``blocks`` trace blocks each, no shared block."""
    out = []
    for i in range(burst):
        base = PROBE_HASH_BASE + (tag * 1000 + i) * blocks
        ids = tuple(range(base, base + blocks))
        out.append(TraceRecord(0.0, blocks * TRACE_BLOCK_TOKENS, output, ids))
    return out


def overheads(
    measured: ReplaySummary, simulated: tuple[np.ndarray, np.ndarray], prompt_tokens: int
) -> Overheads:
    """Overheads from a measured burst and the simulated ``(ttft, tbt)`` of the same records."""
    ok = [r for r in measured.per_request if r.status == "ok" and r.ttft_s is not None]
    if len(ok) < 2:
        why = next((r.error for r in measured.per_request if r.error), "no tokens streamed")
        raise RuntimeError(f"the probe burst did not complete ({len(ok)} of "
                           f"{len(measured.per_request)} requests ok: {why})")  # fmt: skip
    ft = sorted((r.sent_s or 0.0) + (r.ttft_s or 0.0) for r in ok)
    sim_ttft, sim_tbt = (np.sort(a[~np.isnan(a)]) for a in simulated)
    gap_m = statistics.median(np.diff(ft))
    gap_s = statistics.median(np.diff(sim_ttft)) if sim_ttft.size > 1 else 0.0
    dispatch = max(0.0, gap_m - gap_s)
    first = max(0.0, min(r.ttft_s or 0.0 for r in ok) - float(sim_ttft[0]) - dispatch)
    tbts = [r.tbt_s for r in ok if r.tbt_s is not None]
    # (one-token requests have no TBT on either side: None measured, NaN simulated)
    tbt = max(0.0, statistics.median(tbts) - float(np.median(sim_tbt))) \
        if tbts and sim_tbt.size else 0.0  # fmt: skip
    return Overheads(dispatch, first, tbt, len(ok), prompt_tokens)


def run_probe(
    opts: ReplayOptions,
    simulate: Callable[[list[TraceRecord], ReplaySummary], tuple[np.ndarray, np.ndarray]],
    *,
    burst: int = 4,
    blocks: int = 8,
    output: int = 32,
) -> Overheads:
    """Warm up, send the burst, simulate it (``simulate(records, summary)`` -> real-second
    ``(ttft, tbt)`` arrays without overheads) and return the differences."""
    popts = replace(opts, max_output=output)
    asyncio.run(run_replay(probe_records(1, blocks, output, tag=1), popts))  # warm-up
    recs = probe_records(burst, blocks, output, tag=2)
    summary = asyncio.run(run_replay(recs, popts))
    tokens = summary.per_request[0].prompt_tokens
    return overheads(summary, simulate(recs, summary), tokens)
