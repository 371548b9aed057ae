"""The paper's experiments, by name (``kvcake sim experiment NAME``); each returns an
:class:`~kvcake.sim.experiments.common.ExpResult` and writes a PNG + JSON under results/."""

from __future__ import annotations

from collections.abc import Callable

from kvcake.sim.experiments.cache import cache_capacity, global_vs_local, replicas
from kvcake.sim.experiments.capacity import capacity
from kvcake.sim.experiments.common import Context, ExpResult
from kvcake.sim.experiments.overload import overload
from kvcake.sim.experiments.scheduling import bandwidth, pd_ratio, prefill_scheduling

EXPERIMENTS: dict[str, Callable[[Context], ExpResult]] = {
    "cache-capacity": cache_capacity,
    "prefill-scheduling": prefill_scheduling,
    "global-vs-local": global_vs_local,
    "capacity": capacity,
    "replicas": replicas,
    "bandwidth": bandwidth,
    "pd-ratio": pd_ratio,
    "overload": overload,
}

__all__ = ["EXPERIMENTS", "Context", "ExpResult"]
