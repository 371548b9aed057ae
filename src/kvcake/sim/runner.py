"""Run one simulation: replay trace records through a cluster model and collect metrics."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from kvcake.core.trace import TraceRecord
from kvcake.sim.config import SimConfig
from kvcake.sim.events import EventQueue, Prio
from kvcake.sim.livehost import LiveHost
from kvcake.sim.metrics import SimResult
from kvcake.sim.mooncake import MooncakeCluster
from kvcake.sim.pooled import PooledCluster
from kvcake.sim.request import SimRequest
from kvcake.sim.sched import Scheduler
from kvcake.sim.vllm import VLLMCluster


class Cluster(Protocol):
    finished: list[SimRequest]

    def arrive(self, now: float, req: SimRequest) -> None: ...

    def loads(self, now: float) -> tuple[float, float]: ...


ClusterFactory = Callable[[SimConfig, EventQueue, Scheduler | None], Cluster]
# ``(period s, fn(now, cluster))``: run every period while requests remain.
Observer = tuple[float, Callable[[float, Cluster], None]]


def _factory(system: str) -> ClusterFactory:
    if system == "mooncake":
        return MooncakeCluster
    if system == "mooncake-pool":
        return PooledCluster

    return VLLMCluster


def to_requests(records: Sequence[TraceRecord], speedup: float = 1.0) -> list[SimRequest]:
    if not records:
        return []
    t0 = min(r.timestamp_ms for r in records)
    return [
        SimRequest(
            i, (r.timestamp_ms - t0) / 1000.0 / speedup, r.input_length, r.output_length, r.hash_ids
        )
        for i, r in enumerate(records)
    ]


def simulate(
    records: Sequence[TraceRecord],
    cfg: SimConfig,
    *,
    scheduler: Scheduler | None = None,
    observers: Sequence[Observer] = (),
    live: LiveHost | None = None,
) -> SimResult:
    """Replay ``records`` (timestamps re-based to the first one, divided by ``cfg.speedup``).

    ``observers`` are ``(interval_s, fn(now, cluster))`` callbacks run periodically while
    requests remain (e.g. replica counting). ``live``: model the live serving path on one
    machine too (:mod:`kvcake.sim.livehost`; the live-path model, ``fetch_source = "pool"``)."""
    wall = time.perf_counter()
    eq = EventQueue()
    kind = (
        "mooncake-pool" if cfg.system == "mooncake" and cfg.fetch_source == "pool" else cfg.system
    )
    if live is not None:
        if kind != "mooncake-pool":
            raise ValueError("live= needs system 'mooncake' with fetch_source 'pool'")

        cluster: Cluster = PooledCluster(cfg, eq, scheduler, live)
    else:
        cluster = _factory(kind)(cfg, eq, scheduler)
    reqs = to_requests(records, cfg.speedup)
    result_load = SimResult.from_requests([]).load
    for r in reqs:  # the heap orders them; ties keep trace order
        eq.schedule(r.arrival, Prio.ARRIVAL, cluster.arrive, r)
    n = len(reqs)

    def sample(now: float, _: None) -> None:
        pl, dl = cluster.loads(now)
        result_load.t.append(now)
        result_load.prefill.append(pl)
        result_load.decode.append(dl)
        if len(cluster.finished) < n:
            eq.schedule(now + cfg.sample_interval_s, Prio.SAMPLE, sample)

    def observe(
        interval: float, fn: Callable[[float, Cluster], None]
    ) -> Callable[[float, None], None]:
        def run(now: float, _: None) -> None:
            fn(now, cluster)
            if len(cluster.finished) < n:
                eq.schedule(now + interval, Prio.SAMPLE, run)

        return run

    if n:
        eq.schedule(0.0, Prio.SAMPLE, sample)
        for interval, fn in observers:
            eq.schedule(0.0, Prio.SAMPLE, observe(interval, fn))
    eq.run()
    res = SimResult.from_requests(reqs)
    if live is not None and live.tbt_extra_s:  # the client sees every gap run through the path
        res.tbt[res.tbt > 0] += live.tbt_extra_s
    res.load = result_load
    res.events = eq.processed
    res.sim_end_s = eq.now
    res.wall_s = time.perf_counter() - wall
    res.extra["cluster"] = cluster
    return res
