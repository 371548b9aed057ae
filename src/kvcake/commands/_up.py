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

from kvcake.core import auth
from kvcake.serve.config import default_cluster_file


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
    p.add_argument(
        "--netns",
        action="store_true",
        help="every process on its own emulated "
        "host: a network namespace, TCP between hosts (root; docs/deploy.md)",
    )
    p.add_argument(
        "--netns-rate",
        default="",
        help="with --netns: egress cap of every host (tc rate, e.g. 1gbit)",
    )
    p.add_argument("--netns-delay-ms", type=float, default=0.0, help="with --netns: one-way "
                   "delay added to master and instance RPC")  # fmt: skip

    auth.add_cli_args(p)  # exported to every child (KVCAKE_AUTH_SECRET_FILE)
    p.set_defaults(func=_up)

    s = sub.add_parser("status", help="show the cluster started by `kvcake up`: processes, "
                       "ports, restarts, load")  # fmt: skip
    _run_dir_args(s)
    s.set_defaults(func=_status)

    d = sub.add_parser("down", help="stop the cluster started by `kvcake up --detach`")
    _run_dir_args(d)
    d.set_defaults(func=_down)


def _run_dir_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="the cluster TOML given to `kvcake up` (for its run_dir)")
    p.add_argument("--run-dir", help="cluster.run_dir of that cluster (default: runs)")


def _run_dir(args: argparse.Namespace) -> str:
    if args.run_dir:
        return str(args.run_dir)
    if args.config:
        # lazy: CLI start-up
        from kvcake.fleet import cluster as vllm_cluster
        from kvcake.launch.launcher import load_serve_file

        if vllm_cluster.is_vllm_config(args.config):
            return vllm_cluster.load(args.config).run_dir
        return load_serve_file(args.config).cluster.run_dir
    return "runs"


def _refuse_if_running(run_dir: str) -> bool:
    # lazy: CLI start-up
    from kvcake.launch.runstate import live_cluster

    st = live_cluster(run_dir)
    if st is None:
        return False
    print(f"kvcake: error: a cluster is already running from {run_dir} (supervisor pid "
          f"{st['supervisor_pid']}, endpoint {st['url']}/v1); it was left untouched. Stop it "
          f"with `kvcake down --run-dir {run_dir}` or set cluster.run_dir to another "
          "directory.", file=sys.stderr)  # fmt: skip
    return True


