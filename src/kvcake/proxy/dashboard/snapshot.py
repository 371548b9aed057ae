"""One dashboard snapshot: a JSON-ready dict built from the proxy's live state (the same
sources as ``/v1/cluster`` and ``/metrics``), the run record and the store master.

Schema (``version`` 1) — the page and the tests read these keys:

- ``instances``: id, role, url, alive, running, queued, kv_used, kv_total, kv_pct,
  queued_prefill_s, indexed_blocks, restarts (None when no run record names the instance)
- ``processes``: the supervisor's other children (master, storage nodes, proxy): name, alive,
  restarts, last_exit
- ``requests``: finished, errors, rejected, running, waiting, prompt_tokens,
  generation_tokens, reused_tokens, queried_tokens, hit_rate (since the proxy started)
- ``rejections``: 429s by reason; ``hit_rate``: {tiers, points} from the history ring
- ``pool``: segments (name, host, tier, capacity, used), objects, evicted, error
- ``hot_blocks``: the pool's most recently used objects: key, block (hash, hex), size,
  replicas (segment, tier), holders (instances whose own cache has the block)
- ``recent``: finished requests, newest first: id, at, prefill, decode, prompt_tokens,
  cached_tokens, computed_tokens, ttft_s, tbt_s, output_tokens, finish, kv (tokens by source)
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Any, Protocol

from kvcake.core.ids import BlockHash
from kvcake.core.promtext import Series, total
from kvcake.proxy.dashboard.history import HITS, QUERIES, History, series_of
from kvcake.proxy.dashboard.sources import PoolReport, RunRecord
from kvcake.proxy.metrics import ProxyMetrics
from kvcake.proxy.pool_events import block_of
from kvcake.proxy.router import Outcome
from kvcake.proxy.state import LiveCluster
from kvcake.serve.events import POOL

VERSION = 1


class ProxySide(Protocol):
    """What the dashboard reads of the proxy (``ProxyState``)."""

    cluster: LiveCluster | None
    metrics: ProxyMetrics
    recent: deque[dict[str, Any]]  # recent_row() of the last finished requests

    health: Any  # serve.health.Health

    def ready(self) -> bool: ...


def instances(side: ProxySide, run: RunRecord) -> list[dict[str, Any]]:
    if side.cluster is None:
        return []
    rows = []
    for i in side.cluster.instances.values():
        rep = i.load_report()
        rows.append(
            {"id": str(i.instance_id), "role": i.role.value, "url": i.url, "alive": i.alive,
             "running": rep.running_requests, "queued": rep.queued_requests,
             "kv_used": rep.kv_blocks_used, "kv_total": rep.kv_blocks_total,
             "kv_pct": rep.kv_blocks_used / rep.kv_blocks_total if rep.kv_blocks_total else 0.0,
             "queued_prefill_s": rep.queued_prefill_seconds,
             "indexed_blocks": side.cluster.kv_index.blocks_of(i.instance_id),
             "restarts": run.restarts_of_url(i.url)}
        )  # fmt: skip
    return rows


def processes(run: RunRecord) -> list[dict[str, Any]]:
    named = set(run.instances)
    return [
        {"name": n, "alive": bool(p.get("alive", False)), "restarts": int(p.get("restarts", 0)),
         "last_exit": p.get("last_exit") or ""}
        for n, p in sorted(run.processes.items()) if n not in named
    ]  # fmt: skip


def requests(s: Series) -> dict[str, Any]:
    hits, queries = total(s, HITS), total(s, QUERIES)
    return {
        "finished": total(s, "kvcake:request_success_total"),
        "errors": total(s, "kvcake_proxy_request_errors_total"),
        "rejected": total(s, "kvcake_proxy_request_rejections_total"),
        "running": total(s, "kvcake:num_requests_running"),
        "waiting": total(s, "kvcake:num_requests_waiting"),
        "prompt_tokens": total(s, "kvcake:prompt_tokens_total"),
        "generation_tokens": total(s, "kvcake:generation_tokens_total"),
        "reused_tokens": hits,
        "queried_tokens": queries,
        "hit_rate": hits / queries if queries else None,
    }


def rejections(s: Series) -> dict[str, float]:
    out: dict[str, float] = {}
    for (name, labels), v in sorted(s.items()):
        if name == "kvcake_proxy_request_rejections_total":
            reason = dict(labels).get("reason", "")
            out[reason] = out.get(reason, 0.0) + v
    return out


def kv_sources(o: Outcome) -> dict[str, int]:
    """Prompt tokens by where their KV came from. With the proxy's attribution (``o.kv``):
    ``local``, ``dram:<node>``, ``ssd:<node>``, ``computed`` (and ``miss:<reason>``); without
    it, reused (any tier) and computed tokens."""
    a = getattr(o, "kv", None)
    if a is None or not hasattr(a, "pool_dram_tokens"):
        return {"cached": o.cached_tokens, "computed": max(0, o.prompt_tokens - o.cached_tokens)}
    out = {"local": int(a.local_tokens)}
    out.update({f"dram:{n}": int(v) for n, v in sorted(a.pool_dram_tokens.items())})
    out.update({f"ssd:{n}": int(v) for n, v in sorted(a.ssd_tokens.items())})
    out["computed"] = int(a.computed_tokens)
    out.update({f"miss:{r}": int(v) for r, v in sorted(a.miss_reasons.items()) if v})
    return out


def recent_row(o: Outcome) -> dict[str, Any]:
    """The dashboard's row of a finished request, made once at its end: the proxy keeps these
    (about 1 KB each), not the :class:`Outcome` (token times, block hashes, placement: several
    KB for a long prompt; a ring of 1,000 of those was most of a soak's heap growth)."""
    gaps = [b - a for a, b in zip(o.token_times, o.token_times[1:], strict=False)]
    end = o.token_times[-1] if o.token_times else o.arrival
    return {"id": o.request_id, "at": o.wall, "e2e_s": end - o.arrival,
            "prefill": o.prefill, "decode": o.decode,
            "prompt_tokens": o.prompt_tokens, "cached_tokens": o.cached_tokens,
            "computed_tokens": max(0, o.prompt_tokens - o.cached_tokens),
            "ttft_s": o.ttft, "tbt_s": sum(gaps) / len(gaps) if gaps else None,
            "output_tokens": len(o.token_times), "finish": o.finish_reason or "",
            "error": o.error, "kv": kv_sources(o)}  # fmt: skip


def recent(rows: deque[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` rows of :func:`recent_row`, newest first (no copy of the ring)."""
    return list(itertools.islice(reversed(rows), limit))


def hot_blocks(side: ProxySide, pool: PoolReport) -> list[dict[str, Any]]:
    out = []
    for obj in pool.hot:
        h = block_of(str(obj.get("key", "")))
        holders: list[str] = []
        if h is not None and side.cluster is not None:
            holders = sorted(str(x) for x in side.cluster.kv_index.holders(BlockHash(h)))
            holders = [x for x in holders if x != POOL]
        out.append(
            {"key": obj.get("key", ""), "block": f"{h:016x}" if h is not None else "",
             "size": obj.get("size", 0), "replicas": obj.get("replicas", []), "holders": holders}
        )  # fmt: skip
    return out


def build(
    side: ProxySide, history: History, run: RunRecord, pool: PoolReport, n_recent: int
) -> dict[str, Any]:
    s = series_of(side.metrics.registry)
    points = history.points()
    tiers = sorted({t for p in points for t in p["hit_rate"]} | {"all"})
    errors = [e for e in (run.error, pool.error) if e]
    return {
        "version": VERSION,
        "at": time.time(),
        "ready": side.ready(),
        "health": side.health.report() if side.health is not None else None,
        "instances": instances(side, run),
        "processes": processes(run),
        "requests": requests(s),
        "rejections": rejections(s),
        "hit_rate": {"tiers": tiers, "points": points},
        "pool": {
            "segments": pool.segments,
            "objects": pool.objects,
            "evicted": pool.evicted,
            "error": pool.error,
        },
        "hot_blocks": hot_blocks(side, pool),
        "recent": recent(side.recent, n_recent),
        "errors": errors,
    }
