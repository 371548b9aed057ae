"""``kvcake logs`` on a request log written by the proxy's own writer (serve.reqlog): filters,
rotation, malformed arguments and lines; and the log read back as a trace for ``kvcake plan``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from kvcake.cli import main
from kvcake.core.errors import TraceError
from kvcake.core.requestlog import read_request_log, to_trace
from kvcake.proxy.reqlog import RequestLog

NOW = time.time()


def rec(i: int, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "v": 1, "timestamp": NOW - 3600 + i * 60, "request_id": f"req-{i}", "outcome": "length",
        "prefill": "prefill-0", "decode": "decode-0", "prompt_tokens": 100, "output_tokens": 4,
        "ttft_s": 0.1 * i, "block_tokens": 32,
        "block_hashes": [f"{i:016x}", f"{100 + i:016x}", f"{200 + i:016x}"],
        "tail_hash": f"{300 + i:016x}",
        "kv": {"local_tokens": 0, "pool_dram_tokens": {}, "ssd_tokens": 0,
               "computed_tokens": 100, "miss_reasons": {"never_seen": 96, "last_block": 4}},
    }  # fmt: skip
    base.update(kw)
    return base


@pytest.fixture
def log(tmp_path: Path) -> Path:
    global NOW  # "now" of the records: at the test, not at import (--since is relative)
    NOW = time.time()
    path = tmp_path / "requests.jsonl"
    w = RequestLog(path)
    for i in range(6):
        w.write(rec(i))
    pool = {"local_tokens": 32, "pool_dram_tokens": {"store-0": 64}, "ssd_tokens": 0,
            "computed_tokens": 4, "miss_reasons": {"last_block": 4}}  # fmt: skip
    w.write(rec(6, prefill="prefill-1", kv=pool))
    w.write(rec(7, outcome="rejected", prefill=None, decode=None, ttft_s=None, kv=None,
                tenant="acme", error="ttft_slo"))  # fmt: skip
    w.close()
    return path


def ids(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert main(["logs", *args, "--json"]) == 0
    return [json.loads(line)["request_id"] for line in capsys.readouterr().out.splitlines()]


def test_rotation_is_bounded_and_read_oldest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.jsonl"
    w = RequestLog(path, max_bytes=4096, backups=2)
    for i in range(40):
        w.write(rec(i))
    w.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    # the live file (absent right after a rotation), two backups; older ones dropped
    assert {"r.jsonl.1", "r.jsonl.2"} <= set(names) <= {"r.jsonl", "r.jsonl.1", "r.jsonl.2"}
    got = ids(capsys, "--file", str(path), "--limit", "0")
    nums = [int(g.split("-")[1]) for g in got]
    assert nums == sorted(nums) and nums[-1] == 39 and len(nums) < 40
    with pytest.raises(ValueError):
        RequestLog(path, max_bytes=10)


def test_filters(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = ["--file", str(log)]
    assert ids(capsys, *f) == [f"req-{i}" for i in range(8)]
    assert ids(capsys, *f, "--id", "req-3") == ["req-3"]
    assert ids(capsys, *f, "--outcome", "rejected") == ["req-7"]
    assert ids(capsys, *f, "--outcome", "rejected,length", "--limit", "2") == ["req-6", "req-7"]
    assert ids(capsys, *f, "--instance", "prefill-1") == ["req-6"]
    assert ids(capsys, *f, "--tenant", "acme") == ["req-7"]
    assert ids(capsys, *f, "--min-ttft", "0.45") == ["req-5", "req-6"]
    assert ids(capsys, *f, "--tier", "pool_dram") == ["req-6"]
    assert ids(capsys, *f, "--tier", "local") == ["req-6"]
    assert ids(capsys, *f, "--reason", "never_seen", "--since", "57m") == ["req-4", "req-5"]
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(NOW - 3600 + 5 * 60 - 1))
    assert ids(capsys, *f, "--since", when) == ["req-5", "req-6", "req-7"]


def test_table_output(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["logs", "--file", str(log), "--instance", "prefill-1"]) == 0
    out = capsys.readouterr().out
    assert "req-6" in out and "store-0:64" in out and "req-5" not in out
    assert "error" not in out  # no failed request shown: no error column


def test_errors_show_their_reason(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w = RequestLog(log)
    w.write(rec(8, outcome="error", prefill="prefill-0", decode=None, ttft_s=None, kv=None,
                error="prefill-0: unknown segment 'kv/decode-0'"))  # fmt: skip
    w.close()
    assert main(["logs", "--file", str(log), "--outcome", "error,rejected"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the reason may wrap
    assert "req-7" in out and "ttft_slo" in out
    assert "req-8" in out and "unknown segment" in out and "kv/decode-0" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-ttft", "soon"], "--min-ttft 'soon': not a number"),
        (["--min-ttft", "-1"], "must be a number >= 0"),
        (["--outcome", "done"], "--outcome: unknown done"),
        (["--tier", "hbm"], "--tier 'hbm': give one of local"),
        (["--reason", "bad_luck"], "--reason 'bad_luck'"),
        (["--since", "yesterday"], "--since 'yesterday': give a duration"),
        (["--since", "-5"], "non-negative"),
        (["--limit", "-1"], "--limit -1"),
    ],
)
def test_malformed_filters_say_what_to_fix(
    log: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["logs", "--file", str(log), *args]) == 2
    assert message in capsys.readouterr().err


def test_missing_file_and_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["logs", "--file", str(tmp_path / "nope.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["logs", "--state", str(tmp_path / "latest.json")]) == 2
    assert "kvcake up" in capsys.readouterr().err


def test_torn_line_is_skipped(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with log.open("a") as f:
        f.write('{"v": 1, "request_id": "req-torn", "timest')
    assert "req-torn" not in ids(capsys, "--file", str(log))


def test_log_reads_as_a_trace(log: Path) -> None:
    reqs = read_request_log(log)
    trace = to_trace(reqs, lambda m: [], lambda t: [], block_tokens=64)
    assert len(trace) == 8
    r0 = trace[0]
    assert r0.input_length == 100 and len(r0.hash_ids) == 2  # 64-token blocks: 0-63, 64-99
    assert len({t.hash_ids[0] for t in trace}) == len(trace)  # different prompts
    with pytest.raises(TraceError, match="multiple"):
        to_trace(reqs, lambda m: [], lambda t: [], block_tokens=48)


def test_malformed_hashed_records(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(rec(0, block_hashes=["xyz"])) + "\n")
    with pytest.raises(TraceError, match="block_hashes"):
        read_request_log(p)
    p.write_text(json.dumps(rec(0, tail_hash=None)) + "\n")
    with pytest.raises(TraceError, match="tail_hash"):
        read_request_log(p)
    p.write_text(json.dumps(rec(0, prompt_tokens=0)) + "\n")
    with pytest.raises(TraceError, match="prompt_tokens"):
        read_request_log(p)
