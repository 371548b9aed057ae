import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvcake.cli import main
from kvcake.core.costmodel import preset
from kvcake.core.errors import ConfigError, TraceError
from kvcake.core.trace import TraceRecord, read_trace
from kvcake.data import sample_trace_path
from kvcake.sim.config import SimConfig
from kvcake.sim.experiments.cache import lru_hit_rate
from kvcake.sim.experiments.capacity import capacity_at
from kvcake.sim.runner import simulate

CM = preset()
KVB = CM.model.kv_bytes_per_token


def _rec(t_ms: float, n: int, out: int, ids: tuple[int, ...]) -> TraceRecord:
    return TraceRecord(t_ms, n, out, ids)


def test_single_request_exact_timeline() -> None:
    cfg = SimConfig(prefill_nodes=1, decode_nodes=1).with_(prefill_policy="round-robin")
    res = simulate([_rec(0, 1024, 3, (1, 2))], cfg)
    c, d = CM.prefill, CM.decode
    compute = c.c0 + c.c1 * 1024 + c.c2 * 1024**2
    stream = 1024 * KVB / cfg.link_bytes_per_s
    ready = max(stream, compute + stream / CM.model.layers)  # layer-wise: one layer exposed
    s0 = d.d0 + d.d1 + d.d2 * 1025
    s1 = s0 + d.d2
    assert res.ttft[0] == pytest.approx(ready, rel=1e-12)  # first token leaves via decode
    assert res.prefill_compute[0] == pytest.approx(compute, rel=1e-12)
    assert res.finish[0] == pytest.approx(ready + s0 + s1, rel=1e-12)
    # gaps: s0 (joins at once), then s1; TBT = the largest (ceil(10% of 2) = 1)
    assert res.tbt[0] == pytest.approx(s1, rel=1e-12)
    assert res.outcome.tolist() == [0]


def test_prefix_hit_and_queueing_exact() -> None:
    cfg = SimConfig(prefill_nodes=1, decode_nodes=1).with_(prefill_policy="round-robin")
    recs = [_rec(0, 1024, 1, (1, 2)), _rec(0, 1024, 1, (1, 3))]
    res = simulate(recs, cfg)
    first = CM.prefill_time(1024, 0)
    second = CM.prefill_time(1024, 512)  # block 1 is cached (the load is faster than compute)
    tail = 1024 * KVB / cfg.link_bytes_per_s / CM.model.layers  # last layer's KV transfer
    assert res.hit_tokens.tolist() == [0, 512]
    assert res.ttft[0] == pytest.approx(first + tail, rel=1e-9)
    assert res.ttft[1] == pytest.approx(first + second + tail, rel=1e-9)
    assert res.queue[1] == pytest.approx(first, rel=1e-12)
    # output 1: prefill's token only, no gap, no TBT (NaN), and within any TBT SLO
    assert np.isnan(res.tbt).all() and res.effective_share(1e-9, 1e9) == 1.0


def test_global_cache_fetches_and_replicates() -> None:
    cfg = SimConfig(prefill_nodes=2, decode_nodes=1).with_(prefill_policy="global-cache-aware")
    ids = tuple(range(8))
    big = tuple(range(100, 164))
    # A fills p0's cache; B (long, unrelated) keeps p0 busy; C (= A's prompt) arrives then:
    # p1 is idle but empty, so Algorithm 1 fetches A's blocks from p0 into p1.
    recs = [_rec(0, 4096, 1, ids), _rec(5000, 32768, 1, big), _rec(5010, 4096, 1, ids)]
    res = simulate(recs, cfg)
    cl = res.extra["cluster"]
    assert res.outcome.tolist() == [0, 0, 0]
    assert res.hit_tokens.tolist() == [0, 0, 4095]  # all but the last token reused
    assert res.local_hit_tokens[2] == 0 and res.transfer[2] > 0
    assert res.queue[2] == 0.0
    assert cl.index.holders(0) == {"p0", "p1"}  # the hot prefix got a replica
    # accounting: index mirrors caches, decode memory all released
    for n in cl.prefill:
        assert cl.index.blocks_of(n.iid) == len(n.cache) <= n.cache.capacity_blocks
    assert all(d.kv_used == 0 and d.pending_reqs == 0 for d in cl.decode)


def _sample(n: int) -> list[TraceRecord]:
    return read_trace(sample_trace_path(), limit=n)


@pytest.mark.parametrize("system", ["mooncake", "vllm", "vllm-prefix", "vllm-chunked"])
def test_systems_complete_and_account(system: str) -> None:
    recs = _sample(300)
    res = simulate(recs, SimConfig(system=system, speedup=4.0).with_(prefill_policy="least-load"))
    assert res.completed.all()
    assert np.all(res.ttft > 0) and not np.any(res.tbt < 0)  # NaN: one output token
    assert np.all(res.finish >= res.arrival + res.ttft - 1e-9)
    cl = res.extra["cluster"]
    if system == "mooncake":
        assert all(d.kv_used == 0 for d in cl.decode)
    else:
        assert all(i.kv_used == 0 for i in cl.inst)


