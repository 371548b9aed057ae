"""``kvcake replay --compare-sim``: the simulator's prediction for the cluster just measured.

The simulator runs the same records (the ones the replay did not drop, prompts as long as the
replay sent them, output lengths capped the same way) on a model of the same cluster: the
instances' cost model (the emulated backend's preset or calibration file; for the torch backend
its calibration file, else the calibrated CPU preset), prefill/decode counts, block size, KV
capacities and the cluster's ``[conductor]`` settings. An emulated backend spends
``time_scale`` x the cost model; the simulator works in unscaled time units (real seconds /
``time_scale``: arrivals ``1 / time_scale`` times further apart, SLOs and overheads divided by
it) and its times are multiplied by ``time_scale`` at the end. A disaggregated cluster with a
store runs the live-path model (``fetch_source = "pool"``; the pool holds what the live store
holds: store servers x store size over the KV bytes the backend really writes per token).

The live serving path (:mod:`kvcake.sim.livehost`): the proxy's per-prefill-instance gate, the
overheads :mod:`kvcake.replay.live_probe` measures on the cluster right before the replay, bursts
served in an order the event loops pick (``orders`` seeded shuffles of every burst, pooled), and
the CPU the instances' compute shares on ``cores`` cores.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvcake.core.costmodel import PRESETS, load_calibration, preset
from kvcake.core.stats import percentile
from kvcake.core.trace import TraceRecord
from kvcake.replay.live_probe import Overheads
from kvcake.replay.runner import ReplayOptions, ReplaySummary
from kvcake.serve.config import ServeFile
from kvcake.sim.config import SimConfig
from kvcake.sim.livehost import LiveHost, busy_shares, cpu_factor, shuffle_ties
from kvcake.sim.runner import simulate

CALIBRATED_CPU_PRESET = "smollm2-135m/cpu-calibrated"


@dataclass(frozen=True)
class SimSetup:
    """The simulator's model of one live cluster."""

    cfg: Any  # SimConfig
    scale: float  # real seconds per simulated second
    threads: tuple[float, ...]  # compute cores each instance burns while busy (prefill, decode)


def sim_setup(conf: ServeFile) -> SimSetup:
    inst, c, p = conf.instance, conf.cluster, conf.proxy
    emulated = inst.backend == "emulated"
    scale = inst.time_scale if emulated and inst.time_scale > 0 else 1.0
    bt = conf.kv.kv_block_tokens
    nodes = c.prefill + (0 if c.colocated else c.decode)
    live_bpt = max(1.0, inst_kv_bytes_per_token(inst) * (inst.kv_scale if emulated else 1.0))
    pooled = not c.colocated and c.store_servers > 0 and inst.use_store
    pool_tokens = int(c.store_servers * c.store_size / live_bpt / max(nodes, 1)) if pooled else 0
    # the emulated backend's model; torch: its calibration file, else the calibrated preset
    model_preset, calibration = inst.preset, inst.calibration
    if not emulated:
        cpu = CALIBRATED_CPU_PRESET if CALIBRATED_CPU_PRESET in PRESETS else "smollm2-135m/cpu"
        model_preset = cpu
    cfg = SimConfig(
        fetch_source="pool" if pooled else "peer",
        pool_tokens_per_node=pool_tokens,
        system="vllm-prefix" if c.colocated else "mooncake",
        prefill_nodes=c.prefill,
        decode_nodes=0 if c.colocated else c.decode,
        block_tokens=bt,
        cache_tokens=inst.kv_blocks * bt,
        decode_kv_tokens=inst.kv_blocks * bt,
        # the cluster's own [conductor] section, SLOs in the simulator's unscaled time
        conductor=replace(
            p.conductor,
            ttft_slo_s=p.conductor.ttft_slo_s / scale,
            tbt_slo_s=p.conductor.tbt_slo_s / scale,
        ),
        speedup=scale,  # records are already scaled by the replay's --speedup
        preset=model_preset,
        calibration=calibration,
    )
    per = 0.0 if emulated else float(inst.threads)  # the emulated backend sleeps
    return SimSetup(cfg, scale, (per,) * (c.prefill + (0 if c.colocated else c.decode)))


def kept_records(
    records: Sequence[TraceRecord], summary: ReplaySummary, opts: ReplayOptions
) -> list[TraceRecord]:
    """The records the replay sent, with the prompt lengths and output caps it used."""
    return [
        replace(r, input_length=rec.prompt_tokens, output_length=rec.max_tokens)
        for r, rec in zip(records, summary.per_request, strict=True)
        if rec.status != "dropped"
    ]


