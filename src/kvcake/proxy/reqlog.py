"""The proxy's structured request log: one JSON object per line per request, size-bounded.

Every request that reached the router — finished, aborted, failed or rejected (429) — gets
one line when it ends. Schema (``v`` 1; docs/observability.md "Request log"):

``v``, ``timestamp`` (arrival, Unix s), ``request_id``, ``model``, ``endpoint`` (``chat`` /
``completions``), ``stream``, ``tenant`` (null until tenants exist), ``outcome`` (``stop`` /
``length`` / ``abort`` / ``error`` / ``rejected``), ``error``, ``prefill``, ``decode``,
``prompt_tokens``, ``output_tokens``, ``max_tokens``, ``cached_tokens``, ``ttft_s``,
``e2e_s``, ``queue_s``, ``prefill_s``, ``decode_s``, ``tbt_mean_s``, ``predicted_ttft_s``,
``kv`` (the attribution: ``local_tokens``, ``pool_dram_tokens`` {node: n}, ``ssd_tokens``,
``computed_tokens``, ``miss_reasons`` {reason: n}), ``block_tokens``, ``block_hashes`` (the
prompt's full blocks, 16 hex digits each), ``tail_hash`` (its partial last block, or null).

``kvcake plan`` reads the file as a trace (``core.requestlog``: the hashes become Mooncake
``hash_ids``). Writing is a buffered append under a lock (a line is ~1 KB plus 17 bytes per
block); when the file passes ``max_bytes`` it is rotated to ``.1`` … ``.{backups}``.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

from kvcake.proxy.dashboard.snapshot import recent_row

SCHEMA_VERSION = 1


class RequestLog:
    def __init__(self, path: str | Path, max_bytes: int = 64 << 20, backups: int = 3):
        if max_bytes < 4096:
            raise ValueError("request log max_bytes must be >= 4096")
        if backups < 0:
            raise ValueError("request log backups must be >= 0")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.backups = max_bytes, backups
        self._mu = threading.Lock()
        self._f: IO[str] | None = None
        self._size = 0
        self.written = 0
        self.dropped = 0  # lines lost to I/O errors (a full disk must not fail requests)

    def _open(self) -> IO[str]:
        if self._f is None:
            self._f = self.path.open("a", encoding="utf-8")
            self._size = self._f.tell()
        return self._f

    def _rotate(self) -> None:
        assert self._f is not None
        self._f.close()
        self._f = None
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
            return
        for i in range(self.backups - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        with self._mu:
            try:
                f = self._open()
                f.write(line)
                f.flush()
                self._size += len(line.encode())
                self.written += 1
                if self._size >= self.max_bytes:
                    self._rotate()
            except OSError:
                self.dropped += 1

    def close(self) -> None:
        with self._mu:
            if self._f is not None:
                self._f.close()
                self._f = None


def queue_time(out: Any) -> float | None:
    """Arrival to the prefill starting on its instance: the proxy's per-instance queue (gate)
    plus the instance's own queue — vLLM's WAITING phase."""
    if not out.gate_at:
        return None
    return out.gate_at - out.arrival + float(out.prefill_timings.get("queue_s", 0.0))


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


def record_of(out: Any, *, model: str, endpoint: str, stream: bool, block_tokens: int,
              outcome: str | None = None, error: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The log line of a finished ``router.Outcome``."""
    times = out.token_times
    ttft = out.ttft
    end = times[-1] if times else None
    queue = queue_time(out)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "v": SCHEMA_VERSION,
        "timestamp": round(out.wall, 6),
        "request_id": out.request_id,
        "model": model,
        "endpoint": endpoint,
        "stream": stream,
        "tenant": getattr(out, "tenant", None),
        "outcome": outcome or out.finish_reason or "abort",
        "error": error if error is not None else out.error,
        "prefill": out.prefill or None,
        "decode": out.decode or None,
        "prompt_tokens": out.prompt_tokens,
        "output_tokens": len(times),
        "max_tokens": out.max_tokens,
        "cached_tokens": out.cached_tokens,
        "ttft_s": _r(ttft),
        "e2e_s": _r(end - out.arrival) if end is not None else None,
        "queue_s": _r(queue),
        "prefill_s": _r(ttft - queue) if ttft is not None and queue is not None else None,
        "decode_s": _r(end - times[0]) if times else None,
        "tbt_mean_s": _r(sum(gaps) / len(gaps)) if gaps else None,
        "predicted_ttft_s": _r(out.predicted_ttft_s),
        "kv": out.kv.as_dict() if out.kv is not None else None,
        "block_tokens": block_tokens,
        "block_hashes": [f"{int(h):016x}" for h in out.block_hashes],
        "tail_hash": f"{int(out.tail_hash):016x}" if out.tail_hash is not None else None,
        "logged_at": round(time.time(), 6),
    }


def on_end(st: Any, out: Any, outcome: str | None = None, error: str | None = None) -> None:
    """A request ended: normally (``proxy_app._record``: vLLM's per-request histograms and the
    request-log line) or before its first token (``outcome`` "rejected" / "error": the line
    only)."""
    health = getattr(st, "health", None)
    if health is not None:  # the failure rate health shows (a reason, not an input)
        health.record(outcome is None and not out.error)
    if outcome is not None and getattr(st, "recent", None) is not None:
        row = recent_row(out)  # the dashboard lists failed and rejected requests too
        row.update(finish=outcome, error=error if error is not None else out.error)
        st.recent.append(row)
    m = st.metrics
    if outcome is None:
        ttft, times = out.ttft, out.token_times
        queue = queue_time(out)
        prefill = ttft - queue if ttft is not None and queue is not None else None
        decode = times[-1] - times[0] if times else None
        m.record_phases(queue, prefill, decode)
        m.req_prompt_tokens.observe(out.prompt_tokens)
        m.req_generation_tokens.observe(len(times))
        m.req_max_tokens.observe(out.max_tokens)
    log = getattr(st, "request_log", None)
    if log is not None:
        bt = st.cluster.block_tokens if st.cluster is not None else 0
        log.write(record_of(out, model=out.model, endpoint=out.endpoint, stream=out.stream,
                            block_tokens=bt, outcome=outcome, error=error))  # fmt: skip


def preemptions(cluster: Any) -> float:
    """Sum of the instances' decode preemption totals (their load reports)."""
    return float(
        sum(getattr(i.load_report(), "preemptions", 0) for i in cluster.instances.values())
    )
