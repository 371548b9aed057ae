"""``kvcake logs``: filter the proxy's JSON-lines request log (``proxy.request_log``; ``kvcake
up`` writes ``<run dir>/requests.jsonl``) and print a table or JSON lines."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvcake.core.errors import ConfigError

OUTCOMES = ("stop", "length", "abort", "error", "rejected")
TIERS = ("local", "pool_dram", "ssd", "computed")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "logs",
        help="filter the proxy's request log (where each request's KV came from, timings)",
        description="Reads the JSON-lines request log of the proxy (proxy.request_log; by "
        "default the one of the cluster `kvcake up` started last, <run dir>/requests.jsonl, "
        "and its rotated .1 .. .N files) and prints the requests that match every filter, "
        "oldest first.",
    )
    p.add_argument("--file", help="the request log (default: from --state)")
    p.add_argument("--state", default="runs/latest.json", help="cluster.json of `kvcake up`")
    p.add_argument("--id", dest="request_id", help="request id (exact, or a prefix)")
    p.add_argument("--outcome", help=f"comma-separated outcomes: {', '.join(OUTCOMES)}")
    p.add_argument("--instance", help="prefill or decode instance id, e.g. prefill-0")
    p.add_argument("--tenant", help="the tenant (API key's or x-tenant-id)")
    p.add_argument("--min-ttft", metavar="S", help="only requests with TTFT >= S seconds")
    p.add_argument("--tier", help=f"only requests with tokens from this tier: {', '.join(TIERS)}")
    p.add_argument("--reason", help="only requests with computed tokens for this miss reason "
                   "(never_seen, evicted, routed_elsewhere, fetch_failed, too_slow, last_block)")  # fmt: skip
    p.add_argument("--since", help="only requests that arrived since: a duration (30s, 10m, 2h, "
                   "1d ago), an ISO-8601 time or a Unix time")  # fmt: skip
    p.add_argument("--limit", type=int, default=50, help="print at most the last N (50; 0 = all)")
    p.add_argument("--json", action="store_true", help="JSON lines (the log records) instead")
    p.set_defaults(func=_logs)


@dataclass(frozen=True)
class Filter:
    request_id: str | None = None
    outcomes: frozenset[str] = frozenset()
    instance: str | None = None
    min_ttft: float | None = None
    tier: str | None = None
    reason: str | None = None
    since: float | None = None  # Unix time
    tenant: str | None = None

    def match(self, r: dict[str, Any]) -> bool:
        if self.request_id and not str(r.get("request_id", "")).startswith(self.request_id):
            return False
        if self.outcomes and r.get("outcome") not in self.outcomes:
            return False
        if self.instance and self.instance not in (r.get("prefill"), r.get("decode")):
            return False
        if self.tenant and r.get("tenant") != self.tenant:
            return False
        if self.min_ttft is not None and not (r.get("ttft_s") or 0) >= self.min_ttft:
            return False
        if self.since is not None and not float(r.get("timestamp", 0)) >= self.since:
            return False
        kv = r.get("kv") or {}
        if self.tier and tier_tokens(kv, self.tier) <= 0:
            return False
        return not (self.reason and (kv.get("miss_reasons") or {}).get(self.reason, 0) <= 0)


def tier_tokens(kv: dict[str, Any], tier: str) -> int:
    if tier == "pool_dram":
        return int(sum((kv.get("pool_dram_tokens") or {}).values()))
    return int(kv.get(f"{tier}_tokens") or 0)


def parse_since(text: str, now: float | None = None) -> float:
    """A Unix time from ``30s`` / ``10m`` / ``2h`` / ``1d`` (ago), ISO-8601 or a Unix time."""
    now = time.time() if now is None else now
    t = text.strip().removesuffix(" ago").strip()
    m = _DURATION.match(t)
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        v = float(t)
    except ValueError:
        pass
    else:
        if math.isfinite(v) and v >= 0:
            return v
        raise ConfigError(f"--since {text!r}: a Unix time must be a non-negative number")
    try:
        return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ConfigError(
            f"--since {text!r}: give a duration (30s, 10m, 2h, 1d), an ISO-8601 time "
            "(2026-12-01T12:00:00) or a Unix time"
        ) from None


def make_filter(args: argparse.Namespace) -> Filter:
    outcomes = frozenset(o.strip() for o in (args.outcome or "").split(",") if o.strip())
    bad = sorted(outcomes - set(OUTCOMES))
    if bad:
        raise ConfigError(
            f"--outcome: unknown {', '.join(bad)}; give some of {', '.join(OUTCOMES)}"
        )
    if args.tier and args.tier not in TIERS:
        raise ConfigError(f"--tier {args.tier!r}: give one of {', '.join(TIERS)}")
    # lazy: CLI start-up
    from kvcake.serve.attribution import REASONS

    if args.reason and args.reason not in REASONS:
        raise ConfigError(f"--reason {args.reason!r}: give one of {', '.join(REASONS)}")
    min_ttft = None
    if args.min_ttft is not None:
        try:
            min_ttft = float(args.min_ttft)
        except ValueError:
            raise ConfigError(f"--min-ttft {args.min_ttft!r}: not a number of seconds") from None
        if not (math.isfinite(min_ttft) and min_ttft >= 0):
            raise ConfigError(f"--min-ttft {args.min_ttft!r}: must be a number >= 0")
    if args.limit < 0:
        raise ConfigError(f"--limit {args.limit}: must be >= 0")
    since = parse_since(args.since) if args.since else None
    return Filter(args.request_id, outcomes, args.instance, min_ttft, args.tier, args.reason,
                  since, args.tenant)  # fmt: skip


def log_files(path: Path) -> list[Path]:
    """The rotated files oldest first (``.N`` .. ``.1``), then the live one."""
    rotated = sorted(
        (p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    return [*rotated, path] if path.exists() else rotated


def read_records(files: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Records of the files; a line that is not a JSON object (a torn last line while the
    proxy writes, say) is reported on stderr and skipped."""
    for f in files:
        with f.open(encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    rec = None
                if not isinstance(rec, dict):
                    print(f"{f}:{n}: not a request-log record, skipped", file=sys.stderr)
                    continue
                yield rec


def _resolve(args: argparse.Namespace) -> Path:
    if args.file:
        p = Path(args.file)
        if not p.exists() and not log_files(p):
            raise ConfigError(f"request log {p} not found")
        return p
    try:
        state = json.loads(Path(args.state).read_text())
        run_dir = Path(state["run_dir"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"no --file and cannot read {args.state} ({exc}): start a cluster with `kvcake up` "
            "or pass --file PATH (the proxy's proxy.request_log)"
        ) from exc
    p = run_dir / "requests.jsonl"
    if not log_files(p):
        raise ConfigError(f"{p} does not exist yet: the cluster has logged no request")
    return p


def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def table(records: list[dict[str, Any]]) -> Any:
    t = Table(show_edge=False, pad_edge=False)
    for col in ("time", "request", "outcome", "prefill", "decode", "prompt", "out", "TTFT s",
                "local", "pool", "ssd", "computed", "miss reasons"):  # fmt: skip
        t.add_column(col, justify="right" if col in ("prompt", "out", "TTFT s") else "left")
    # Why a request failed or was refused: the one thing to read in an error's row.
    errors = any(r.get("error") for r in records)
    if errors:
        t.add_column("error", overflow="fold", min_width=24)
    for r in records:
        kv = r.get("kv") or {}
        pool = ", ".join(f"{k}:{v}" for k, v in (kv.get("pool_dram_tokens") or {}).items())
        reasons = ", ".join(f"{k}:{v}" for k, v in (kv.get("miss_reasons") or {}).items())
        ts = datetime.fromtimestamp(float(r.get("timestamp", 0))).strftime("%H:%M:%S")
        cells = [
            ts, _fmt(r.get("request_id")), _fmt(r.get("outcome")), _fmt(r.get("prefill")),
            _fmt(r.get("decode")), _fmt(r.get("prompt_tokens")), _fmt(r.get("output_tokens")),
            _fmt(r.get("ttft_s"), ".3f"), _fmt(kv.get("local_tokens")), pool or "-",
            _fmt(kv.get("ssd_tokens")), _fmt(kv.get("computed_tokens")), reasons or "-",
        ]  # fmt: skip
        t.add_row(*cells, *([_fmt(r.get("error") or None)] if errors else []))
    return t


def _logs(args: argparse.Namespace) -> int:
    flt = make_filter(args)
    path = _resolve(args)
    hits = [r for r in read_records(log_files(path)) if flt.match(r)]
    if args.limit:
        hits = hits[-args.limit :]
    if args.json:
        for r in hits:
            print(json.dumps(r))
        return 0

    console = Console()
    if not hits:
        console.print("no request matches")
        return 0
    console.print(table(hits))
    return 0