def run_sim(
    setup: SimSetup, records: Sequence[TraceRecord], over: Overheads | None = None,
    cores: int | None = None, orders: int = 1,
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:  # fmt: skip
    """Per-request real-second ``(ttft, tbt)`` of completed requests, pooled over ``orders``
    burst orders (1 = the trace's order), and facts about the model used."""

    cfg, scale = setup.cfg, setup.scale
    pooled = cfg.system == "mooncake" and cfg.fetch_source == "pool"
    live = None
    if over is not None and pooled:
        live = LiveHost(over.dispatch_s / scale, over.first_token_s / scale,
                        over.tbt_extra_s / scale)  # fmt: skip
    facts: dict[str, float] = {"cpu_slowdown": 1.0}
    if live is not None and cores and any(setup.threads):
        first = simulate(records, cfg, live=live)
        factor = cpu_factor(setup.threads, busy(first), cores)
        live = replace(live, cpu_slowdown=factor)
        facts["cpu_slowdown"] = factor
    ttft, tbt, res = [], [], None
    for k in range(max(orders, 1)):
        recs = shuffle_ties(records, k) if orders > 1 else list(records)
        res = simulate(recs, cfg, live=live)
        ttft.append(res.ttft[res.completed] * scale)
        tbt.append(res.tbt[res.completed] * scale)
    assert res is not None
    facts.update(completed=float(res.completed.sum()), rejected=float(res.rejected()),
                 prefix_hit_rate=res.hit_rate(),
                 effective_capacity=res.effective_share(cfg.conductor.tbt_slo_s,
                                                        cfg.conductor.ttft_slo_s))  # fmt: skip
    return np.concatenate(ttft), np.concatenate(tbt), facts


def busy(res: Any) -> list[float]:
    """Share of the run each instance computes: prefill nodes, then decode nodes."""

    cluster = res.extra["cluster"]
    span = max(res.sim_end_s, 1e-9)
    pre = [min(n.busy_s / span, 1.0) for n in cluster.prefill]
    ivs: list[list[tuple[float, float]]] = [[] for _ in cluster.decode]
    for r in cluster.finished:
        if r.decode_inst >= 0 and r.finish == r.finish and r.kv_ready == r.kv_ready:
            ivs[r.decode_inst].append((r.kv_ready, r.finish))
    return pre + busy_shares(ivs, span)


def simulate_like(
    records: Sequence[TraceRecord], summary: ReplaySummary, conf: ServeFile, opts: ReplayOptions,
    over: Overheads | None = None, cores: int | None = None, orders: int = 8,
) -> dict[str, float]:  # fmt: skip
    """The simulated counterpart of ``summary``; with ``over`` (a probe's overheads) the live
    serving path is modelled (``cores``: the machine's, default ``os.cpu_count()``)."""
    setup = sim_setup(conf)
    kept = kept_records(records, summary, opts)
    cores = cores or os.cpu_count() or 1
    ttft, tbt, facts = run_sim(setup, kept, over, cores, orders if over is not None else 1)
    return {
        "completed": facts["completed"],
        "rejected": facts["rejected"],
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "ttft_p99": percentile(ttft, 99),
        "tbt_p50": percentile(tbt, 50),
        "tbt_p99": percentile(tbt, 99),
        "prefix_hit_rate": facts["prefix_hit_rate"],
        "effective_capacity": facts["effective_capacity"],
        "cpu_slowdown": facts["cpu_slowdown"],
    }


def probe_sim(conf: ServeFile) -> Any:
    """``simulate(records, summary)`` for :func:`kvcake.replay.live_probe.run_probe`: the probe
    burst on the model without overheads, in trace order."""
    setup = sim_setup(conf)

    def sim(records: list[TraceRecord], summary: ReplaySummary) -> tuple[np.ndarray, np.ndarray]:
        kept = [replace(r, input_length=rec.prompt_tokens)
                for r, rec in zip(records, summary.per_request, strict=True)]  # fmt: skip
        ttft, tbt, _ = run_sim(setup, kept, Overheads(0.0, 0.0, 0.0, 0, 0))
        return ttft, tbt

    return sim


def inst_kv_bytes_per_token(inst: Any) -> int:
    """KV bytes per token of the instances' model (before the emulated backend's kv_scale)."""

    if inst.calibration:
        cm = load_calibration(inst.calibration)
    else:
        cm = preset(inst.preset if inst.backend == "emulated" else "smollm2-135m/cpu")
    return max(cm.model.kv_bytes_per_token, 1)


def side_by_side(
    measured: dict[str, Any], predicted: dict[str, float]
) -> list[tuple[str, str, str, str]]:
    """``(metric, measured, simulated, error)`` rows; error = simulated / measured - 1."""
    rows = []
    for k, v in predicted.items():
        m = measured.get(k, float("nan"))
        err = v / m - 1 if isinstance(m, int | float) and m and m == m else float("nan")
        rows.append((k, f"{m:.3f}" if isinstance(m, float) else str(m), f"{v:.3f}",
                     "-" if err != err else f"{err:+.0%}"))  # fmt: skip
    return rows