def test_vllm_prefill_stalls_decode() -> None:
    # one colocated node: A decodes 9 tokens (TBT = its longest gap); B's 8k-token prefill stalls A mid-stream
    cfg = SimConfig(system="vllm", prefill_nodes=1, decode_nodes=0).with_(
        prefill_policy="least-load"
    )
    recs = [_rec(0, 512, 10, (1,)), _rec(100, 8192, 2, tuple(range(10, 26)))]
    res = simulate(recs, cfg)
    assert res.tbt[0] >= CM.prefill_time(8192)
    moon = simulate(
        recs, SimConfig(prefill_nodes=1, decode_nodes=1).with_(prefill_policy="least-load")
    )
    assert moon.tbt[0] < 0.1 < res.tbt[0]


def test_deterministic_for_a_seed() -> None:
    recs = _sample(250)
    cfg = SimConfig(speedup=2.0).with_(prefill_policy="random", seed=7)
    a, b = simulate(recs, cfg), simulate(recs, cfg)
    for name in ("ttft", "tbt", "finish", "hit_tokens"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True)
    c = simulate(recs, cfg.with_(seed=8))
    assert not np.array_equal(a.ttft, c.ttft)


def test_overload_policies_reject() -> None:
    recs = _sample(400)
    base = dict(tbt_slo_s=0.018, ttft_slo_s=5.0)
    out = {p: simulate(recs, SimConfig(speedup=8.0).with_(admission_policy=p, **base)) for p in
           ("none", "per-stage", "early-rejection")}  # fmt: skip
    assert out["none"].rejected() == 0
    assert out["per-stage"].rejected() > 0 and out["early-rejection"].rejected() > 0
    assert out["early-rejection"].rejected_after_prefill() == 0


def test_lru_hit_rate_hand_computed() -> None:
    recs = [_rec(0, 1024, 1, (1, 2)), _rec(1, 1024, 1, (1, 2)), _rec(2, 1000, 1, (1, 3))]
    assert lru_hit_rate(recs, 10**9) == pytest.approx((0 + 1024 + 512) / 3048)
    # one block of room: within a request the head is kept (deepest block evicted first), so
    # block 1 survives and the later requests hit their first block
    assert lru_hit_rate(recs, 512) == pytest.approx((0 + 512 + 512) / 3048)
    assert lru_hit_rate(recs, 0) == 0.0


def test_capacity_search_interpolates() -> None:
    assert capacity_at([1, 2, 3], [1.0, 0.95, 0.85]) == pytest.approx(2.5)
    assert capacity_at([1, 2], [0.5, 0.4]) == 0.0
    assert capacity_at([1, 2], [0.95, 0.92]) == 2


def test_bad_configs_raise_config_error() -> None:
    for kw in ({"system": "tgi"}, {"prefill_nodes": 0}, {"link_gbps": 0.0}, {"speedup": -1.0},
               {"decode_nodes": 0}, {"preset": "nope"}):  # fmt: skip
        with pytest.raises(ConfigError):
            SimConfig(**kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        simulate(_sample(5), SimConfig().with_(prefill_policy="best-guess"))


def test_cli_bad_trace_and_bad_experiment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
                   '{"timestamp": "x"}\n')  # fmt: skip
    assert main(["sim", "run", "--trace", str(bad)]) == 2
    assert "line 2" in capsys.readouterr().err
    with pytest.raises(TraceError):
        read_trace(bad)
    assert main(["sim", "experiment", "fig99", "--out", str(tmp_path)]) == 2
    assert main(["sim", "run", "--trace", str(bad), "--link-gbps", "-1"]) == 2


def test_cli_run_and_experiment_write_outputs(tmp_path: Path) -> None:
    small = tmp_path / "small.jsonl"
    small.write_text("".join(r.to_json() + "\n" for r in _sample(60)))
    js = tmp_path / "s.json"
    assert main(["sim", "run", "--trace", str(small), "--json", str(js)]) == 0
    assert json.loads(js.read_text())["requests"] == 60
    out = tmp_path / "res"
    assert main(["sim", "experiment", "prefill-scheduling", "--trace", str(small), "--out",
                 str(out), "--jobs", "1", "--quick"]) == 0  # fmt: skip
    doc = json.loads((out / "prefill-scheduling.json").read_text())
    assert len(doc["rows"]) == 4 and (out / "prefill-scheduling.png").stat().st_size > 0
    assert all(math.isfinite(float(r[1])) for r in doc["rows"])


