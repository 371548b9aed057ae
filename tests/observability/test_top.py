"""``kvcake top``: one frame captured from a scripted run against the live cluster, its figures
checked against the proxy's own endpoints; rates between two snapshots; unreachable parts."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from rich.console import Console

from kvcake.core.promtext import parse_metrics, total
from kvcake.launch.launcher import Cluster
from kvcake.proxy.top_view import Snapshot, render

PROMPT = "kvcake top draws the cluster every second " * 6


def run_top(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="220")
    return subprocess.run([sys.executable, "-m", "kvcake", "top", "--once", *args],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip


def test_one_frame_matches_the_cluster(emulated_cluster: Cluster) -> None:
    c = emulated_cluster
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    for _ in range(2):
        assert httpx.post(c.url + "/v1/completions", json=body, timeout=60).status_code == 200
    r = run_top("--state", str(Path(c.run_dir) / "cluster.json"))
    assert r.returncode == 0, r.stderr
    frame = r.stdout
    view = httpx.get(c.url + "/v1/cluster").json()
    m = parse_metrics(httpx.get(c.url + "/metrics").text)
    for row in view["instances"]:
        line = next(ln for ln in frame.splitlines() if row["id"] in ln)
        assert row["role"] in line and f"{row['kv_used']}/{row['kv_total']}" in line
    hits, q = (
        total(m, "kvcake:prefix_cache_hits_total"),
        total(m, "kvcake:prefix_cache_queries_total"),
    )
    assert hits > 0
    assert f"{100 * hits / q:.1f}%" in frame  # nothing else talks to the proxy in between
    assert "pool (master)" in frame and re.search(r"store-0\s.*MiB", frame)
    assert re.search(r"kvcake top\s+\S+\s+ready\b", frame), frame


def test_rate_over_the_last_interval() -> None:
    def snap(h: float, q: float) -> Snapshot:
        p = {
            ("kvcake:prefix_cache_hits_total", ()): h,
            ("kvcake:prefix_cache_queries_total", ()): q,
        }
        return Snapshot(0.0, {"ready": True, "instances": []}, p)

    con = Console(width=200, record=True)
    con.print(render(snap(30, 100), prev=snap(10, 20)))  # 20 of the last 80 tokens hit
    out = con.export_text()
    assert "30.0%" in out and "25.0%" in out


def test_unreachable_proxy_is_reported_not_raised() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run_top("--url", f"http://127.0.0.1:{port}")
    assert r.returncode == 1
    assert f"proxy http://127.0.0.1:{port}" in r.stdout


def test_missing_state_file_says_what_to_do(tmp_path: Path) -> None:
    r = run_top("--state", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "kvcake up" in r.stderr
