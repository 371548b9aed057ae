"""``kvcake up`` / ``status`` / ``down``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "up",
        help="start a local cluster (master, store, prefill, decode, proxy) from one config",
        description="Start master + store-server(s) + N prefill + M decode instances + the "
        "proxy from one TOML file (default: configs/cluster.toml), wait until healthy, print the "
        "endpoint. Logs go to <run_dir>/<timestamp>/. Ctrl-C (or `kvcake down` with --detach) "
        "stops everything.",
    )
    p.add_argument("--config", help="cluster TOML (default: configs/cluster.toml)")
    p.add_argument("--backend", choices=("torch", "emulated"), help="override instance.backend")
    p.add_argument("--prefill", type=int, help="override cluster.prefill")
    p.add_argument("--decode", type=int, help="override cluster.decode")
    p.add_argument("--port", type=int, help="override cluster.proxy_port")
    p.add_argument("--detach", action="store_true", help="run in the background")
    p.set_defaults(func=_up)

    s = sub.add_parser("status", help="show the cluster started by `kvcake up`")
    s.add_argument("--run-dir", default="runs", help="cluster.run_dir of that cluster")
    s.set_defaults(func=_status)

    d = sub.add_parser("down", help="stop the cluster started by `kvcake up --detach`")
    d.add_argument("--run-dir", default="runs")
    d.set_defaults(func=_down)


def _up(args: argparse.Namespace) -> int:
    from kvcake.serve.config import default_cluster_file
    from kvcake.serve.launcher import Cluster, load_serve_file

    path = args.config or str(default_cluster_file())
    conf = load_serve_file(path, {
        "instance": {"backend": args.backend},
        "cluster": {"prefill": args.prefill, "decode": args.decode, "proxy_port": args.port},
    })  # fmt: skip
    if args.detach:
        argv = [sys.executable, "-m", "kvcake", *[a for a in sys.argv[1:] if a != "--detach"]]
        if args.config is None:
            argv += ["--config", path]
        log = Path(conf.cluster.run_dir)
        log.mkdir(parents=True, exist_ok=True)
        latest = log / "latest.json"
        latest.unlink(missing_ok=True)
        with (log / "supervisor.log").open("wb") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + conf.cluster.startup_timeout_s + 30
        while time.monotonic() < deadline and proc.poll() is None and not latest.exists():
            time.sleep(0.2)
        if not latest.exists():
            print((log / "supervisor.log").read_text()[-3000:], file=sys.stderr)
            return 2
        print(f"cluster up: {json.loads(latest.read_text())['url']}/v1 (stop: kvcake down)")
        return 0
    cluster = Cluster(conf)
    print(f"starting cluster ({conf.instance.backend}), logs in {cluster.run_dir}", flush=True)
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        url = cluster.start()
        print(f"ready: OpenAI endpoint {url}/v1  (Ctrl-C stops the cluster)", flush=True)
        reported: set[str] = set()
        while not stop["now"]:
            for name in set(cluster.dead_children()) - reported:
                print(f"warning: {name} exited (log {cluster.run_dir / (name + '.log')})")
                reported.add(name)
            if "proxy" in reported:
                break
            time.sleep(0.5)
    finally:
        print("stopping cluster...", flush=True)
        cluster.stop()
        (Path(conf.cluster.run_dir) / "latest.json").unlink(missing_ok=True)
    return 0


def _state(run_dir: str) -> dict[str, Any] | None:
    p = Path(run_dir) / "latest.json"
    return json.loads(p.read_text()) if p.exists() else None


def _status(args: argparse.Namespace) -> int:
    import httpx

    st = _state(args.run_dir)
    if st is None:
        print(f"no cluster running (no {args.run_dir}/latest.json)")
        return 1
    print(f"endpoint {st['url']}/v1   logs {st['run_dir']}")
    try:
        view = httpx.get(st["url"] + "/v1/cluster", timeout=5).json()
    except httpx.HTTPError as exc:
        print(f"proxy not answering: {exc!r}")
        return 1
    print(f"ready: {view['ready']}   indexed KV blocks: {view.get('indexed_blocks', 0)}")
    for i in view["instances"]:
        print(f"  {i['id']:<12} {i['role']:<8} {'up' if i['alive'] else 'DOWN':<5} "
              f"queued {i['queued']:<3} running {i['running']:<3} "
              f"KV {i['kv_used']}/{i['kv_total']} blocks, cached {i['cached_blocks']}")  # fmt: skip
    return 0


def _down(args: argparse.Namespace) -> int:
    st = _state(args.run_dir)
    if st is None:
        print("no cluster running")
        return 1
    pid = int(st["supervisor_pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"supervisor {pid} is gone; stopping its processes directly")
        for p in st["processes"].values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(p), signal.SIGTERM)
        (Path(args.run_dir) / "latest.json").unlink(missing_ok=True)
        return 0
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and (Path(args.run_dir) / "latest.json").exists():
        time.sleep(0.2)
    print("cluster stopped")
    return 0
