"""``kvcake top``: a live terminal view of a running cluster (works over ssh: plain rich)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from kvcake.core.errors import ConfigError, KvcakeError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "top",
        help="live terminal view of a cluster: instances, load, KV use, hit rates, pool",
        description="Polls the proxy's /v1/cluster and /metrics (and the store master's "
        "/metrics) and redraws every --interval seconds. Addresses default to the cluster "
        "`kvcake up` started last (runs/latest.json). Ctrl-C quits.",
    )
    p.add_argument("--url", help="proxy URL, e.g. http://127.0.0.1:8000 (default: from --state)")
    p.add_argument("--master-http", help="the master's admin HTTP host:port (default: --state)")
    p.add_argument("--state", default="runs/latest.json", help="cluster.json of `kvcake up`")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames (1)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(func=_top)


def _addresses(args: argparse.Namespace) -> tuple[str, str]:
    url, master = args.url or "", args.master_http or ""
    if not url:
        try:
            state = json.loads(Path(args.state).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"no --url and cannot read {args.state} ({exc}): start a cluster with "
                "`kvcake up` or pass --url"
            ) from exc
        url = state["url"]
        if not master:
            master = (
                state.get("processes", {}).get("master", {}).get("addresses", {}).get("http", "")
            )
    return url.rstrip("/"), master


def _top(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from rich.live import Live

    from kvcake.proxy.top_view import fetch, render

    if args.interval <= 0:
        raise KvcakeError("--interval must be > 0")
    url, master = _addresses(args)
    console = Console()
    snap = fetch(url, master)
    if args.once:
        console.print(render(snap))
        return 1 if not snap.cluster else 0
    with Live(render(snap), console=console, refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(args.interval)
            prev, snap = snap, fetch(url, master)
            live.update(render(snap, prev))
