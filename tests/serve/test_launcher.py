"""``kvcake up`` fails fast and clearly on bad setups; the replay generator against a cluster."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvcake.core.errors import ConfigError
from kvcake.core.trace import TraceRecord
from kvcake.serve.launcher import Cluster, toml_dump
from kvcake.serve.replay import ReplayOptions, paper_tbt, run_replay
from tests.serve.helpers import make_cluster


def test_port_conflict_fails_fast(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        c = make_cluster(tmp_path, cluster={"proxy_port": port})
        with pytest.raises(ConfigError, match=r"cluster.proxy_port"):
            c.start()
        assert c.children == []  # nothing was left running


def test_instance_port_conflict_reports_the_setting(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "kvcake", "decode", "--backend", "emulated", "--port",
             str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert r.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "instance.port" in r.stderr


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[cluster]\nprefill = 0\n[instance]\nbackend = "gpu"\n')
    r = subprocess.run([sys.executable, "-m", "kvcake", "up", "--config", str(bad)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "kvcake: error:" in r.stderr
    assert "cluster.prefill" in r.stderr or "instance.backend" in r.stderr


def test_toml_dump_round_trips(tmp_path: Path) -> None:
    from kvcake.serve.launcher import load_serve_file

    conf = load_serve_file(None, {"proxy": {"prefill": ("http://a:1",), "ttft_slo_s": 2.5}})
    p = tmp_path / "c.toml"
    p.write_text(toml_dump({"kv": conf.kv, "cluster": conf.cluster, "proxy": conf.proxy}))
    again = load_serve_file(p)
    assert again.proxy == conf.proxy and again.cluster == conf.cluster


def test_paper_tbt() -> None:
    assert paper_tbt([0.0]) is None
    times = [0.0, *[0.1 * i for i in range(1, 20)], 3.0]  # 19 gaps of 0.1 and one of 1.1
    assert paper_tbt(times) == pytest.approx((1.1 + 0.1) / 2)


def test_replay_against_cluster(emulated_cluster: Cluster) -> None:
    recs = [
        TraceRecord(0.0, 1024, 4, (1, 2)),
        TraceRecord(1500.0, 1536, 3, (1, 2, 3)),  # shares 2 blocks with the first
        TraceRecord(1600.0, 9000, 2, tuple(range(100, 118))),  # beyond the context: dropped
    ]
    opts = ReplayOptions(url=emulated_cluster.url, tokens_per_block=32, max_context=512)
    s = asyncio.run(run_replay(recs, opts))
    assert (s.requests, s.completed, s.dropped, s.errors) == (3, 2, 1, 0)
    first, second = s.per_request[:2]
    assert (first.prompt_tokens, second.prompt_tokens) == (64, 96)
    assert second.cached_tokens == 64 and first.output_tokens == 4
    assert s.ttft_p50 > 0 and 0 < s.effective_capacity <= 1


def test_compare_sim_predicts_the_same_cluster() -> None:
    from kvcake.core.trace import read_trace
    from kvcake.data import sample_trace_path
    from kvcake.serve.compare_sim import simulate_like
    from kvcake.serve.config import default_cluster_file
    from kvcake.serve.launcher import load_serve_file
    from kvcake.serve.replay import prepare, summarize

    conf = load_serve_file(default_cluster_file().with_name("emulated.toml"))
    recs = read_trace(sample_trace_path(), limit=30)
    opts = ReplayOptions(url="http://unused", max_context=65536, max_output=32)
    reqs, _ = prepare(recs, opts)
    dropped = sum(r.status == "dropped" for r in reqs)
    pred = simulate_like(recs, summarize(reqs, 1.0, opts), conf, opts)
    assert pred["completed"] + pred["rejected"] == len(recs) - dropped
    assert 0 < pred["ttft_p50"] < 60 and 0 < pred["tbt_p50"] < 1
