"""The ``kvcake`` command as a user runs it: real subprocesses."""

import subprocess
import sys
from pathlib import Path

import pytest

from kvcake.cli import main


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvcake", *args], capture_output=True, text=True, timeout=120
    )


def test_help_lists_commands() -> None:
    out = run("--help")
    assert out.returncode == 0
    for cmd in ("demo", "trace", "bench"):
        assert cmd in out.stdout


def test_no_command_prints_help_and_fails() -> None:
    assert main([]) == 2


def test_trace_stats_and_cut(tmp_path: Path) -> None:
    out = run("trace", "stats")
    assert out.returncode == 0 and "3,500" in out.stdout
    cut = tmp_path / "cut.jsonl"
    res = run(
        "trace",
        "cut",
        "data/conversation_sample.jsonl",
        str(cut),
        "--end-s",
        "60",
        "--speedup",
        "2",
    )
    assert res.returncode == 0, res.stderr
    assert cut.read_text().count("\n") > 10


def test_trace_errors_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    res = run("trace", "stats", str(bad))
    assert res.returncode == 2
    assert "line 1" in res.stderr and "input_length" in res.stderr
    assert "Traceback" not in res.stderr


def test_synth_writes_trace(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    res = run("trace", "synth", str(out), "--requests", "50", "--seed", "2")
    assert res.returncode == 0, res.stderr
    assert out.read_text().count("\n") == 50


def test_bench_unknown_name() -> None:
    with pytest.raises(SystemExit):
        main(["bench"])
    assert main(["bench", "no-such-bench"]) == 2
