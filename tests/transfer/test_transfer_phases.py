"""benchmarks/transfer_phases.py: its summary logic, and tiny real runs against both peers."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "transfer_phases.py"


@pytest.fixture(scope="module")
def phases() -> dict[str, Any]:
    return runpy.run_path(str(SCRIPT))


def row(ns: dict[str, Any], mean: float, stacked: float) -> Any:
    return ns["PhaseRow"](mean, mean, mean, mean, 1.0, 1.0, stacked)


def test_summary_counts_slow_and_stacked_rows(phases: dict[str, Any]) -> None:
    rows = [row(phases, m, s) for m, s in [(200, 0), (210, 0), (190, 0.1), (400, 0.9), (350, 0)]]
    text = phases["summary"](rows)
    # median 210 -> slow above 315: the 400 (stacked) and the 350 (not stacked) rows
    assert "median row 210 us/batch" in text
    assert "2 slow rows (> 315 us), 1 of them stacked" in text


def spinner(cpu: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )


@pytest.mark.parametrize("apart", [False, True])
def test_placement_tells_shared_from_separate_cpus(phases: dict[str, Any], apart: bool) -> None:
    """Two busy processes pinned to one CPU are always 'stacked', pinned apart never."""
    cpus = sorted(os.sched_getaffinity(0))
    if apart and len(cpus) < 2:
        pytest.skip("needs two CPUs")
    a = spinner(cpus[0])
    b = spinner(cpus[1] if apart else cpus[0])
    try:
        where = phases["Placement"](a.pid, b.pid, 0.02)
        try:
            time.sleep(0.5)
            samples = where.both
            share = where.take()
        finally:
            where.stop()
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
    assert samples >= 5  # 0.5 s at one sample per 20 ms, both processes busy
    assert share == (0.0 if apart else 1.0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("peer", ["kvcake", "socket"])
def test_tiny_run_writes_rows(phases: dict[str, Any], peer: str, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    argv = ["--peer", peer, "--block", "4K", "--rows", "2", "--batches", "30", "--warmup", "5"]
    assert phases["main"]([*argv, "--sample-ms", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2
    for r in rows:
        assert 0 < r["p50_us"] <= r["max_us"]
        assert r["initiator_cpu_us"] > 0
        assert 0.0 <= r["stacked"] <= 1.0


def test_bad_arguments_exit_with_usage(phases: dict[str, Any]) -> None:
    with pytest.raises(SystemExit) as e:
        phases["main"](["--rows", "0"])
    assert e.value.code == 2
