"""``kvcake demo``: the main job on the embedded default.

Replays the bundled conversation-trace sample through the cost model (LLaMA3-70B on 8xA800) with
a global LRU KV-cache pool of several sizes, and prints how much prefill compute reuse saves.
Later stages (simulator, live cluster) extend this command.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from typing import Any

from rich.console import Console
from rich.progress import track
from rich.table import Table

from kvcake.core import costmodel
from kvcake.core.trace import TRACE_BLOCK_TOKENS, TraceRecord, read_trace
from kvcake.data import sample_trace_path


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the main demo on the bundled trace sample")
    p.add_argument("--trace", help="trace JSONL (default: the bundled sample)")
    p.add_argument("--preset", default=costmodel.DEFAULT_PRESET, choices=sorted(costmodel.PRESETS))
    p.add_argument("--limit", type=int, default=None, help="use only the first N requests")
    p.set_defaults(func=_run)


def prefill_with_pool(
    records: list[TraceRecord], capacity_blocks: int, cm: costmodel.CostModel
) -> tuple[float, float]:
    """(hit rate, total prefill seconds) with one LRU pool of ``capacity_blocks`` blocks."""
    lru: OrderedDict[int, None] = OrderedDict()
    hits = total = 0
    seconds = 0.0
    for r in records:
        prefix = 0
        for h in r.hash_ids:
            if h not in lru:
                break
            prefix += 1
        for h in r.hash_ids:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
        cached = min(prefix * TRACE_BLOCK_TOKENS, r.input_length)
        hits += cached
        total += r.input_length
        seconds += cm.prefill_time(r.input_length, cached)
    return hits / max(total, 1), seconds


def _run(args: argparse.Namespace) -> int:
    path = args.trace or sample_trace_path()
    records = read_trace(path, limit=args.limit)
    cm = costmodel.preset(args.preset)
    table = Table(title=f"KV-cache reuse on {len(records):,} requests of {path} ({args.preset})")
    for col in ("pool capacity (tokens)", "prefix hit rate", "prefill GPU time (s)", "saved"):
        table.add_column(col, justify="right")
    _, cold = prefill_with_pool(records, 0, cm)
    for tokens in track((0, 100_000, 1_000_000, 10_000_000, 100_000_000), description="replaying"):
        rate, secs = prefill_with_pool(records, tokens // TRACE_BLOCK_TOKENS, cm)
        table.add_row(f"{tokens:,}", f"{rate:.1%}", f"{secs:,.0f}", f"{1 - secs / cold:.1%}")
    Console().print(table)
    return 0
