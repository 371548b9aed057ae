"""``kvcake up --netns`` (and ``kvcake netns-up``, root): run a
:class:`~kvcake.launch.netns_cluster.NetnsCluster` until SIGINT/SIGTERM, supervised like
``kvcake up``'s own children (launch/supervisor.py: a crashed process is restarted on its host
with its command and ports, with backoff; ``kvcake status`` shows the restarts).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from kvcake.launch.netns import unavailable
from kvcake.launch.netns_cluster import NetnsCluster, NetnsOptions
from kvcake.launch.runstate import write_state
from kvcake.launch.supervisor import Supervisor
from kvcake.serve.config import ServeFile


def run(opts: NetnsOptions, run_dir: Path, latest: Path | None = None) -> int:
    """Start, print the hosts and the endpoint, run until SIGINT/SIGTERM, stop. ``latest``:
    where `kvcake status` / `down` (and `up --detach`, waiting for it) find this cluster."""

    if why := unavailable():
        print(f"kvcake: error: {why}", file=sys.stderr)
        return 2
    stop = {"now": False}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.update(now=True))
    print(f"starting a cluster over network namespaces, logs in {run_dir}", flush=True)
    try:
        with NetnsCluster(opts, run_dir) as c:
            if latest is not None:
                c.on_change = lambda: _write_state(c, latest)
            supervisor = Supervisor(c)
            supervisor.start()
            for h in c.net.hosts.values():
                print(f"  {h.role:<11} {h.addr:<13} netns {h.ns}")
            print(f"ready: OpenAI endpoint {c.url}/v1 on the client host, e.g.\n"
                  f"  ip netns exec {c.net['client'].ns} curl {c.url}/v1/models\n"
                  "(Ctrl-C stops everything and removes the namespaces)", flush=True)  # fmt: skip
            c.write_state()
            while not stop["now"]:
                time.sleep(0.3)
            print("stopping...", flush=True)
            supervisor.stop()
    finally:  # only once processes and namespaces are gone: `kvcake down` waits for this
        if latest is not None:
            latest.unlink(missing_ok=True)
    return 0


def _write_state(c: NetnsCluster, latest: Path) -> None:
    """The launcher's state-file shape (launch/launcher.py ``write_state``) plus the client's
    namespace, from which the endpoint is reachable."""

    procs = {p.name: {"pid": p.proc.pid, "alive": p.alive(), "restarts": p.restarts,
                      "addresses": {"host": f"{c.net[p.role].addr} (netns {c.net[p.role].ns})"}}
             for p in c.procs if p.proc is not None}  # fmt: skip
    write_state([latest], c.url, c.run_dir, procs, instances=c.instances, master=c.master,
                netns_client=c.net["client"].ns)  # fmt: skip


def up_netns(path: str, conf: ServeFile, rate: str, delay_ms: float) -> int:
    """``kvcake up --netns``: the cluster file's counts, each process on its own host."""
    c = conf.cluster
    opts = NetnsOptions(prefill=c.prefill, decode=c.decode, stores=max(1, c.store_servers),
                        store_size=str(c.store_size), rate=rate, delay_ms=delay_ms,
                        config=path, startup_timeout_s=c.startup_timeout_s,
                        ha_masters=conf.ha.masters if conf.ha.enabled else 0,
                        overrides={"instance": {"backend": conf.instance.backend}})  # fmt: skip
    runs = Path(c.run_dir)
    return run(opts, runs / ("netns-" + time.strftime("%Y%m%d-%H%M%S")), runs / "latest.json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="cluster TOML ([kv], [instance], [proxy]); default emulated")
    p.add_argument("--prefill", type=int, default=1)
    p.add_argument("--decode", type=int, default=1)
    p.add_argument("--stores", type=int, default=2)
    p.add_argument("--store-size", default="256MB")
    p.add_argument("--rate", default="", help="egress cap of every host (tc rate: 1gbit)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay, master/instance RPC")
    p.add_argument("--ha-masters", type=int, default=0, help="N HA masters on etcd (0: one plain)")
    p.add_argument("--run-dir", default="runs/netns")
    a = p.parse_args(argv)
    opts = NetnsOptions(prefill=a.prefill, decode=a.decode, stores=a.stores, rate=a.rate,
                        store_size=a.store_size, delay_ms=a.delay_ms, config=a.config,
                        ha_masters=a.ha_masters)  # fmt: skip
    return run(opts, Path(a.run_dir) / time.strftime("%Y%m%d-%H%M%S"))


if __name__ == "__main__":
    raise SystemExit(main())
