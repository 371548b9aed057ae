"""Simulator settings: one frozen, validated dataclass (loadable with ``core.config.load_config``
from a ``[sim]`` TOML section, ``KVCAKE_SIM_*`` variables or flags)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from kvcake.conductor.config import (
    ConductorConfig,
    check_moved,
    load_conductor_config,
    split_overrides,
)
from kvcake.core.config import load_config, require, setting
from kvcake.core.costmodel import PRESETS, CostModel, load_calibration, preset
from kvcake.core.trace import TRACE_BLOCK_TOKENS

SYSTEMS = ("mooncake", "vllm", "vllm-prefix", "vllm-chunked")
FETCH_SOURCES = ("peer", "pool")


@lru_cache(maxsize=8)
def _calibrated(path: str) -> CostModel:
    return load_calibration(path)


def parse_failures(spec: str, prefill: int, decode: int) -> list[tuple[str, int, float]]:
    """``"p0@300,d1@600"`` -> ``[("p", 0, 300.0), ("d", 1, 600.0)]`` (validated)."""
    out: list[tuple[str, int, float]] = []
    for part in filter(None, (x.strip() for x in spec.split(","))):
        node, _, at = part.partition("@")
        kind, num = node[:1], node[1:]
        ok = kind in ("p", "d") and num.isdigit() and at.replace(".", "", 1).isdigit()
        require(ok, f"sim.failures: {part!r} is not NODE@SECONDS (e.g. p0@300, d1@600)")
        n = int(num)
        require(
            n < (prefill if kind == "p" else decode),
            f"sim.failures: {part!r} names a node that does not exist",
        )
        out.append((kind, n, float(at)))
    return out


@dataclass(frozen=True)
class SimConfig:
    """A simulated cluster and how the trace is replayed.

    ``system`` picks the cluster model: ``mooncake`` (``prefill_nodes`` + ``decode_nodes``
    disaggregated instances) or a vLLM-like baseline (``prefill_nodes + decode_nodes`` colocated
    instances; ``-prefix`` adds local HBM prefix caching, ``-chunked`` chunked prefill).
    """

    system: str = setting("mooncake", f"cluster model, one of {', '.join(SYSTEMS)}")
    prefill_nodes: int = setting(
        8, "prefill instances (8-GPU nodes); vLLM baselines: colocated = P + D"
    )
    decode_nodes: int = setting(8, "decode instances (8-GPU nodes); 0 allowed for vLLM baselines")
    preset: str = setting(
        "llama3-70b/8xA800",
        f"core.costmodel preset (model/hardware), one of {', '.join(sorted(PRESETS))}",
    )
    calibration: str = setting(
        "",
        (
            "a `kvcake calibrate` JSON file: its fitted cost model replaces the "
            "preset's (empty: the preset)"
        ),
    )
    block_tokens: int = setting(
        TRACE_BLOCK_TOKENS, "tokens per KV block (the trace's hash_ids granularity)"
    )
    cache_tokens: int = setting(
        3_000_000, "DRAM KV cache per prefill node, in tokens (LRU over blocks)"
    )
    link_gbps: float = setting(
        800.0, "per-node network bandwidth in Gbps (KV fetches and streaming to decode)"
    )
    prefill_chunk_tokens: int = setting(
        4096, "Mooncake: prefill chunk size for long uncached suffixes"
    )
    decode_kv_tokens: int = setting(
        1_300_000, "KV tokens that fit in one instance's HBM after the weights"
    )
    # the conductor's settings: the [conductor] section, shared with the live proxy
    conductor: ConductorConfig = field(
        default_factory=ConductorConfig,
        metadata={"help": "the [conductor] section (flags: the conductor's own field names)"},
    )
    # realism (sim/pool.py; defaults keep the paper-reproduction model)
    fetch_source: str = setting(
        "peer",
        (
            "where a prefill node reads prefix blocks it lacks: peer (another prefill "
            "node's cache, the paper's model) or pool (the live path: the store pool over both NICs)"
        ),
    )
    pool_tokens_per_node: int = setting(
        3_000_000,
        "fetch_source=pool: store-pool DRAM per node (prefill and decode nodes), in tokens",
    )
    ssd_tokens_per_node: int = setting(
        0, "fetch_source=pool: store-pool SSD tier per node, in tokens"
    )
    ssd_gbps: float = setting(25.0, "fetch_source=pool: SSD read bandwidth per node in Gbps")
    index_lag_s: float = setting(
        0.0, "KV-index add/remove events reach the conductor this many seconds late"
    )
    predictor_noise: float = setting(
        0.0,
        (
            "relative noise of the timing samples the conductor's predictors are "
            "fitted from (0: the simulator's own cost model, exact)"
        ),
    )
    prefill_batch_tokens: int = setting(
        0,
        (
            "fetch_source=pool: batch queued prompts into one prefill call "
            "up to this many uncached tokens (0: one prompt per call)"
        ),
    )
    failures: str = setting(
        "",
        (
            "node failures, comma-separated NODE@SECONDS (p0@300 = prefill node 0 fails "
            "at trace second 300)"
        ),
    )
    # vLLM baselines
    vllm_batch_tokens: int = setting(
        2048, "vllm-chunked: tokens per iteration (running decodes + prefill chunk)"
    )
    # replay
    speedup: float = setting(1.0, "replay speed: trace timestamps divided by this")
    sample_interval_s: float = setting(
        10.0, "period of the prefill/decode load samples, simulated s"
    )

    def __post_init__(self) -> None:
        require(self.system in SYSTEMS, f"sim.system must be one of {SYSTEMS}, got {self.system!r}")
        require(self.prefill_nodes >= 1, "sim.prefill_nodes must be >= 1")
        require(self.decode_nodes >= 0, "sim.decode_nodes must be >= 0")
        require(
            self.system != "mooncake" or self.decode_nodes >= 1,
            "sim.decode_nodes must be >= 1 for mooncake",
        )
        require(self.preset in PRESETS, f"sim.preset must be one of {sorted(PRESETS)}")
        if self.calibration:
            self.cost_model()  # ConfigError now if the file is missing or malformed
        require(self.block_tokens >= 1, "sim.block_tokens must be >= 1")
        require(self.cache_tokens >= 0, "sim.cache_tokens must be >= 0")
        require(self.link_gbps > 0, "sim.link_gbps must be positive")
        require(self.prefill_chunk_tokens >= 1, "sim.prefill_chunk_tokens must be >= 1")
        require(self.decode_kv_tokens >= 1, "sim.decode_kv_tokens must be >= 1")
        require(
            isinstance(self.conductor, ConductorConfig),
            "sim.conductor must be a ConductorConfig ([conductor] section)",
        )
        require(
            self.fetch_source in FETCH_SOURCES,
            f"sim.fetch_source must be one of {FETCH_SOURCES}, got {self.fetch_source!r}",
        )
        require(
            self.pool_tokens_per_node >= 0 and self.ssd_tokens_per_node >= 0,
            "sim.pool_tokens_per_node and sim.ssd_tokens_per_node must be >= 0",
        )
        require(self.ssd_gbps > 0, "sim.ssd_gbps must be positive")
        require(self.index_lag_s >= 0, "sim.index_lag_s must be >= 0")
        require(0 <= self.predictor_noise < 1, "sim.predictor_noise must be in [0, 1)")
        require(self.prefill_batch_tokens >= 0, "sim.prefill_batch_tokens must be >= 0")
        parse_failures(self.failures, self.prefill_nodes, self.decode_nodes)
        require(self.vllm_batch_tokens >= 16, "sim.vllm_batch_tokens must be >= 16")
        require(self.speedup > 0, "sim.speedup must be positive")
        require(self.sample_interval_s > 0, "sim.sample_interval_s must be positive")

    def cost_model(self) -> CostModel:
        """The simulated hardware's times: the calibration file's fit, else the preset."""
        return _calibrated(self.calibration) if self.calibration else preset(self.preset)

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 / 8.0

    @property
    def nodes(self) -> int:
        return self.prefill_nodes + self.decode_nodes

    def with_(self, **changes: Any) -> SimConfig:  # any field: values checked by __post_init__
        """A copy with ``changes``; conductor field names (``prefill_policy``, ``tbt_slo_s``, ...)
        change ``self.conductor`` (the two sets of names are disjoint)."""
        cond, own = split_overrides(changes)
        if cond:
            own["conductor"] = replace(own.get("conductor", self.conductor), **cond)
        return replace(self, **own)


def load_sim_config(
    toml_path: str | os.PathLike[str] | None = None, overrides: Mapping[str, object] | None = None
) -> SimConfig:
    """``[sim]`` and ``[conductor]`` of ``toml_path`` (< ``KVCAKE_SIM_*`` / ``KVCAKE_CONDUCTOR_*``
    < ``overrides``, flat: conductor field names go to the conductor). Old ``[sim]`` conductor
    keys get a ConfigError naming their new place."""
    check_moved(toml_path, "sim")
    cond, own = split_overrides(overrides or {})
    own["conductor"] = load_conductor_config(toml_path, cond)
    return load_config(SimConfig, toml_path=toml_path, section="sim", overrides=own)
