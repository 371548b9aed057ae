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


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("vllm-proxy", ["usage: kvcake vllm-proxy", "--prefill", "--decode", "--master"]),
        ("netns-up", ["usage: kvcake netns-up", "--stores", "--delay-ms"]),
        ("netns-relay", ["usage: kvcake netns-relay", "--route", "--delay-ms"]),
        ("mooncake-master", ["stand-in for Mooncake's mooncake_master", "-rpc_port"]),
        ("mooncake-client", ["stand-in for Mooncake's mooncake_client", "-master_server_address"]),
        ("mooncake-transfer-engine-bench", ["transfer_engine_bench", "--operation"]),
        ("mooncake-metadata-server", ["usage: kvcake mooncake-metadata-server", "--port"]),
    ],
)
def test_process_entry_points_are_sub_commands(command: str, says: list[str]) -> None:
    """Every process kvcake starts is a ``kvcake`` sub-command whose --help is the process's own
    (the module's parser, reached through the real CLI). Mooncake's gflags programs exit 1 after
    --help, as Mooncake's do."""
    assert command in run("--help").stdout
    out = run(command, "--help")
    assert out.returncode == (1 if command in ("mooncake-master", "mooncake-client") else 0), (
        out.stderr
    )
    for text in says:
        assert text in out.stdout, (text, out.stdout[:400])


def test_program_sub_command_passes_its_arguments() -> None:
    """Arguments after the sub-command reach the program's parser: a bad one is its error."""
    out = run("netns-relay", "--route", "127.0.0.1:0=127.0.0.1:1", "--delay-ms", "-1")
    assert out.returncode == 2
    assert "usage: kvcake netns-relay" in out.stderr and "--delay-ms >= 0" in out.stderr
