"""What ``kvcake plan`` sweeps: cluster architectures (:data:`VARIANTS`), their sizes and P/D
splits, and how one simulated configuration is judged against the SLOs.

A configuration *meets the SLOs* when at least ``target`` (default 90%) of the trace's requests
complete with TTFT <= the TTFT SLO and TBT <= the TBT SLO (TBT = mean of the longest 10% of a
request's inter-token gaps, the paper's definition) and none is rejected.

Every run uses the live path's model (``fetch_source = "pool"``: fetches from the store pool
over both ends' NICs, puts of computed blocks, see :mod:`kvcake.sim.pooled`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvcake.conductor.config import ConductorConfig
from kvcake.core.config import require
from kvcake.core.costmodel import DEFAULT_PRESET, PRESETS, CostModel, load_calibration, preset
from kvcake.core.errors import ConfigError
from kvcake.core.stats import percentile
from kvcake.core.trace import TraceRecord
from kvcake.sim.config import SimConfig
from kvcake.sim.runner import simulate


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    colocated: bool
    pooled: bool


VARIANTS = (
    Variant("disagg-pool", "disaggregated P/D + KV pool (global-cache-aware)", False, True),
    Variant("disagg-local", "disaggregated P/D, local prefix cache only", False, False),
    Variant("colocated-prefix", "colocated (vLLM-like) + local prefix caching", True, False),
    Variant("colocated-chunked", "colocated (vLLM-like) + chunked prefill", True, False),
)
BY_KEY = {v.key: v for v in VARIANTS}

# Memory per preset (tokens): decode KV room in HBM, the prefill node's own prefix cache
# without a pool (HBM), and the pool's DRAM per node. 70B/8xA800: ~500 GB of HBM after the
# weights at 320 KB/token; ~1 TB of DRAM per node (the paper's 3M tokens).
MEMORY: dict[str, tuple[int, int, int]] = {
    "llama3-70b/8xA800": (1_300_000, 500_000, 3_000_000),
    "llama3-70b/8xH800": (1_300_000, 500_000, 3_000_000),
    "smollm2-135m/cpu": (200_000, 50_000, 400_000),
}
# Calibrated presets shipped with kvcake (name -> `kvcake calibrate` file); none yet (see
# docs/plan.md). `--hardware` takes the path of any calibration file.
CALIBRATED: dict[str, Path] = {}
HARDWARE = (*sorted(PRESETS), *sorted(CALIBRATED))
SLO_MULTIPLE = 5.0


def resolve_hardware(name: str) -> tuple[str, str]:
    """``(preset name, calibration path or "")`` for a ``--hardware`` value."""
    if name in PRESETS:
        return name, ""
    path = CALIBRATED.get(name) or Path(name)
    if not path.is_file():
        raise ConfigError(
            f"--hardware must be one of {', '.join(HARDWARE)} or a `kvcake "
            f"calibrate` file, got {name!r}"
        )
    cm = load_calibration(path)
    base = "smollm2-135m/cpu" if "smollm" in cm.model.name else DEFAULT_PRESET
    return base, str(path)


def cost_model_for(name: str) -> CostModel:
    p, cal = resolve_hardware(name)
    return (
        load_calibration(cal) if cal else preset(p)
    )  # default SLOs: this many times the uncontended step (see default_slos)


@dataclass(frozen=True)
class PlanConfig:
    """``kvcake plan`` settings. ``ttft_slo_s`` / ``tbt_slo_s`` of 0 mean "derive by the rule in
    :func:`default_slos`"; ``pool_tokens_per_node`` / ``local_cache_tokens`` of 0 mean "the
    preset's :data:`MEMORY` row"."""

    hardware: str = "llama3-70b/8xA800"
    network_gbps: float = 800.0
    ttft_slo_s: float = 0.0
    tbt_slo_s: float = 0.0
    target: float = 0.9
    max_nodes: int = 64
    pool_tokens_per_node: int = 0
    local_cache_tokens: int = 0
    traffic: tuple[float, ...] = (1.0, 2.0)
    jobs: int = 0  # 0: all cores
    index_lag_s: float = 0.0  # realism knobs of the live-path model (docs/sim.md)
    predictor_noise: float = 0.0
    # [conductor] of --config (threshold, seed, expected output, admission); the prefill
    # policy is swept per variant and the SLOs come from the fields above or the rule
    conductor: ConductorConfig = field(default_factory=ConductorConfig)

    def __post_init__(self) -> None:
        resolve_hardware(self.hardware)
        require(self.network_gbps > 0, "--network must be positive")
        require(self.ttft_slo_s >= 0 and self.tbt_slo_s >= 0, "SLOs must be positive")
        require(0 < self.target <= 1, "--target must be in (0, 1]")
        require(self.max_nodes >= 2, "--max-nodes must be >= 2")
        require(
            self.pool_tokens_per_node >= 0 and self.local_cache_tokens >= 0,
            "cache sizes must be >= 0",
        )
        require(all(t > 0 for t in self.traffic), "traffic multipliers must be positive")
        require(self.jobs >= 0, "--jobs must be >= 0")
        require(self.index_lag_s >= 0, "--index-lag must be >= 0")
        require(0 <= self.predictor_noise < 1, "--predictor-noise must be in [0, 1)")

    @property
    def workers(self) -> int:
        return self.jobs or os.cpu_count() or 1

    @property
    def memory(self) -> tuple[int, int, int]:
        kv, local, pool = MEMORY.get(resolve_hardware(self.hardware)[0], MEMORY[DEFAULT_PRESET])
        return kv, self.local_cache_tokens or local, self.pool_tokens_per_node or pool


