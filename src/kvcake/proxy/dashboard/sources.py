"""What the dashboard reads besides the proxy's own state: the cluster's run record
(``cluster.json`` of ``kvcake up``: processes, restarts, the master's admin address) and the
store master's admin HTTP (``/get_all_segments``, ``/hot_keys``, ``/metrics``).

Every read is bounded in time and never raises: a part that does not answer is reported in
``errors`` and shown as such on the page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kvcake.core.promtext import parse_metrics, total


@dataclass(frozen=True)
class RunRecord:
    """The supervisor's view of the processes (``kvcake status``): name -> record."""

    processes: dict[str, dict[str, Any]] = field(default_factory=dict)
    instances: dict[str, str] = field(default_factory=dict)  # process name -> instance URL
    master_http: str = ""
    error: str = ""

    def restarts_of_url(self, url: str) -> int | None:
        for name, u in self.instances.items():
            if u.rstrip("/") == url.rstrip("/"):
                return int(self.processes.get(name, {}).get("restarts", 0))
        return None


def read_run_record(path: str) -> RunRecord:
    if not path:
        return RunRecord()
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:  # a proxy not started by `kvcake up`: no supervisor to ask
        return RunRecord()
    except (OSError, ValueError) as exc:
        return RunRecord(error=f"cannot read {path}: {exc}")
    procs = {str(k): dict(v) for k, v in doc.get("processes", {}).items()}
    # "master", or with [ha] "master-<i>": every live one with an admin address (only the
    # leader answers; read_pool asks them in turn), comma-separated
    masters = [p for n, p in sorted(procs.items()) if n == "master" or n.startswith("master-")]
    live = [m for m in masters if m.get("alive", True)]
    https = [str(m["addresses"]["http"]) for m in live if m.get("addresses", {}).get("http")]
    inst = {str(k): str(v) for k, v in doc.get("instances", {}).items()}
    return RunRecord(procs, inst, ",".join(https))


@dataclass(frozen=True)
class PoolReport:
    segments: list[dict[str, Any]] = field(default_factory=list)
    hot: list[dict[str, Any]] = field(default_factory=list)
    objects: float = 0.0
    evicted: float = 0.0
    error: str = ""


async def read_pool(http: httpx.AsyncClient, masters: str, hot: int) -> PoolReport:
    """The pool as the first of ``masters`` (comma-separated admin addresses) that answers
    sees it: with HA only the leader serves HTTP."""
    if not masters:
        return PoolReport(error="no store master known (no pool, or not started by `kvcake up`)")
    report = PoolReport()
    for address in masters.split(","):
        report = await _read_pool_from(http, address, hot)
        if not report.error:
            return report
    return report


async def _read_pool_from(http: httpx.AsyncClient, master_http: str, hot: int) -> PoolReport:
    base = f"http://{master_http}"
    try:
        segs = (await http.get(base + "/get_all_segments")).json()
        m = parse_metrics((await http.get(base + "/metrics")).text)
        r = await http.get(base + "/hot_keys", params={"limit": hot})
        hot_keys = r.json() if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError) as exc:
        return PoolReport(error=f"master {master_http}: {exc or type(exc).__name__}")
    if not isinstance(segs, list) or not isinstance(hot_keys, list):
        return PoolReport(error=f"master {master_http}: unexpected answer")
    return PoolReport(
        segments=segs,
        hot=hot_keys,
        objects=total(m, "kvcake_store_objects"),
        evicted=total(m, "kvcake_store_evicted_objects"),
        error=""
        if r.status_code == 200
        else f"master {master_http}: no /hot_keys ({r.status_code})",
    )
