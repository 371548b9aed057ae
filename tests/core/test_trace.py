import itertools
import json
from pathlib import Path

import pytest

from kvcake.core.errors import TraceError
from kvcake.core.hashing import block_hashes
from kvcake.core.synth import SynthConfig, generate
from kvcake.core.trace import (
    TraceRecord,
    parse_line,
    read_trace,
    scale_time,
    subsample,
    time_window,
    tokens_from_hash_ids,
    trace_stats,
    write_trace,
)
from kvcake.data import sample_trace_path


def test_bundled_sample_parses() -> None:
    recs = read_trace(sample_trace_path())
    assert len(recs) == 3500
    assert recs[0] == TraceRecord(0.0, 6758, 500, tuple(range(14)))
    assert sample_trace_path().stat().st_size <= 1_000_000


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "hash_ids"),
        ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "timestamp"),
        (
            '{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]}',
            "input_length",
        ),
        (
            '{"timestamp": 0, "input_length": "5", "output_length": 1, "hash_ids": [1]}',
            "input_length",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": true, "hash_ids": [1]}',
            "output_length",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, -2]}',
            "hash_ids",
        ),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "1"}', "hash_ids"),
    ],
)
def test_bad_fields_named(line: str, field: str) -> None:
    with pytest.raises(TraceError) as info:
        parse_line(line, 7)
    assert info.value.line == 7 and info.value.field == field
    assert "line 7" in str(info.value)


@pytest.mark.parametrize("line", ["not json", "[1, 2]", "{"])
def test_bad_lines(line: str) -> None:
    with pytest.raises(TraceError, match="line 3"):
        parse_line(line, 3)


def test_bad_line_in_file_is_located(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}'
    p.write_text(good + "\n\n" + good + "\n" + good.replace("5", "-5") + "\n")
    with pytest.raises(TraceError, match="line 4.*input_length"):
        read_trace(p)
    with pytest.raises(TraceError, match="not found"):
        read_trace(tmp_path / "missing.jsonl")


def test_roundtrip_scale_window_subsample(tmp_path: Path) -> None:
    recs = read_trace(sample_trace_path(), limit=200)
    p = tmp_path / "out.jsonl"
    assert write_trace(recs, p) == 200
    assert read_trace(p) == recs
    fast = scale_time(recs, 2.0)
    assert fast[-1].timestamp_ms == recs[-1].timestamp_ms / 2
    win = time_window(recs, 3000, 9000)
    assert all(0 <= r.timestamp_ms < 6000 for r in win) and win
    sub = subsample(recs, n=50, seed=1)
    assert len(sub) == 50 and sub == subsample(recs, n=50, seed=1)
    assert [recs.index(r) for r in sub] == sorted(recs.index(r) for r in sub)
    assert json.loads(recs[0].to_json())["timestamp"] == 0


def test_stats_hand_computed() -> None:
    recs = [TraceRecord(0, 10, 1, (1, 2)), TraceRecord(1000, 10, 3, (1, 3))]
    st = trace_stats(recs)
    assert st.cache_ratio == 0.25 and st.unique_blocks == 3 and st.avg_output == 2.0


def test_tokens_equal_ids_equal_blocks_for_any_block_size() -> None:
    a = tokens_from_hash_ids([0, 1, 2], 1536, tokens_per_block=64)
    b = tokens_from_hash_ids([0, 1, 9], 1536, tokens_per_block=64)
    c = tokens_from_hash_ids([0, 1, 9], 1500, tokens_per_block=64)
    assert len(a) == len(b) == 192 and len(c) == 188  # ceil(1500 * 64 / 512)
    assert a[:128] == b[:128] and a[128:] != b[128:] and c == b[:188]
    for bs in (16, 32, 64):
        ha, hb = block_hashes(a, bs), block_hashes(b, bs)
        shared = 128 // bs
        assert ha[:shared] == hb[:shared] and ha[shared] != hb[shared]
    assert tokens_from_hash_ids([0, 1], 600, seed=1) != tokens_from_hash_ids([0, 1], 600, seed=2)
    assert min(a) >= 256


def test_synthetic_generator_shapes() -> None:
    cfg = SynthConfig(requests=300, seed=3)
    recs = generate(cfg)
    assert len(recs) == 300 and recs == generate(cfg)
    assert all(r1.timestamp_ms <= r2.timestamp_ms for r1, r2 in itertools.pairwise(recs))
    st = trace_stats(recs)
    assert 0.3 < st.cache_ratio < 0.95  # shared system prompts + growing sessions
    # Prefix property: a shared id at position i implies the whole prefix is shared.
    pos: dict[int, tuple[int, ...]] = {}
    for r in recs:
        for i, h in enumerate(r.hash_ids):
            assert pos.setdefault(h, r.hash_ids[: i + 1]) == r.hash_ids[: i + 1]
    with pytest.raises(ValueError):
        SynthConfig(rate=0)
