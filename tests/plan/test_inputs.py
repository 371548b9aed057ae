"""Inputs of ``kvcake plan``: request logs converted to hash_ids, malformed input, bad traces,
and the CLI end to end on a tiny trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvcake.cli import main
from kvcake.core.errors import ConfigError, TraceError
from kvcake.core.requestlog import BlockNamer, parse_request, read_request_log, to_trace
from kvcake.core.trace import read_trace


def _encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def _chat(msgs) -> list[int]:  # type: ignore[no-untyped-def]
    return _encode("".join(f"<{m['role']}>{m['content']}" for m in msgs))


def test_block_namer_names_prefixes_not_contents() -> None:
    n = BlockNamer(block_tokens=2)
    assert n.hash_ids([1, 2, 3, 4, 5]) == (0, 1, 2)
    assert n.hash_ids([1, 2, 3, 4, 9]) == (0, 1, 3)  # shared prefix, new tail
    assert n.hash_ids([3, 4, 1, 2]) == (4, 5)  # same block contents, other prefix: new ids


def test_request_log_converts_to_a_mooncake_trace(tmp_path: Path) -> None:
    system = "You are a helpful assistant. " * 40
    lines = [
        {"timestamp": 1700000000.0, "messages": [{"role": "system", "content": system},
                                                 {"role": "user", "content": "hi"}],
         "usage": {"completion_tokens": 12}},
        {"timestamp": "2023-11-14T22:13:21Z", "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": "bye"}],
         "response": "see you"},
        {"timestamp": 1700000002.5, "prompt_token_ids": [5] * 600, "output_tokens": 3},
    ]  # fmt: skip
    p = tmp_path / "log.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    recs = to_trace(read_request_log(p), _chat, _encode, block_tokens=512)
    assert [r.timestamp_ms for r in recs] == [0.0, 1000.0, 2500.0]
    a, b, c = recs
    assert a.output_length == 12 and b.output_length == len("see you") and c.output_length == 3
    assert a.input_length == len(_chat([{"role": "system", "content": system},
                                        {"role": "user", "content": "hi"}]))  # fmt: skip
    assert a.hash_ids[0] == b.hash_ids[0] and a.hash_ids[-1] != b.hash_ids[-1]
    assert len(c.hash_ids) == 2 and c.input_length == 600


@pytest.mark.parametrize(
    ("line", "msg"),
    [
        ("{not json", "not valid JSON"),
        ('{"messages": [{"role": "u", "content": "x"}], "output_tokens": 1}', "timestamp"),
        ('{"timestamp": -1, "prompt": "x", "output_tokens": 1}', "non-negative"),
        ('{"timestamp": "yesterday", "prompt": "x", "output_tokens": 1}', "ISO-8601"),
        ('{"timestamp": 1, "prompt": "x"}', "no output length"),
        ('{"timestamp": 1, "output_tokens": 1}', "no prompt"),
        ('{"timestamp": 1, "messages": [{"role": 1}], "output_tokens": 1}', "messages"),
        ('{"timestamp": 1, "prompt_token_ids": [], "output_tokens": 1}', "prompt_token_ids"),
        ('{"timestamp": 1, "prompt": "x", "output_tokens": true}', "output_tokens"),
    ],
)
def test_malformed_request_lines_name_the_problem(line: str, msg: str) -> None:
    with pytest.raises(TraceError, match=msg):
        parse_request(line, 7)


@pytest.mark.parametrize(
    ("content", "msg"),
    [
        (b"", "no requests"),
        (b"\n\n", "no requests"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (
            b'{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n' * 3,
            "same timestamp",
        ),
    ],
)
def test_bad_traces_are_clear_errors_in_plan_and_sim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, msg: str
) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(content)
    assert main(["plan", str(p), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert msg in capsys.readouterr().err
    assert main(["sim", "experiment", "pd-ratio", "--trace", str(p), "--out",
                 str(tmp_path / "o")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_plan_cli_end_to_end_on_a_tiny_trace(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "tiny.jsonl"
    lines = [{"timestamp": i * 0.5, "prompt": "shared context " * 100 + str(i),
              "output_tokens": 8} for i in range(40)]  # fmt: skip
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "plan"
    rc = main(["plan", str(src), "--tokenizer", "bytes", "--traffic", "1", "--jobs", "1",
               "--network", "100Gbps", "--max-nodes", "8", "--out", str(out), "--no-progress",
               "--save-trace", str(tmp_path / "conv.jsonl")])  # fmt: skip
    assert rc == 0
    text = (out / "PLAN.md").read_text()
    assert "## Answers" in text and "Does pooling pay off?" in text
    doc = json.loads((out / "plan.json").read_text())
    assert doc["config"]["network_gbps"] == 100.0 and doc["runs"] > 0
    assert len(read_trace(tmp_path / "conv.jsonl")) == 40
    assert "wrote" in capsys.readouterr().out


def test_plan_takes_a_calibration_file_as_hardware(tmp_path: Path) -> None:
    from kvcake.core.costmodel import preset, save_calibration
    from kvcake.sim.plan import PlanConfig, Planner
    from kvcake.sim.plan.search import cost_model_for

    cm = preset("smollm2-135m/cpu")
    fitted = cm.with_coefficients(cm.prefill, cm.decode.__class__(0.02, 0.001, 1e-7))
    cal = tmp_path / "cal.json"
    save_calibration(fitted, cal)
    assert cost_model_for(str(cal)).decode.d0 == 0.02
    recs = read_trace(Path(__file__).parents[2] / "data" / "conversation_sample.jsonl", limit=30)
    pl = Planner(recs, PlanConfig(hardware=str(cal), traffic=(1.0,), jobs=1, max_nodes=4))
    assert pl.base.calibration == str(cal) and pl.base.cost_model().decode.d0 == 0.02
    ctx = int(np.median([r.input_length + r.output_length / 2 for r in recs]))
    assert pl.plan.tbt_slo == pytest.approx(5 * fitted.decode_step_time(1, ctx))
    with pytest.raises(ConfigError, match="--hardware"):
        PlanConfig(hardware=str(tmp_path / "missing.json"))
