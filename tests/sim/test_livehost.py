"""The live-serving-path model (sim.livehost): the proxy's gate, overheads, burst order, shared
CPU — hand-computed expectations."""

from __future__ import annotations

import numpy as np
import pytest

from kvcake.core.costmodel import preset
from kvcake.core.errors import ConfigError
from kvcake.core.trace import TraceRecord
from kvcake.replay.live_probe import overheads, probe_records
from kvcake.replay.runner import ReplayOptions, RequestRecord, summarize
from kvcake.sim.config import SimConfig
from kvcake.sim.livehost import LiveHost, busy_shares, cpu_factor, shuffle_ties, slowed
from kvcake.sim.runner import simulate


def test_cpu_factor_is_demand_over_cores() -> None:
    # two 1-thread instances, one busy all the time, one half the time
    assert cpu_factor([1, 1], [1.0, 0.5], cores=1) == pytest.approx(1.5)
    assert cpu_factor([1, 1], [1.0, 0.5], cores=2) == 1.0  # 0.75 of 2 cores: no contention
    assert cpu_factor([2, 2], [1.0, 1.0], cores=2) == pytest.approx(2.0)
    assert cpu_factor([0, 0], [1.0, 1.0], cores=2) == 1.0  # sleeping (emulated) compute
    assert cpu_factor([1], [1.0], cores=2, other_cores=2.0) == pytest.approx(1.5)
    assert cpu_factor([1], [3.0], cores=1) == 1.0  # a share is at most 1
    with pytest.raises(ConfigError):
        cpu_factor([1], [1.0], cores=0)


def test_slowed_multiplies_every_time() -> None:
    cm = preset()
    s = slowed(cm, 2.0)
    assert s.prefill_time(4096, 512) == pytest.approx(2 * cm.prefill_time(4096, 512))
    assert s.decode_step_time(8, 8000) == pytest.approx(2 * cm.decode_step_time(8, 8000))
    assert slowed(cm, 1.0) is cm


def test_shuffle_ties_permutes_bursts_only() -> None:
    recs = [TraceRecord(t, 100 + i, 1, (i,)) for i, t in enumerate([0, 0, 0, 0, 3, 6, 6, 6])]
    a, b = shuffle_ties(recs, 1), shuffle_ties(recs, 1)
    assert a == b  # seeded
    assert [r.timestamp_ms for r in a] == [r.timestamp_ms for r in recs]
    assert sorted(r.input_length for r in a[:4]) == [100, 101, 102, 103]
    assert a[4] == recs[4]
    orders = {tuple(r.input_length for r in shuffle_ties(recs, s)[:4]) for s in range(10)}
    assert len(orders) > 1


def test_busy_shares_union_of_intervals() -> None:
    assert busy_shares([[(0, 2), (1, 3), (5, 6)], []], 10) == [pytest.approx(0.4), 0.0]
    assert busy_shares([[(0, 1), (0.2, 0.5)]], 2) == [0.5]


def test_live_host_validates() -> None:
    with pytest.raises(ConfigError):
        LiveHost(dispatch_s=-1)
    with pytest.raises(ConfigError):
        LiveHost(cpu_slowdown=0.5)


def _two_at_once(live: LiveHost | None) -> np.ndarray:
    # a huge link: the KV stream ends a few microseconds after the compute
    cfg = SimConfig(prefill_nodes=1, decode_nodes=1, fetch_source="pool", link_gbps=1e6)
    recs = [TraceRecord(0, 2048, 2, (1, 2, 3, 4)), TraceRecord(0, 4096, 2, tuple(range(5, 13)))]
    return simulate(recs, cfg, live=live).ttft


def test_gate_held_until_the_answer() -> None:
    cm = preset()
    c1, c2 = cm.chunked_prefill_time(2048, 0, 4096), cm.chunked_prefill_time(4096, 0, 4096)
    plain = _two_at_once(None)
    assert plain == pytest.approx([c1, c1 + c2], abs=1e-3)
    d, f = 0.05, 0.02
    ttft = _two_at_once(LiveHost(dispatch_s=d, first_token_s=f))
    # the second request starts when the first one's answer opens the gate
    assert ttft == pytest.approx([c1 + d + f, c1 + d + c2 + d + f], abs=1e-3)