def _up(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.launch.launcher import Cluster, load_serve_file

    path = args.config or str(default_cluster_file())
    # lazy: CLI start-up
    from kvcake.fleet.cluster import is_vllm_config, up

    if is_vllm_config(path):  # a fleet of vLLM engines (configs/vllm.toml)
        return up(path, detach=args.detach)
    conf = load_serve_file(path, {
        "instance": {"backend": args.backend},
        "cluster": {"prefill": args.prefill, "decode": args.decode, "proxy_port": args.port},
    })  # fmt: skip
    if _refuse_if_running(conf.cluster.run_dir):
        return 2
    if args.detach:
        return _detach(args, conf, path)
    if args.netns:  # emulated hosts (network namespaces)
        # lazy: CLI start-up
        from kvcake.launch.netns_up import up_netns

        return up_netns(path, conf, args.netns_rate, args.netns_delay_ms)
    cluster = Cluster(conf, supervise=True)
    print(f"starting cluster ({conf.instance.backend}), logs in {cluster.run_dir}", flush=True)
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        url = cluster.start()
        print(f"ready: OpenAI endpoint {url}/v1  (Ctrl-C stops the cluster; crashed processes "
              "are restarted)", flush=True)  # fmt: skip
        while not stop["now"]:
            time.sleep(0.2)
    finally:
        print("stopping cluster...", flush=True)
        cluster.stop()
        (Path(conf.cluster.run_dir) / "latest.json").unlink(missing_ok=True)
    return 0


def _detach(args: argparse.Namespace, conf: Any, path: str) -> int:
    argv = [sys.executable, "-m", "kvcake", *[a for a in sys.argv[1:] if a != "--detach"]]
    if args.config is None:
        argv += ["--config", path]
    log = Path(conf.cluster.run_dir)
    log.mkdir(parents=True, exist_ok=True)
    latest = log / "latest.json"
    latest.unlink(missing_ok=True)  # a stale record (its supervisor is gone: checked above)
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


def _state(run_dir: str) -> dict[str, Any] | None:
    p = Path(run_dir) / "latest.json"
    try:
        doc: dict[str, Any] = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return doc


def _status(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    import httpx

    run_dir = _run_dir(args)
    st = _state(run_dir)
    if st is None:
        print(f"no cluster running (no {run_dir}/latest.json)")
        return 1
    print(f"endpoint {st['url']}/v1   logs {st['run_dir']}   supervisor pid {st['supervisor_pid']}")
    for name, p in st["processes"].items():
        addrs = "  ".join(f"{k}={v}" for k, v in p.get("addresses", {}).items())
        last = f"  last exit: {p['last_exit']}" if p.get("last_exit") else ""
        print(f"  {name:<12} pid {p['pid']:<8} {'up' if p.get('alive') else 'DOWN':<5} "
              f"restarts {p.get('restarts', 0):<3} {addrs}{last}")  # fmt: skip
    _print_leader(str(st.get("master", "")))
    if st.get("netns_client"):  # the endpoint lives on the emulated client host
        print(f"endpoint reachable from netns {st['netns_client']}: "
              f"ip netns exec {st['netns_client']} curl {st['url']}/v1/models")  # fmt: skip
        return 0
    try:
        view = httpx.get(st["url"] + "/v1/cluster", timeout=5).json()
    except httpx.HTTPError as exc:
        print(f"proxy not answering: {exc!r}")
        return 1
    # lazy: CLI start-up
    from kvcake.proxy.health import summary

    print(f"{summary(view.get('health'))}   indexed KV blocks: {view.get('indexed_blocks', 0)}")
    for i in view["instances"]:
        print(f"  {i['id']:<12} {i['role']:<8} {'up' if i['alive'] else 'DOWN':<5} "
              f"queued {i['queued']:<3} running {i['running']:<3} "
              f"KV {i['kv_used']}/{i['kv_total']} blocks, cached {i['cached_blocks']}")  # fmt: skip
    return 0


def _print_leader(master: str) -> None:
    """With ``[ha]`` the pool is ``etcd://...``: name the master that leads *now* (the process
    list above shows each master's own ports, whoever leads)."""
    # lazy: CLI start-up
    from kvcake.store.ha.resolve import SCHEME, parse_etcd_address

    if not master.startswith(SCHEME):
        return
    # lazy: CLI start-up
    from kvcake.store.ha.election import read_leader
    from kvcake.store.ha.etcd import Etcd, EtcdError

    endpoints, cluster = parse_etcd_address(master)
    etcd = Etcd(endpoints, timeout_s=2.0)
    try:
        leader = read_leader(etcd, cluster)
    except EtcdError as exc:
        print(f"store leader: etcd not answering ({exc})")
        return
    finally:
        etcd.close()
    if leader is None or not leader.rpc:
        print("store leader: none right now (an election or a take-over is under way)")
    else:
        print(f"store leader: {leader.name} rpc={leader.rpc} http={leader.http or '-'}")


def _signal_recorded(st: dict[str, Any]) -> None:
    """SIGTERM each recorded process that is still the one the launcher started."""
    # lazy: CLI start-up
    from kvcake.launch.runstate import pid_is

    for name, p in st["processes"].items():
        pid, ticks = int(p["pid"]), int(p.get("start_ticks", 0))
        if not pid_is(pid, ticks):
            print(f"  {name}: pid {pid} is gone or is another process now; not signalled")
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def _down(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.launch.runstate import pid_is

    run_dir = _run_dir(args)
    st = _state(run_dir)
    if st is None:
        print("no cluster running")
        return 1
    latest = Path(run_dir) / "latest.json"
    pid, ticks = int(st["supervisor_pid"]), int(st.get("supervisor_start_ticks", 0))
    if not pid_is(pid, ticks):
        print(f"supervisor {pid} is gone; stopping its processes directly")
        _signal_recorded(st)
        latest.unlink(missing_ok=True)
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (latest.exists() or pid_is(pid, ticks)):
        time.sleep(0.2)  # the record goes first, then the supervisor exits
    if latest.exists() or pid_is(pid, ticks):
        print(f"the supervisor (pid {pid}) did not stop within 60 s", file=sys.stderr)
        return 1
    print("cluster stopped")
    return 0
