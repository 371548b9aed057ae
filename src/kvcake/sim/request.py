"""Per-request simulation state and the per-request metrics it accumulates."""

from __future__ import annotations

import math
from enum import StrEnum

import numpy as np

from kvcake.core.stats import tbt_count, tbt_counts, tbt_of_gaps


class Outcome(StrEnum):
    PENDING = "pending"
    DONE = "done"
    REJECTED = "rejected"  # refused at arrival (no work done)
    REJECTED_AFTER_PREFILL = "rejected-after-prefill"  # per-stage check: the prefill was wasted


class SimRequest:
    """One trace request as it moves through the simulated cluster.

    Decode gaps are kept as arithmetic runs ``(count, first_gap, increment)`` instead of one
    float per token, because a decode batch advances in epochs (see :mod:`kvcake.sim.batch`).
    """

    __slots__ = (
        "arrival",
        "blocks",
        "ctx",
        "decode_inst",
        "finish",
        "first_token",
        "gaps",
        "hit_tokens",
        "kv_ready",
        "last_tok",
        "local_hit_tokens",
        "outcome",
        "output_len",
        "predicted_prefill",
        "prefill_compute",
        "prefill_inst",
        "prefill_start",
        "prompt_len",
        "remaining",
        "rid",
        "transfer",
    )

    def __init__(
        self, rid: int, arrival: float, prompt_len: int, output_len: int, blocks: tuple[int, ...]
    ) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.blocks = blocks
        self.outcome = Outcome.PENDING
        self.prefill_inst = -1
        self.decode_inst = -1
        self.prefill_start = math.nan
        self.first_token = math.nan
        self.kv_ready = math.nan
        self.finish = math.nan
        self.prefill_compute = 0.0
        self.predicted_prefill = 0.0
        self.transfer = 0.0
        self.hit_tokens = 0
        self.local_hit_tokens = 0
        # decode state: tokens still to generate after the first (which prefill produces)
        self.remaining = max(output_len - 1, 0)
        self.ctx = prompt_len + 1
        self.last_tok = math.nan
        self.gaps: list[tuple[int, float, float]] = []

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def queue_time(self) -> float:
        return self.prefill_start - self.arrival

    def tbt(self) -> float:
        """The paper's TBT (core.stats: mean of the longest 10% of gaps); NaN without gaps."""
        return tbt_from_runs(self.gaps)


def tbt_from_runs(runs: list[tuple[int, float, float]]) -> float:
    """:func:`kvcake.core.stats.tbt_of_gaps` of gaps stored as arithmetic runs
    ``(count, first gap, increment)``; NaN without gaps."""
    total = sum(n for n, _, _ in runs)
    if len(runs) == 1 and runs[0][2] >= 0 and total:
        n, g0, inc = runs[0]
        k = tbt_count(total)
        # the k largest of an increasing run are its last k: closed form
        return g0 + inc * (n - 1 - (k - 1) / 2.0)
    if not total:
        return tbt_of_gaps([])
    arr = np.array(runs, dtype=float)
    counts = arr[:, 0].astype(np.int64)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    k_in_run = np.arange(total) - starts
    return tbt_of_gaps(np.repeat(arr[:, 1], counts) + np.repeat(arr[:, 2], counts) * k_in_run)


def tbt_many(run_lists: list[list[tuple[int, float, float]]]) -> np.ndarray:
    """:func:`tbt_from_runs` for many requests in one vectorised pass (expands every gap once,
    sorts by (request, gap), and sums each request's top ``ceil(10%)`` with a cumulative sum)."""
    nreq = len(run_lists)
    out = np.full(nreq, np.nan)  # no gaps, no TBT
    flat = [run for runs in run_lists for run in runs]
    if not flat:
        return out
    arr = np.array(flat, dtype=float)
    counts = arr[:, 0].astype(np.int64)
    run_req = np.repeat(np.arange(nreq), [len(r) for r in run_lists])
    # A request's top k gaps are among the top k of each of its runs, and a run is monotonic:
    # expand only its last k gaps (first k if it decreases). Same result, far fewer gaps.
    req_gaps = np.bincount(run_req, weights=counts, minlength=nreq).astype(np.int64)
    k_run = tbt_counts(req_gaps)[run_req]
    keep = np.minimum(counts, k_run)
    first = arr[:, 1] + arr[:, 2] * np.where(arr[:, 2] >= 0, counts - keep, 0)
    counts = keep
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    gaps = np.repeat(first, counts) + np.repeat(arr[:, 2], counts) * (np.arange(total) - starts)
    gap_req = np.repeat(run_req, counts)
    # one float key per gap, ordered by (request, gap): request id + gap scaled into [0, 1)
    # (argsort of one float array is several times faster than lexsort of two)
    span = float(gaps.max() - gaps.min()) * 1.0001 + 1e-12
    key = gap_req + (gaps - gaps.min()) / span
    sorted_gaps = gaps[np.argsort(key)]
    per_req = np.bincount(gap_req, minlength=nreq)
    k = np.minimum(tbt_counts(req_gaps), per_req)
    end = np.cumsum(per_req)
    csum = np.concatenate(([0.0], np.cumsum(sorted_gaps)))
    has = per_req > 0
    out[has] = (csum[end[has]] - csum[end[has] - k[has]]) / k[has]
    return out