def test_cpu_slowdown_and_tbt_extra() -> None:
    cm = preset()
    c1 = cm.chunked_prefill_time(2048, 0, 4096)
    cfg = SimConfig(prefill_nodes=1, decode_nodes=1, fetch_source="pool", link_gbps=1e6)
    recs = [TraceRecord(0, 2048, 20, (1, 2, 3, 4))]
    base = simulate(recs, cfg, live=LiveHost())
    slow = simulate(recs, cfg, live=LiveHost(cpu_slowdown=2.0, tbt_extra_s=0.01))
    assert base.ttft[0] == pytest.approx(c1, abs=1e-3)
    assert slow.ttft[0] == pytest.approx(2 * c1, abs=1e-3)
    assert slow.tbt[0] == pytest.approx(2 * base.tbt[0] + 0.01, rel=1e-6)


def test_live_needs_the_pool_model() -> None:
    with pytest.raises(ValueError, match="fetch_source"):
        simulate([TraceRecord(0, 512, 2, (1,))], SimConfig(), live=LiveHost())


def test_probe_overheads_from_a_burst() -> None:
    opts = ReplayOptions(url="http://unused")
    reqs = []
    for i, (ttft, tbt) in enumerate([(0.30, 0.010), (0.55, 0.012), (0.80, 0.011)]):
        r = RequestRecord(i, 0.0, 4096, 8, status="ok", ttft_s=ttft, tbt_s=tbt, sent_s=0.0)
        reqs.append(r)
    summary = summarize(reqs, 1.0, opts)
    # simulated: first token at 0.1, then every 0.2 s; TBT 0.004
    sim = (np.array([0.1, 0.3, 0.5]), np.array([0.004, 0.004, 0.004]))
    o = overheads(summary, sim, 4096)
    assert o.dispatch_s == pytest.approx(0.05)  # 0.25 measured gap - 0.2 simulated
    assert o.first_token_s == pytest.approx(0.30 - 0.1 - 0.05)
    assert o.tbt_extra_s == pytest.approx(0.011 - 0.004)
    reqs[1].status = reqs[2].status = "error"
    with pytest.raises(RuntimeError, match="did not complete"):
        overheads(summarize(reqs, 1.0, opts), sim, 4096)


def test_probe_records_share_nothing() -> None:
    a, b = probe_records(4, 8, 32, tag=1), probe_records(4, 8, 32, tag=2)
    ids = [h for r in a + b for h in r.hash_ids]
    assert len(ids) == len(set(ids)) == 64
    assert all(r.timestamp_ms == 0 and r.input_length == 8 * 512 for r in a)


def test_calibrated_cpu_preset_is_the_measured_fit() -> None:
    cm = preset("smollm2-135m/cpu-calibrated")
    assert cm.source == "fitted" and cm.model.name == "smollm2-135m"
    # measured points of the calibration run (benchmarks/calibrate_cpu.py): within the fit error
    assert cm.prefill_time(512, 0) == pytest.approx(1.806, rel=0.1)
    assert cm.decode_step_time(8, 8 * 257) == pytest.approx(0.2009, rel=0.1)


def test_compare_sim_models_torch_clusters_with_the_calibrated_preset() -> None:
    from kvcake.launch.launcher import load_serve_file
    from kvcake.replay.compare_sim import sim_setup
    from kvcake.serve.config import default_cluster_file

    torch = sim_setup(load_serve_file(default_cluster_file()))
    assert torch.cfg.preset == "smollm2-135m/cpu-calibrated" and torch.scale == 1.0
    assert torch.threads == (1.0, 1.0)  # one torch thread per instance burns CPU while busy
    emu = sim_setup(load_serve_file(default_cluster_file().with_name("emulated.toml")))
    assert emu.cfg.preset == "llama3-70b/8xA800" and emu.scale == 0.25
    assert emu.threads == (0.0, 0.0)  # the emulated backend sleeps
    # the pool holds what the live store holds: 256 MB of kv_scale x 70B's KV per token
    assert emu.cfg.pool_tokens_per_node == int(256e6 / (327680 * 0.001) / 2)
