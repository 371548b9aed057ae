"""What running a cluster as processes on one machine adds to the cluster model: the proxy's
prefill queue as the live proxy holds it, the per-request overheads of the serving path, and
the CPU the live processes share (``kvcake replay --compare-sim``).

The live proxy (``serve.router``) keeps one *gate* per prefill instance: a request takes it,
reserves decode KV, sends the prefill RPC and holds the gate until the instance answers — after
the compute, after every KV write reached the decode instance and after the blocking pool put.
So the next queued request starts ``dispatch_s`` after the previous one's KV is complete, not
when its compute ends (the paper model's prefill FIFO). The first token reaches the client
``first_token_s`` after the answer (proxy -> SSE -> client; plus the request's way in: HTTP,
body parsing, hashing, placement), and every inter-token gap the client sees carries the
serving path's delivery jitter; the paper's TBT (mean of the longest 10% of the gaps) picks up
its tail, ``tbt_extra_s``. These three are measured on the live cluster (``serve.compare_sim``
probes them right before the replay), not fitted to the replay.

Requests sent at the same instant (the Mooncake traces have 3-second timestamps, so requests
come in bursts) reach the gate in an order the event loops decide, not the trace's:
:func:`shuffle_ties` permutes each burst (seeded) and ``compare-sim`` pools several orders.

Shared CPU: an instance whose compute burns CPU (torch: ``threads`` cores while busy; the
emulated backend sleeps, 0) competes for the machine's ``cores``. :func:`cpu_factor` is the
mean-field slowdown ``max(1, demand / cores)`` with ``demand = sum(threads_i * busy_i) +
other_cores`` (``busy_i``: the share of the run instance ``i`` computes, from a first pass);
compute times are multiplied by it (:func:`slowed`). Imports no sockets, no torch: the caller
passes ``os.cpu_count()``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvcake.core.config import require
from kvcake.core.costmodel import CostModel, DecodeCoefficients, PrefillCoefficients
from kvcake.core.trace import TraceRecord


@dataclass(frozen=True)
class LiveHost:
    """The live serving path on one machine, as the simulator models it (times in the
    simulator's own units)."""

    dispatch_s: float = 0.0  # the gate is held this long after the request's KV is complete
    first_token_s: float = 0.0  # answer -> first chunk at the client (+ the way in)
    tbt_extra_s: float = 0.0  # delivery jitter added to every request's TBT
    cpu_slowdown: float = 1.0  # compute times x this (see cpu_factor)

    def __post_init__(self) -> None:
        require(
            self.dispatch_s >= 0 and self.first_token_s >= 0 and self.tbt_extra_s >= 0,
            "LiveHost overheads must be >= 0",
        )
        require(self.cpu_slowdown >= 1, "LiveHost.cpu_slowdown must be >= 1")


def cpu_factor(
    threads: Sequence[float], busy: Sequence[float], cores: int, other_cores: float = 0.0
) -> float:
    """``max(1, (sum(threads_i * busy_i) + other_cores) / cores)``: how much slower each
    CPU-bound process runs when the processes' demand exceeds the machine's cores."""
    require(cores >= 1, "cores must be >= 1")
    require(len(threads) == len(busy), "one busy share per instance")
    demand = sum(t * min(max(b, 0.0), 1.0) for t, b in zip(threads, busy, strict=True))
    return max(1.0, (demand + max(other_cores, 0.0)) / cores)


def slowed(cm: CostModel, factor: float) -> CostModel:
    """``cm`` with every prefill and decode time multiplied by ``factor``."""
    if factor == 1.0:
        return cm
    p, d = cm.prefill, cm.decode
    pre = PrefillCoefficients(p.c0 * factor, p.c1 * factor, p.c2 * factor)
    dec = DecodeCoefficients(d.d0 * factor, d.d1 * factor, d.d2 * factor)
    return replace(cm, prefill=pre, decode=dec)


def shuffle_ties(records: Sequence[TraceRecord], seed: int) -> list[TraceRecord]:
    """``records`` with every run of equal timestamps permuted (seeded); order between
    different timestamps is kept."""
    rng = random.Random(seed)
    out: list[TraceRecord] = []
    i = 0
    while i < len(records):
        j = i
        while j < len(records) and records[j].timestamp_ms == records[i].timestamp_ms:
            j += 1
        burst = list(records[i:j])
        rng.shuffle(burst)
        out += burst
        i = j
    return out


def busy_shares(intervals: Sequence[Sequence[tuple[float, float]]], span: float) -> list[float]:
    """Per instance, the share of ``span`` covered by the union of its busy ``intervals``."""
    out = []
    for ivs in intervals:
        covered, end = 0.0, float("-inf")
        for a, b in sorted(ivs):
            if b <= end:
                continue
            covered += b - max(a, end)
            end = b
        out.append(covered / span if span > 0 else 0.0)
    return out