def default_slos(records: Sequence[TraceRecord], hardware: str) -> tuple[float, float, str]:
    """The stated rule: TTFT SLO = 5x the uncontended prefill of the trace's p90 prompt (no
    cache); TBT SLO = 5x the uncontended decode step of one sequence at the trace's median
    context. Returns ``(ttft, tbt, rule text)``."""
    cm = cost_model_for(hardware)
    inp = np.array([r.input_length for r in records])
    out = np.array([r.output_length for r in records])
    p90 = int(percentile(inp, 90))
    ctx = int(np.median(inp + out / 2))
    ttft = SLO_MULTIPLE * cm.prefill_time(p90, 0)
    tbt = SLO_MULTIPLE * cm.decode_step_time(1, ctx)
    rule = (
        f"TTFT SLO = {SLO_MULTIPLE:g} x uncontended prefill of the p90 prompt ({p90} "
        f"tokens: {ttft / SLO_MULTIPLE:.3g} s); TBT SLO = {SLO_MULTIPLE:g} x one decode "
        f"step at the median context ({ctx} tokens: {tbt / SLO_MULTIPLE * 1000:.3g} ms)"
    )
    return ttft, tbt, rule


@dataclass(frozen=True)
class Point:
    """One simulated configuration and how it did."""

    variant: str
    prefill: int  # colocated: all instances; disaggregated: prefill nodes
    decode: int
    pool_tokens: int
    gbps: float
    traffic: float
    share: float  # requests within both SLOs
    meets: bool
    ttft_p50: float
    ttft_p90: float
    tbt_p50: float
    tbt_p90: float
    hit_rate: float
    rejected: int
    wall_s: float

    @property
    def nodes(self) -> int:
        return self.prefill + self.decode

    @property
    def label(self) -> str:
        v = BY_KEY[self.variant]
        size = f"{self.nodes} colocated" if v.colocated else f"{self.prefill}P+{self.decode}D"
        pool = f", pool {self.pool_tokens / 1e6:g}M tok/node" if v.pooled else ""
        return f"{v.key} {size}{pool}"


def sim_config(
    base: SimConfig,
    pc: PlanConfig,
    variant: str,
    p: int,
    d: int,
    pool: int,
    gbps: float,
    traffic: float,
) -> SimConfig:
    v = BY_KEY[variant]
    kv, local, _ = pc.memory
    common: dict[str, float] = dict(decode_kv_tokens=kv, link_gbps=gbps, speedup=traffic)
    if v.colocated:
        system = "vllm-prefix" if variant == "colocated-prefix" else "vllm-chunked"
        policy = "local-cache-aware" if variant == "colocated-prefix" else "least-load"
        return base.with_(
            system=system, prefill_nodes=p, decode_nodes=0, prefill_policy=policy, **common
        )
    return base.with_(
        system="mooncake",
        prefill_nodes=p,
        decode_nodes=d,
        fetch_source="pool",
        cache_tokens=local,
        pool_tokens_per_node=pool if v.pooled else 0,
        prefill_policy="global-cache-aware" if v.pooled else "local-cache-aware",
        **common,
    )


_RECORDS: list[TraceRecord] = []  # the trace, set before the worker processes fork


def _evaluate(arg: tuple[str, SimConfig, float]) -> Point:
    variant, cfg, target = arg
    r = simulate(_RECORDS, cfg)
    ok = r.completed
    share = r.effective_share(cfg.conductor.tbt_slo_s, cfg.conductor.ttft_slo_s)

    def pct(a: np.ndarray, q: float) -> float:  # of the completed requests; NaN when none
        return percentile(a[ok], q)

    rej = r.rejected()
    pool = (
        cfg.pool_tokens_per_node if cfg.fetch_source == "pool" and variant == "disagg-pool" else 0
    )
    return Point(
        variant,
        cfg.prefill_nodes,
        cfg.decode_nodes,
        pool,
        cfg.link_gbps,
        cfg.speedup,
        share,
        share >= target and rej == 0,
        pct(r.ttft, 50),
        pct(r.ttft, 90),
        pct(r.tbt, 50),
        pct(r.tbt, 90),
        r.hit_rate(),
        rej,
        r.wall_s,
    )


@dataclass
class Evaluator:
    """Runs configurations (in ``workers`` forked processes), each at most once."""

    records: list[TraceRecord]
    workers: int
    on_progress: Callable[[int, int], None] | None = None  # (done, submitted)
    done: dict[tuple[str, SimConfig], Point] = field(default_factory=dict)
    _pool: ProcessPoolExecutor | None = None
    _submitted = 0
    _finished = 0

    def __enter__(self) -> Evaluator:
        global _RECORDS
        _RECORDS = self.records
        if self.workers > 1 and os.name == "posix":
            self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("fork"))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def run(self, items: Sequence[tuple[str, SimConfig]], target: float) -> list[Point]:
        todo = list(dict.fromkeys(k for k in items if k not in self.done))
        self._submitted += len(todo)
        self._tick()
        if self._pool is None:
            for k in todo:
                self.done[k] = _evaluate((k[0], k[1], target))
                self._finished += 1
                self._tick()
        else:
            futs: list[tuple[tuple[str, SimConfig], Future[Point]]] = [
                (k, self._pool.submit(_evaluate, (k[0], k[1], target))) for k in todo
            ]
            for k, f in futs:
                self.done[k] = f.result()
                self._finished += 1
                self._tick()
        return [self.done[k] for k in items]

    def _tick(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self._finished, self._submitted)

    @property
    def runs(self) -> int:
        return len(self.done)
