"""Workloads for the experiments: any Mooncake-format trace file (the paper's three traces —
conversation, tool&agent, synthetic — are published in the Mooncake repository under
``FAST25-release/traces/``), and synthetic stand-ins from :mod:`kvcake.core.synth` shaped like
the paper's tool&agent and synthetic workloads (same request counts and averages), for when
those files are not at hand."""

from __future__ import annotations

from collections.abc import Container, Sequence
from pathlib import Path

from kvcake.core.costmodel import CostModel
from kvcake.core.errors import TraceError
from kvcake.core.synth import SynthConfig, generate
from kvcake.core.trace import TRACE_BLOCK_TOKENS, TraceRecord, read_trace

# paper: 23,608 requests, avg input 8,596, avg output 182, cache ratio 59%
TOOL_AGENT = SynthConfig(
    requests=23_608,
    rate=6.5,
    system_prompts=400,
    system_tokens=5000,
    documents=400,
    document_tokens=2500,
    document_prob=0.4,
    user_tokens_mean=2000.0,
    output_tokens_mean=182.0,
    turns_mean=1.3,
    think_time_s=20.0,
    seed=1,
)
# paper: 3,993 requests, avg input 15,325, avg output 149, cache ratio 66%, Poisson arrivals
SYNTHETIC = SynthConfig(
    requests=3_993,
    rate=1.1,
    system_prompts=20,
    system_tokens=2000,
    documents=90,
    document_tokens=11000,
    document_prob=0.9,
    user_tokens_mean=1200.0,
    output_tokens_mean=149.0,
    turns_mean=1.6,
    think_time_s=30.0,
    seed=2,
)

SYNTH_PRESETS = {"toolagent-synth": TOOL_AGENT, "synthetic-synth": SYNTHETIC}


def load_workload(spec: str) -> tuple[str, list[TraceRecord]]:
    """``spec`` is a trace path or a preset name (``toolagent-synth``, ``synthetic-synth``).
    Returns ``(display name, records)``."""
    if spec in SYNTH_PRESETS:
        return spec, generate(SYNTH_PRESETS[spec])
    p = Path(spec)
    try:
        recs = read_trace(p)
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{p}: not UTF-8 text (byte {exc.start}: {exc.reason}); a trace is "
            "JSONL, one Mooncake record per line"
        ) from None
    if not recs:
        raise TraceError(f"{p}: the trace has no requests (empty file)")
    return p.stem.removesuffix("_trace"), recs


def leading_run(hash_ids: Sequence[int], held: Container[int]) -> int:
    """How many of the leading blocks ``held`` has (a prefix stops at the first miss)."""
    n = 0
    for h in hash_ids:
        if h not in held:
            break
        n += 1
    return n


def ideal_prefill_s(records: Sequence[TraceRecord], cm: CostModel) -> float:
    """Prefill seconds of the whole trace if every block seen before were reused for free: the
    lower bound that sizes replay speeds and clusters (a request's leading seen blocks are its
    cached prefix; at least one token is always computed)."""
    seen: set[int] = set()
    work = 0.0
    for r in records:
        n = leading_run(r.hash_ids, seen)
        seen.update(r.hash_ids)
        work += cm.prefill_time(r.input_length, min(n * TRACE_BLOCK_TOKENS, r.input_length - 1))
    return work
