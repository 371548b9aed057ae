"""Request logs -> Mooncake trace records, for ``kvcake plan`` on a user's own traffic.

Accepted lines (JSONL, one request each; errors name the line and field):

* OpenAI-style: ``{"timestamp": T, "messages": [{"role": ..., "content": ...}, ...]}`` or
  ``{"timestamp": T, "prompt": "text"}``, plus the output length as ``output_tokens``,
  ``completion_tokens``, ``usage.completion_tokens``, ``max_tokens`` or a ``response`` text.
* Token ids (what kvcake's proxy sees after its chat template): ``{"timestamp": T,
  "prompt_token_ids": [...], "output_tokens": N}``.
* kvcake's own request log (``serve.reqlog``, ``proxy.request_log``): ``{"timestamp": T,
  "prompt_tokens": N, "output_tokens": M, "block_tokens": B, "block_hashes": ["<16 hex>",
  ...], "tail_hash": "<16 hex>" | null, ...}`` — no text needed: the chained block hashes
  already name equal prefixes, so trace block *j* gets the id of the hash that ends it (the
  trace's block size must be a multiple of ``B``).

``T`` is seconds or milliseconds since any origin (values above 1e11 are read as ms, i.e. a
Unix time in ms; smaller values as seconds — pass ``time_unit`` to force one) or an ISO-8601
string. Text is tokenized by the caller's ``encode`` (this module imports no tokenizer, so the
simulator's side stays free of one); token ids are cut into ``block_tokens`` blocks and each
block gets the id of its *prefix* (parent id + block tokens), numbered in order of first
appearance — exactly the Mooncake trace's ``hash_ids`` semantics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kvcake.core.errors import TraceError
from kvcake.core.trace import TRACE_BLOCK_TOKENS, TraceRecord, json_object

MS_THRESHOLD = 1e11  # a timestamp above this is in ms (1e11 s would be the year 5138)


@dataclass(frozen=True)
class LoggedRequest:
    timestamp_s: float
    messages: tuple[tuple[str, str], ...] = ()
    prompt: str | None = None
    token_ids: tuple[int, ...] | None = None
    output_tokens: int | None = None
    response: str | None = None
    # kvcake request logs: the prompt's length, block size and chained block hashes
    prompt_len: int = 0
    block_tokens: int = 0
    block_hashes: tuple[str, ...] = ()
    tail_hash: str | None = None


def is_mooncake_trace(path: str | Path) -> bool:
    """Whether the first non-empty line looks like a Mooncake trace record (has ``hash_ids``);
    raises ``TraceError`` for an empty or non-UTF-8 file."""
    for line in read_lines(path):
        try:
            obj = json.loads(line[1])
        except json.JSONDecodeError as exc:
            raise TraceError(f"not valid JSON ({exc.msg})", line=line[0]) from exc
        return isinstance(obj, dict) and "hash_ids" in obj
    raise TraceError(f"{path}: the file has no requests (empty)")


def read_lines(path: str | Path) -> list[tuple[int, str]]:
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file {p} not found")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{p}: not UTF-8 text (byte {exc.start}: {exc.reason}); give a JSONL file"
        ) from None
    return [(n, s) for n, s in enumerate(text.splitlines(), start=1) if s.strip()]


def _timestamp(v: object, line: int, unit: str) -> float:
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise TraceError(
                f"not a number or ISO-8601 time: {v!r}", line=line, field="timestamp"
            ) from None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise TraceError(f"must be a non-negative number, got {v!r}", line=line, field="timestamp")
    ms = unit == "ms" or (unit == "auto" and v > MS_THRESHOLD)
    return float(v) / 1000.0 if ms else float(v)


def _output(obj: dict[str, Any], line: int) -> int | None:
    usage = obj.get("usage")
    for key, v in (
        ("output_tokens", obj.get("output_tokens")),
        ("completion_tokens", obj.get("completion_tokens")),
        (
            "usage.completion_tokens",
            usage.get("completion_tokens") if isinstance(usage, dict) else None,
        ),
        ("max_tokens", obj.get("max_tokens")),
    ):
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise TraceError(f"must be a non-negative integer, got {v!r}", line=line, field=key)
            return v
    return None


def parse_request(text: str, line: int = 1, time_unit: str = "auto") -> LoggedRequest:
    obj = json_object(text, line)
    if "timestamp" not in obj:
        raise TraceError("missing", line=line, field="timestamp")
    ts = _timestamp(obj["timestamp"], line, time_unit)
    out, resp = _output(obj, line), obj.get("response")
    if resp is not None and not isinstance(resp, str):
        raise TraceError("must be a string", line=line, field="response")
    if out is None and resp is None:
        raise TraceError(
            "no output length: give output_tokens, completion_tokens, "
            "usage.completion_tokens, max_tokens or response",
            line=line,
        )
    if "block_hashes" in obj:
        return _hashed(obj, ts, out, line)
    if "prompt_token_ids" in obj:
        ids = obj["prompt_token_ids"]
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
        ):
            raise TraceError(
                "must be a non-empty list of token ids", line=line, field="prompt_token_ids"
            )
        return LoggedRequest(ts, token_ids=tuple(ids), output_tokens=out, response=resp)
    if "messages" in obj:
        msgs = obj["messages"]
        if (
            not isinstance(msgs, list)
            or not msgs
            or not all(
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
                for m in msgs
            )
        ):
            raise TraceError(
                "must be a non-empty list of {role, content} strings", line=line, field="messages"
            )
        pairs = tuple((m["role"], m["content"]) for m in msgs)
        return LoggedRequest(ts, messages=pairs, output_tokens=out, response=resp)
    if isinstance(obj.get("prompt"), str) and obj["prompt"]:
        return LoggedRequest(ts, prompt=obj["prompt"], output_tokens=out, response=resp)
    raise TraceError("no prompt: give messages, prompt or prompt_token_ids", line=line)


def _is_hex16(v: object) -> bool:
    return isinstance(v, str) and len(v) == 16 and all(c in "0123456789abcdef" for c in v)


def _hashed(obj: dict[str, Any], ts: float, out: int | None, line: int) -> LoggedRequest:
    """A line of kvcake's own request log (see the module doc)."""
    n, bt, hs = obj.get("prompt_tokens"), obj.get("block_tokens"), obj["block_hashes"]
    tail = obj.get("tail_hash")
    for key, v in (("prompt_tokens", n), ("block_tokens", bt)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TraceError(f"must be a positive integer, got {v!r}", line=line, field=key)
    assert isinstance(n, int) and isinstance(bt, int)
    if not isinstance(hs, list) or not all(map(_is_hex16, hs)) or len(hs) != n // bt:
        raise TraceError(
            f"must be the {n // bt} full-block hashes (16 hex digits each) of a "
            f"{n}-token prompt in blocks of {bt}",
            line=line,
            field="block_hashes",
        )
    if (tail is None) != (n % bt == 0) or (tail is not None and not _is_hex16(tail)):
        raise TraceError(
            "must be the partial last block's hash (16 hex digits), or null when "
            "the prompt ends on a block boundary",
            line=line,
            field="tail_hash",
        )
    return LoggedRequest(
        ts,
        output_tokens=out if out is not None else 0,
        prompt_len=n,
        block_tokens=bt,
        block_hashes=tuple(hs),
        tail_hash=tail,
    )


def read_request_log(path: str | Path, time_unit: str = "auto") -> list[LoggedRequest]:
    if time_unit not in ("auto", "s", "ms"):
        raise TraceError(f"time unit must be auto, s or ms, got {time_unit!r}")
    reqs = [parse_request(t, n, time_unit) for n, t in read_lines(path)]
    if not reqs:
        raise TraceError(f"{path}: the file has no requests (empty)")
    return reqs


class BlockNamer:
    """Prefix-chained block ids: block ``i`` of a prompt is named by (id of block ``i-1``, its
    tokens), numbered densely from 0 in order of first appearance."""

    def __init__(self, block_tokens: int = TRACE_BLOCK_TOKENS) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        self.block_tokens = block_tokens
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}

    def hashed_ids(self, r: LoggedRequest) -> tuple[int, ...]:
        """Trace ids of a hashed (kvcake request log) record: trace block *j* is named by the
        chained hash that ends it, so equal ids mean equal prefixes, as for token blocks."""
        bt, n, big = r.block_tokens, r.prompt_len, self.block_tokens
        if big % bt:
            raise TraceError(
                f"the trace's {big}-token blocks are not a multiple of the log's "
                f"{bt}-token blocks: pick a block size that is"
            )
        out: list[int] = []
        for end in range(big, n + big, big):
            end = min(end, n)
            h = r.block_hashes[end // bt - 1] if end % bt == 0 else r.tail_hash
            key = (-2, (int(str(h), 16),))
            out.append(self._ids.setdefault(key, len(self._ids)))
        return tuple(out)

    def hash_ids(self, tokens: Sequence[int]) -> tuple[int, ...]:
        out: list[int] = []
        parent = -1
        bt = self.block_tokens
        for i in range(0, len(tokens), bt):
            key = (parent, tuple(tokens[i : i + bt]))
            parent = self._ids.setdefault(key, len(self._ids))
            out.append(parent)
        return tuple(out)


def to_trace(
    requests: Sequence[LoggedRequest],
    encode_chat: Callable[[Sequence[dict[str, str]]], list[int]],
    encode: Callable[[str], list[int]],
    block_tokens: int = TRACE_BLOCK_TOKENS,
) -> list[TraceRecord]:
    """Mooncake records (timestamps in ms from the first request, sorted by time)."""
    namer = BlockNamer(block_tokens)
    t0 = min(r.timestamp_s for r in requests)
    out = []
    for r in sorted(requests, key=lambda r: r.timestamp_s):
        if r.block_hashes or r.prompt_len:
            ms = round((r.timestamp_s - t0) * 1000.0, 3)
            n_out = r.output_tokens or 0
            out.append(TraceRecord(ms, r.prompt_len, n_out, namer.hashed_ids(r)))
            continue
        if r.token_ids is not None:
            toks: Sequence[int] = r.token_ids
        elif r.messages:
            toks = encode_chat([{"role": a, "content": b} for a, b in r.messages])
        else:
            toks = encode(r.prompt or "")
        n_out = r.output_tokens if r.output_tokens is not None else len(encode(r.response or ""))
        ms = round((r.timestamp_s - t0) * 1000.0, 3)
        out.append(TraceRecord(ms, max(len(toks), 1), n_out, namer.hash_ids(toks)))
    return out
