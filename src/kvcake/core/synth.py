"""Synthetic Mooncake-format traces: multi-turn sessions with growing history, shared system
prompts, shared documents and Poisson arrivals.

Prompts are built from *segments* (a system prompt, a document, each user turn and each answer).
A block's id is interned from (parent block id, the segment pieces it covers), so two prompts
share block ``i`` exactly when their first ``i+1`` blocks hold the same content — the meaning of
``hash_ids`` in real traces, including a partially filled last block that gets a new id once a
later turn fills it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvcake.core.config import require
from kvcake.core.trace import TRACE_BLOCK_TOKENS, TraceRecord

Segment = tuple[tuple[str, int, int], int]  # (segment key, length in tokens)


@dataclass(frozen=True)
class SynthConfig:
    """Shape of a synthetic workload. Defaults resemble the conversation trace."""

    requests: int = 1000
    rate: float = 3.0  # sessions' turns arrive as a Poisson process of this many requests/s
    system_prompts: int = 4
    system_tokens: int = 1500
    documents: int = 50
    document_tokens: int = 6000
    document_prob: float = 0.3
    user_tokens_mean: float = 800.0
    output_tokens_mean: float = 340.0
    turns_mean: float = 4.0
    think_time_s: float = 60.0  # mean gap between a session's turns
    max_input: int = 128_000
    block_tokens: int = TRACE_BLOCK_TOKENS
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.requests > 0, "synth.requests must be positive")
        require(self.rate > 0, "synth.rate must be positive")
        require(0.0 <= self.document_prob <= 1.0, "synth.document_prob must be in [0, 1]")
        require(self.turns_mean >= 1, "synth.turns_mean must be >= 1")
        require(self.block_tokens > 0, "synth.block_tokens must be positive")


class _BlockNamer:
    def __init__(self) -> None:
        self._ids: dict[tuple[int, tuple[tuple[str, int, int, int, int], ...]], int] = {}

    def name(self, segments: list[Segment], block_tokens: int) -> list[int]:
        """Block ids of the prompt made of ``segments``."""
        total = sum(n for _, n in segments)
        ids: list[int] = []
        parent, seg_i, seg_off = -1, 0, 0
        for start in range(0, total, block_tokens):
            need = min(block_tokens, total - start)
            pieces = []
            while need:
                key, length = segments[seg_i]
                take = min(need, length - seg_off)
                pieces.append((*key, seg_off, seg_off + take))
                seg_off += take
                need -= take
                if seg_off == length:
                    seg_i, seg_off = seg_i + 1, 0
            parent = self._ids.setdefault((parent, tuple(pieces)), len(self._ids))
            ids.append(parent)
        return ids


def generate(cfg: SynthConfig) -> list[TraceRecord]:
    """A trace of ``cfg.requests`` requests ordered by timestamp."""
    rng = np.random.default_rng(cfg.seed)
    namer = _BlockNamer()
    events: list[tuple[float, int, list[Segment], int]] = []
    session, t_session = 0, 0.0
    sessions_rate = cfg.rate / cfg.turns_mean
    while len(events) < cfg.requests:
        t_session += rng.exponential(1.0 / sessions_rate)
        segs: list[Segment] = [
            (("sys", int(rng.integers(cfg.system_prompts)), 0), cfg.system_tokens)
        ]
        if rng.random() < cfg.document_prob:
            segs.append((("doc", int(rng.integers(cfg.documents)), 0), cfg.document_tokens))
        t = t_session
        for turn in range(max(1, int(rng.geometric(1.0 / cfg.turns_mean)))):
            user = max(1, int(rng.exponential(cfg.user_tokens_mean)))
            segs = [*segs, (("user", session, turn), user)]
            if sum(n for _, n in segs) > cfg.max_input:
                break
            out = max(1, int(rng.exponential(cfg.output_tokens_mean)))
            events.append((t, len(events), list(segs), out))
            segs = [*segs, (("answer", session, turn), out)]
            t += rng.exponential(cfg.think_time_s)
        session += 1
    events.sort(key=lambda e: (e[0], e[1]))
    out_records = []
    for t, _, segs, out in events[: cfg.requests]:
        ids = namer.name(segs, cfg.block_tokens)
        total = sum(n for _, n in segs)
        assert len(ids) == math.ceil(total / cfg.block_tokens)
        out_records.append(TraceRecord(float(round(t * 1000.0)), total, out, tuple(ids)))
    return out_records
