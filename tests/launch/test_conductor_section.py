"""One TOML ``[conductor]`` section drives a simulator run and a live proxy (issue 10 §3)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import httpx

from kvcake.core.trace import TraceRecord, write_trace
from kvcake.launch.launcher import Cluster, load_serve_file
from kvcake.sim.config import load_sim_config


def test_one_section_for_the_simulator_and_the_live_proxy(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'[cluster]\nproxy_port = 0\nstore_servers = 0\nrun_dir = "{tmp_path}"\n'
        '[instance]\nbackend = "emulated"\nkv_blocks = 256\n'
        "[proxy]\npoll_interval_s = 0.05\n"
        "[sim]\nprefill_nodes = 1\ndecode_nodes = 1\n"
        '[conductor]\nprefill_policy = "random"\nadmission_policy = "early-rejection"\n'
        "ttft_slo_s = 40.0\ntbt_slo_s = 2.0\nkvcache_balancing_threshold = 3.5\nseed = 11\n"
    )
    sim = load_sim_config(path).conductor
    assert (sim.kvcache_balancing_threshold, sim.seed, sim.prefill_policy) == (3.5, 11, "random")
    out, trace = tmp_path / "sim.json", tmp_path / "trace.jsonl"
    write_trace([TraceRecord(i * 500.0, 1024, 8, (i % 3, 100 + i)) for i in range(40)], trace)
    r = subprocess.run([sys.executable, "-m", "kvcake", "sim", "run", "--config", str(path),
                        "--trace", str(trace), "--json", str(out)],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(out.read_text())["completed"] == 40
    with Cluster(load_serve_file(path), run_dir=tmp_path / "run", quiet=True) as c:
        # the proxy builds its conductor once an instance answered; /v1/cluster shows it
        body = {"prompt": [300] * 40, "max_tokens": 2}
        assert httpx.post(c.url + "/v1/completions", json=body, timeout=60).status_code == 200
        live = httpx.get(c.url + "/v1/cluster", timeout=10).json()["conductor"]
    assert live == {**asdict(sim), "colocated": False}
