"""``kvcake replay --compare-sim`` end to end: a short replay on a live emulated cluster (1P+1D
and a store), the overhead probe, the simulated counterpart with the live-path model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from kvcake.launch.launcher import Cluster, load_serve_file

CONF = """
[kv]
model = "emulated-llama3-70b"
kv_block_tokens = 32
[cluster]
prefill = 1
decode = 1
proxy_port = 0
store_servers = 1
store_size = "64MB"
run_dir = "{run}"
startup_timeout_s = 240.0
[instance]
backend = "emulated"
kv_blocks = 1024
threads = 1
max_context = 8192
[proxy]
poll_interval_s = 0.05
[conductor]
admission_policy = "none"
"""


def test_compare_sim_runs_on_a_live_cluster(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    (tmp_path / "runs").mkdir()
    conf.write_text(CONF.format(run=tmp_path / "runs"))
    out = tmp_path / "cmp.json"
    with Cluster(load_serve_file(conf), run_dir=tmp_path / "run", quiet=True) as c:
        p = subprocess.run(
            [sys.executable, "-m", "kvcake", "replay", "--url", c.url, "--limit", "8",
             "--tokens-per-block", "32", "--max-output", "8", "--max-context", "8192",
             "--compare-sim", "--cluster-config", str(conf), "--orders", "2",
             "--json", str(out)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "overheads: gate held" in p.stdout and "measured vs simulated" in p.stdout
    doc = json.loads(out.read_text())
    m, s, o = doc["measured"], doc["simulated"], doc["overheads"]
    assert m["completed"] == 8 and s["completed"] == 8
    assert all(o[k] >= 0 for k in ("dispatch_s", "first_token_s", "tbt_extra_s"))
    for k in ("ttft_p50", "ttft_p90", "tbt_p50"):
        assert math.isfinite(s[k]) and s[k] > 0 and m[k] > 0
    assert s["cpu_slowdown"] == 1.0  # the emulated backend sleeps: no compute CPU to share
    assert doc["cores"] >= 1 and len(doc["load_before"]) == 3


def test_compare_sim_refuses_a_vllm_cluster_file() -> None:
    from kvcake.serve.config import default_cluster_file

    vllm = default_cluster_file().with_name("vllm.toml")
    p = subprocess.run(
        [sys.executable, "-m", "kvcake", "replay", "--url", "http://127.0.0.1:1", "--compare-sim",
         "--cluster-config", str(vllm)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2 and "vLLM-backed cluster" in p.stderr, p.stderr
