"""What ``kvcake top`` shows: one snapshot of a cluster (the proxy's ``/v1/cluster`` and
``/metrics``, the master's ``/metrics``) turned into rich tables. Fetching and drawing are
separate so the drawing is a pure function of the snapshot (and of the previous one, for
per-second rates)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvcake.core.auth import resolve
from kvcake.core.http_auth import MASTER_HTTP
from kvcake.core.promtext import Series, parse_metrics, total
from kvcake.net.httpserve import client_auth
from kvcake.proxy.health import summary


@dataclass(frozen=True)
class Snapshot:
    at: float
    cluster: dict[str, Any]
    proxy: Series
    master: Series = field(default_factory=dict)
    errors: tuple[str, ...] = ()


def fetch(proxy_url: str, master_http: str = "", timeout_s: float = 2.0) -> Snapshot:
    """One snapshot; a part that does not answer is named in ``errors``, never raised."""
    errors: list[str] = []
    cluster: dict[str, Any] = {}
    proxy: Series = {}
    master: Series = {}

    # Signed for the master's HTTP; the proxy's /v1/cluster and /metrics ignore the header.
    with httpx.Client(timeout=timeout_s, auth=client_auth(resolve(None), MASTER_HTTP)) as http:
        try:
            cluster = http.get(proxy_url + "/v1/cluster").json()
            proxy = parse_metrics(http.get(proxy_url + "/metrics").text)
        except (httpx.HTTPError, ValueError) as exc:
            errors.append(f"proxy {proxy_url}: {exc or type(exc).__name__}")
        if master_http:
            try:
                master = parse_metrics(http.get(f"http://{master_http}/metrics").text)
            except (httpx.HTTPError, ValueError) as exc:
                errors.append(f"master {master_http}: {exc or type(exc).__name__}")
    return Snapshot(time.time(), cluster, proxy, master, tuple(errors))


def _percent(num: float, den: float) -> str:
    return f"{100 * num / den:.1f}%" if den > 0 else "-"


def _instances(s: Snapshot) -> Table:
    t = Table(title="instances", expand=True)
    for col in ("id", "role", "up", "running", "queued", "prefill queue", "KV used",
                "KV %", "indexed blocks"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("id", "role") else "right")
    for row in s.cluster.get("instances", []):
        iid = str(row["id"])
        q = total(s.proxy, "kvcake_proxy_instance_queued_prefill_seconds", instance=iid)
        t.add_row(
            iid, row["role"], "yes" if row["alive"] else Text("DOWN", style="bold red"),
            str(row["running"]), str(row["queued"]), f"{q:.3f}s",
            f"{row['kv_used']}/{row['kv_total']}", _percent(row["kv_used"], row["kv_total"]),
            str(row.get("cached_blocks", 0)),
        )  # fmt: skip
    return t


def _traffic(s: Snapshot, prev: Snapshot | None) -> Table:
    p = s.proxy
    hits, queries = (
        total(p, "kvcake:prefix_cache_hits_total"),
        total(p, "kvcake:prefix_cache_queries_total"),
    )
    t = Table(title="requests and prefix cache (proxy)", expand=True)
    for col in ("finished", "errors", "429s", "running", "waiting", "prompt tok",
                "gen tok", "hit rate (all)", "hit rate (last interval)"):  # fmt: skip
        t.add_column(col, justify="right")
    recent = "-"
    if prev is not None:
        dh = hits - total(prev.proxy, "kvcake:prefix_cache_hits_total")
        dq = queries - total(prev.proxy, "kvcake:prefix_cache_queries_total")
        recent = _percent(dh, dq)
    t.add_row(
        f"{total(p, 'kvcake:request_success_total'):.0f}",
        f"{total(p, 'kvcake_proxy_request_errors_total'):.0f}",
        f"{total(p, 'kvcake_proxy_request_rejections_total'):.0f}",
        f"{total(p, 'kvcake:num_requests_running'):.0f}",
        f"{total(p, 'kvcake:num_requests_waiting'):.0f}",
        f"{total(p, 'kvcake:prompt_tokens_total'):.0f}",
        f"{total(p, 'kvcake:generation_tokens_total'):.0f}",
        _percent(hits, queries), recent,
    )  # fmt: skip
    return t


def _pool(s: Snapshot) -> Table:
    t = Table(title="pool (master)", expand=True)
    for col in ("segment", "tier", "used", "capacity", "use %"):
        t.add_column(col, justify="left" if col in ("segment", "tier") else "right")
    for (name, lbl), cap in sorted(s.master.items()):
        if name != "kvcake_store_segment_capacity_bytes":
            continue
        d = dict(lbl)
        used = s.master.get(("kvcake_store_segment_used_bytes", lbl), 0.0)
        t.add_row(d.get("segment", ""), d.get("tier", ""), f"{used / 2**20:.1f} MiB",
                  f"{cap / 2**20:.1f} MiB", _percent(used, cap))  # fmt: skip
    objs = total(s.master, "kvcake_store_objects")
    ev = total(s.master, "kvcake_store_evicted_objects")
    t.caption = f"objects {objs:.0f}, evicted {ev:.0f}"
    return t


def render(s: Snapshot, prev: Snapshot | None = None) -> Group:
    stamp = time.strftime("%H:%M:%S", time.localtime(s.at))

    state = summary(s.cluster.get("health"))
    style = "bold" if s.cluster.get("ready") else "bold red"
    head = Text(f"kvcake top  {stamp}  {state}", style=style)
    parts: list[Any] = [head, _instances(s), _traffic(s, prev)]
    if s.master:
        parts.append(_pool(s))
    parts += [Text(e, style="red") for e in s.errors]
    return Group(*parts)
