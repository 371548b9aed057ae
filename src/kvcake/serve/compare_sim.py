"""``kvcake replay --compare-sim``: the simulator's prediction for the cluster just measured.

The simulator runs the same records (the ones the replay did not drop, output lengths capped the
same way) on a model of the same cluster: the instances' cost-model preset, prefill/decode
counts, block size, KV capacities and conductor policy. An emulated backend spends
``time_scale`` x the cost model; the simulator has no such knob, so it works in unscaled time
units (real seconds / ``time_scale``): arrivals ``1 / time_scale`` times further apart, SLOs
divided by ``time_scale``, and its times multiplied by ``time_scale`` at the end — the same
schedule in the same units. A disaggregated cluster with a store runs the simulator's live-path
model (``fetch_source = "pool"``: fetches from the store pool over both ends' NICs; the pool's
capacity = store servers x store size, spread over the nodes). Not modelled yet: the proxy's
HTTP hops and the CPU the live processes share (docs/sim.md, "Fidelity"). (For the torch backend, give the cluster
a calibration file; the simulator then uses its preset's model, which is reported.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from kvcake.core.trace import TraceRecord
from kvcake.serve.config import ServeFile
from kvcake.serve.replay import ReplayOptions, ReplaySummary


def simulate_like(
    records: Sequence[TraceRecord], summary: ReplaySummary, conf: ServeFile, opts: ReplayOptions
) -> dict[str, float]:
    from kvcake.sim.config import SimConfig
    from kvcake.sim.runner import simulate

    kept = [
        replace(r, output_length=min(r.output_length, opts.max_output) or 1)
        if opts.max_output
        else r
        for r, rec in zip(records, summary.per_request, strict=True)
        if rec.status != "dropped"
    ]
    inst, c, p = conf.instance, conf.cluster, conf.proxy
    scale = inst.time_scale if inst.backend == "emulated" and inst.time_scale > 0 else 1.0
    bt = conf.kv.kv_block_tokens
    # the live path: prefixes a prefill instance lacks come from the store pool (when the
    # cluster runs one), whose capacity is spread over all nodes in the simulator's model
    nodes = c.prefill + (0 if c.colocated else c.decode)
    kvbpt = inst_kv_bytes_per_token(inst)
    pooled = not c.colocated and c.store_servers > 0 and inst.use_store
    pool_tokens = int(c.store_servers * c.store_size / kvbpt / max(nodes, 1)) if pooled else 0
    scfg = SimConfig(
        fetch_source="pool" if pooled else "peer",
        pool_tokens_per_node=pool_tokens,
        system="vllm-prefix" if c.colocated else "mooncake",
        prefill_nodes=c.prefill,
        decode_nodes=0 if c.colocated else c.decode,
        preset=inst.preset,
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
    )
    res = simulate(kept, scfg)
    done = res.completed
    ttft, tbt = res.ttft[done] * scale, res.tbt[done] * scale
    return {
        "completed": float(done.sum()),
        "rejected": float(res.rejected()),
        "ttft_p50": _pct(ttft, 50),
        "ttft_p90": _pct(ttft, 90),
        "ttft_p99": _pct(ttft, 99),
        "tbt_p50": _pct(tbt, 50),
        "tbt_p99": _pct(tbt, 99),
        "prefix_hit_rate": res.hit_rate(),
        "effective_capacity": res.effective_share(
            scfg.conductor.tbt_slo_s, scfg.conductor.ttft_slo_s
        ),
    }


def inst_kv_bytes_per_token(inst: Any) -> int:
    from kvcake.core.costmodel import load_calibration, preset

    cm = load_calibration(inst.calibration) if inst.calibration else preset(inst.preset)
    return max(cm.model.kv_bytes_per_token, 1)


def _pct(a: np.ndarray, q: float) -> float:
    a = a[~np.isnan(a)]
    return float(np.percentile(a, q)) if a.size else float("nan")


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