def test_cli_help_documents_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    from kvcake.commands.sim import EXPERIMENT_NAMES
    from kvcake.conductor.config import ConductorConfig
    from kvcake.sim.experiments import EXPERIMENTS

    assert tuple(EXPERIMENTS) == EXPERIMENT_NAMES
    for cls in (SimConfig, ConductorConfig):  # the flags' help is the fields' metadata
        assert all(f.metadata.get("help") for f in dataclasses.fields(cls)), cls
    for action in ("run", "experiment", "reproduce"):
        with pytest.raises(SystemExit) as ex:
            main(["sim", action, "--help"])
        assert ex.value.code == 0
        text = capsys.readouterr().out
        flags = [w.rstrip(",") for w in text.split() if w.startswith("--") and w != "--help"]
        assert flags
        assert text.count("(default:") >= len(set(flags)) - 1  # all but --quick's own
        assert "(default: None)" not in text


def test_cli_missing_trace_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nope.jsonl")
    for argv in (["sim", "run", "--trace", missing],
                 ["sim", "experiment", "replicas", "--trace", missing, "--out", str(tmp_path)],
                 ["sim", "reproduce", "--trace", missing, "--out", str(tmp_path)]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"--trace {missing}: trace file not found" in err
    assert main(["sim", "reproduce", "--only", "fig99", "--out", str(tmp_path)]) == 2
    assert "unknown experiment(s) fig99" in capsys.readouterr().err


def test_experiment_grids_match_docs() -> None:
    import importlib

    cache, capacity, overload, scheduling = (
        importlib.import_module(f"kvcake.sim.experiments.{m}")
        for m in ("cache", "capacity", "overload", "scheduling")
    )

    doc = (Path(__file__).parents[2] / "docs" / "experiments.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in doc.splitlines()
            if line.startswith("| `")}  # fmt: skip
    assert set(rows) == set(EXPERIMENT_NAMES_FOR_DOCS)

    def g(xs: list[float]) -> str:
        return ", ".join(f"{x:g}" for x in xs)

    def e(xs: list[int]) -> str:
        return ", ".join(f"{x:.0e}".replace("e+0", "e") for x in xs)

    assert e(cache.CAPACITIES) in rows["cache-capacity"]
    assert "Quick: " + e(cache.CAPACITIES[1::2]) in rows["cache-capacity"]
    assert g(capacity.SPEEDS) in rows["capacity"]
    assert g(capacity.SPEEDS[::2]) in rows["capacity"]
    assert g(scheduling.BANDWIDTHS_GBPS) in rows["bandwidth"]
    assert g(scheduling.BANDWIDTHS_GBPS[::2]) in rows["bandwidth"]
    assert ", ".join(f"{p}P{d}D" for p, d in scheduling.PD_SPLITS) in rows["pd-ratio"]
    assert f"{scheduling.PD_STEP_MULTIPLE:g} x the uncontended decode step" in rows["pd-ratio"]
    assert f"fills {scheduling.PD_FILL_NODES} of the 16 nodes" in rows["pd-ratio"]
    mult = " and ".join(f"{m:g}" for m in overload.TBT_STEP_MULTIPLES)
    assert f"TBT SLOs {mult} x the uncontended decode step" in rows["overload"]
    for _, label, _ in capacity.SYSTEMS:
        assert label.split(" (")[0].split(" +")[0] in rows["capacity"]


EXPERIMENT_NAMES_FOR_DOCS = ("cache-capacity", "prefill-scheduling", "global-vs-local",
                             "capacity", "replicas", "bandwidth", "pd-ratio", "overload")  # fmt: skip


def test_capacity_runs_every_system_and_report_lists_every_experiment(tmp_path: Path) -> None:
    import importlib

    from kvcake.sim.experiments.report import ORDER, write_report

    capacity = importlib.import_module("kvcake.sim.experiments.capacity")
    small = tmp_path / "small.jsonl"
    small.write_text("".join(r.to_json() + "\n" for r in _sample(20)))
    for system, _, policy in capacity.SYSTEMS:  # mooncake-best is not a SimConfig system
        out = capacity._run((str(small), system, policy, 1.0, (3, 2)))
        assert len(out["share"]) == len(capacity.THRESHOLDS_MS)
    assert tuple(ORDER) == EXPERIMENT_NAMES_FOR_DOCS
    text = write_report([], tmp_path, "test", 0.0).read_text()
    assert text.count("not run (no result") == len(ORDER)


def test_bench_dynamo_option_skips_with_a_reason(tmp_path: Path) -> None:
    import importlib.util

    path = Path(__file__).parents[2] / "benchmarks" / "sim_bench.py"
    spec = importlib.util.spec_from_file_location("sim_bench", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert "KVCAKE_DYNAMO_PYTHON is unset" in bench.dynamo_problem(None)
    assert "not an executable file" in bench.dynamo_problem(str(tmp_path / "python"))
    fake = tmp_path / "fakepy"
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named dynamo' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert "No module named dynamo" in bench.dynamo_problem(str(fake))
