"""Mooncake trace I/O: the JSONL format, time scaling, sub-sampling, statistics, and token
synthesis from ``hash_ids``.

One line per request: ``{"timestamp": ms, "input_length": int, "output_length": int,
"hash_ids": [int, ...]}``. ``hash_ids`` name the prompt's 512-token blocks *as prefixes*: two
requests share block id ``k`` at position ``i`` only if their first ``i+1`` blocks are equal. The
synthetic generator lives in :mod:`kvcake.core.synth` and writes the same format.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvcake.core.errors import TraceError

TRACE_BLOCK_TOKENS = 512
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def to_json(self) -> str:
        ts: float | int = (
            int(self.timestamp_ms) if float(self.timestamp_ms).is_integer() else self.timestamp_ms
        )
        return json.dumps(
            {
                "timestamp": ts,
                "input_length": self.input_length,
                "output_length": self.output_length,
                "hash_ids": list(self.hash_ids),
            }
        )


def _int_field(obj: dict[str, object], name: str, line: int, minimum: int) -> int:
    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"must be an integer, got {v!r}", line=line, field=name)
    if v < minimum:
        raise TraceError(f"must be >= {minimum}, got {v}", line=line, field=name)
    return v


def json_object(text: str, line: int) -> dict[str, Any]:
    """One JSONL line as a JSON object, or a TraceError naming the line."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"not valid JSON ({exc.msg})", line=line) from exc
    if not isinstance(obj, dict):
        raise TraceError("must be a JSON object", line=line)
    return obj


def parse_line(text: str, line: int = 1) -> TraceRecord:
    """Parse and validate one JSONL line; errors name the line and the field."""
    obj = json_object(text, line)
    missing = [f for f in _FIELDS if f not in obj]
    if missing:
        raise TraceError("missing", line=line, field=missing[0])
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise TraceError(
            f"must be a non-negative number of ms, got {ts!r}", line=line, field="timestamp"
        )
    inp = _int_field(obj, "input_length", line, 1)
    out = _int_field(obj, "output_length", line, 0)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids
    ):
        raise TraceError("must be a list of non-negative integers", line=line, field="hash_ids")
    return TraceRecord(float(ts), inp, out, tuple(ids))


def iter_trace(path: str | os.PathLike[str]) -> Iterator[TraceRecord]:
    with Path(path).open(encoding="utf-8") as fh:
        for n, text in enumerate(fh, start=1):
            if text.strip():
                yield parse_line(text, n)


def read_trace(path: str | os.PathLike[str], limit: int | None = None) -> list[TraceRecord]:
    """All records (or the first ``limit``), in file order."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file {p} not found")
    out: list[TraceRecord] = []
    for rec in iter_trace(p):
        if limit is not None and len(out) >= limit:
            break
        out.append(rec)
    return out


def write_trace(records: Iterable[TraceRecord], path: str | os.PathLike[str]) -> int:
    n = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(rec.to_json() + "\n")
            n += 1
    return n


def scale_time(records: Iterable[TraceRecord], speedup: float) -> list[TraceRecord]:
    """Replay ``speedup`` times faster (timestamps divided by ``speedup``)."""
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    return [
        TraceRecord(r.timestamp_ms / speedup, r.input_length, r.output_length, r.hash_ids)
        for r in records
    ]


def subsample(
    records: Sequence[TraceRecord],
    *,
    fraction: float | None = None,
    n: int | None = None,
    seed: int = 0,
) -> list[TraceRecord]:
    """A seeded random subset, in the original order (``fraction`` or ``n`` records)."""
    if (fraction is None) == (n is None):
        raise ValueError("give exactly one of fraction or n")
    k = round(len(records) * fraction) if fraction is not None else int(n or 0)
    if not 0 <= k <= len(records):
        raise ValueError(f"cannot take {k} of {len(records)} records")
    idx = np.sort(np.random.default_rng(seed).choice(len(records), size=k, replace=False))
    return [records[i] for i in idx]


def time_window(
    records: Iterable[TraceRecord], start_ms: float, end_ms: float
) -> list[TraceRecord]:
    """Records with ``start_ms <= timestamp < end_ms``, re-based to start at 0."""
    return [
        TraceRecord(r.timestamp_ms - start_ms, r.input_length, r.output_length, r.hash_ids)
        for r in records
        if start_ms <= r.timestamp_ms < end_ms
    ]


@dataclass(frozen=True)
class TraceStats:
    requests: int
    duration_s: float
    avg_input: float
    avg_output: float
    cache_ratio: float  # share of prompt blocks seen before (unbounded cache)
    unique_blocks: int


def trace_stats(records: Sequence[TraceRecord]) -> TraceStats:
    seen: set[int] = set()
    hits = total = 0
    for r in records:
        for h in r.hash_ids:
            total += 1
            if h in seen:
                hits += 1
            else:
                seen.add(h)
    n = max(len(records), 1)
    return TraceStats(
        requests=len(records),
        duration_s=(max((r.timestamp_ms for r in records), default=0.0)) / 1000.0,
        avg_input=sum(r.input_length for r in records) / n,
        avg_output=sum(r.output_length for r in records) / n,
        cache_ratio=hits / total if total else 0.0,
        unique_blocks=len(seen),
    )


def block_tokens_for(
    hash_id: int, tokens_per_block: int, vocab_size: int, seed: int = 0, low: int = 256
) -> np.ndarray:
    """The token block a hash id stands for: deterministic in (seed, hash_id), ids in
    ``[low, vocab_size)`` so special tokens never appear."""
    rng = np.random.default_rng([seed, hash_id])
    return rng.integers(low, vocab_size, size=tokens_per_block, dtype=np.int64)


def tokens_from_hash_ids(
    hash_ids: Sequence[int],
    input_length: int,
    *,
    trace_block_tokens: int = TRACE_BLOCK_TOKENS,
    tokens_per_block: int | None = None,
    vocab_size: int = 49152,
    seed: int = 0,
) -> list[int]:
    """Synthesise a prompt whose blocks follow ``hash_ids``: equal ids give equal token blocks.

    ``tokens_per_block`` (default ``trace_block_tokens``) scales the trace down for small models;
    the prompt then has ``ceil(input_length * tokens_per_block / trace_block_tokens)`` tokens.
    Any engine block size that divides ``tokens_per_block`` keeps the trace's prefix sharing.
    """
    tpb = tokens_per_block or trace_block_tokens
    if tpb <= 0 or trace_block_tokens <= 0:
        raise ValueError("block sizes must be positive")
    if not hash_ids:
        raise ValueError("hash_ids is empty")
    want = max(1, math.ceil(input_length * tpb / trace_block_tokens))
    want = min(want, len(hash_ids) * tpb)
    parts = [block_tokens_for(h, tpb, vocab_size, seed) for h in hash_ids[: math.ceil(want / tpb)]]
    return [int(t) for t in np.concatenate(parts)[:want]]
