"""Store HA benchmark (issue 15): failover outage and the cost of durable puts.

1. Outage per kill: 3 masters on one etcd (``--etcd-endpoints``, lease TTL ``--ttl``), one
   store-server, a client putting 1 KB objects through ``etcd://``; the leader is SIGKILLed
   ``--kills`` times (a fresh standby is started after each kill). Outage = SIGKILL until the
   first put issued after it succeeds. Goal: median <= 5 s.
2. Put throughput with ``--clients`` (16) client processes doing single 4 KB puts for
   ``--seconds``: plain master vs HA master (etcd log, group commit) vs ``--state-dir`` master
   (fsynced file log), interleaved per repeat, the order rotated each repeat (plain ha dir, ha
   dir plain, ...). Goal: HA >= 50% of plain op/s.

    python benchmarks/ha_bench.py [--kills 5] [--repeats 3] [--clients 16] [--seconds 5]

Needs ``etcd`` on PATH (``make etcd``). Starts and stops every process itself (etcd on free
loopback ports in a temporary directory).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import httpx

from kvcake.core.stats import percentile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    def __init__(
        self, args: list[str], ready: str | None = None, timeout: float = 60, wait: bool = True
    ):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.popen = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
            text=True, env=env, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.info: dict[str, str] = {}
        self.ready = got = threading.Event()

        def pump() -> None:
            assert self.popen.stdout is not None
            for line in self.popen.stdout:
                self.lines.append(line)
                if ready and line.startswith(ready) and not got.is_set():
                    self.info = dict(re.findall(r"(\w+)=(\S*)", line))
                    got.set()

        threading.Thread(target=pump, daemon=True).start()
        if wait and ready and not got.wait(timeout):
            self.stop()
            raise RuntimeError(f"{args[:4]} did not start:\n{''.join(self.lines)}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        try:
            self.popen.wait(15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


def kvcake(*args: str, ready: str) -> Proc:
    return Proc([sys.executable, "-m", "kvcake", *args], ready=ready)


def start_etcd(data: str) -> tuple[Proc, str]:
    exe = shutil.which("etcd")
    if exe is None:
        sys.exit("etcd not found: make etcd (Debian etcd-server)")
    client, peer = free_port(), free_port()
    url, purl = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    proc = Proc([exe, "--name", "b", "--data-dir", data, "--listen-client-urls", url,
                 "--advertise-client-urls", url, "--listen-peer-urls", purl,
                 "--initial-advertise-peer-urls", purl, "--initial-cluster", f"b={purl}",
                 "--log-level", "error"])  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(url + "/v3/kv/range", json={"key": "eA=="}, timeout=1).is_success:
                return proc, url
        time.sleep(0.1)
    proc.stop()
    sys.exit("etcd did not start")


def ha_master(url: str, cluster: str, ttl: int) -> Proc:
    return kvcake("master", "--etcd-endpoints", url, "--cluster", cluster, "--port", "0",
                  "--http-port", "-1", "--ha-lease-ttl-s", str(ttl), "--client-ttl-s", "3",
                  ready="master standby")  # fmt: skip


def leader_pid(url: str, cluster: str, timeout: float = 30) -> int:
    from kvcake.store.ha.election import read_leader
    from kvcake.store.ha.etcd import Etcd

    etcd = Etcd(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            info = read_leader(etcd, cluster)
            if info is not None and info.rpc:
                return int(info.name.rsplit("/", 1)[1])
            time.sleep(0.05)
    finally:
        etcd.close()
    raise RuntimeError("no leader")


# --- 1. outage ---------------------------------------------------------------------------------


def measure_outage(url: str, kills: int, ttl: int) -> list[float]:
    from kvcake.store.client import Client

    cluster = f"outage{os.getpid()}"
    masters = [ha_master(url, cluster, ttl) for _ in range(3)]
    addr = f"etcd://{url.removeprefix('http://')}/{cluster}"
    leader_pid(url, cluster)
    node = kvcake("store-server", "--master", addr, "--segment-size", "64MiB", ready="store-server")
    outages = []
    n = 0
    try:
        with Client(master=addr) as client:
            for k in range(kills):
                for _ in range(20):
                    n += 1
                    client.put(f"warm/{n}", b"w" * 1024)
                pid = leader_pid(url, cluster)
                victim = next(m for m in masters if m.popen.pid == pid)
                t0 = time.monotonic()
                victim.stop(signal.SIGKILL)
                while True:
                    n += 1
                    try:
                        client.put(f"probe/{n}", b"p" * 1024)
                        break
                    except Exception as exc:  # a put caught in the switch: not acked, retry
                        print(f"  kill {k + 1}: put failed during failover ({type(exc).__name__})")
                outages.append(time.monotonic() - t0)
                print(f"  kill {k + 1}: outage {outages[-1]:.2f} s", flush=True)
                masters.remove(victim)
                masters.append(ha_master(url, cluster, ttl))
    finally:
        node.stop()
        for m in masters:
            m.stop()
    return outages


# --- 2. throughput -----------------------------------------------------------------------------


def worker(master: str, prefix: str, seconds: float, size: int) -> None:
    from kvcake.store.client import Client

    value = os.urandom(size)
    with Client(master=master) as client:
        client.put(f"{prefix}/warm", value)
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())  # the same moment for every worker
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + seconds
        n = 0
        lat = []
        while (now := time.time()) < end:
            client.put(f"{prefix}/{n}", value)
            lat.append(time.time() - now)
            n += 1
        p50, p99 = percentile(lat, 50) * 1e3, percentile(lat, 99) * 1e3
        print(f"ops={n} p50_ms={p50:.1f} p99_ms={p99:.1f}", flush=True)


def run_clients(master: str, clients: int, seconds: float, size: int, tag: str) -> float:
    procs = [
        Proc([sys.executable, os.path.abspath(__file__), "--worker", master, f"{tag}-{i}",
              str(seconds), str(size)], ready="ready", wait=False)
        for i in range(clients)
    ]  # fmt: skip
    for p in procs:  # every client connected and warm before the window opens
        if not p.ready.wait(180):
            raise RuntimeError("worker did not start:\n" + "".join(p.lines[-20:]))
    start_at = time.time() + 0.5
    for p in procs:
        assert p.popen.stdin is not None
        p.popen.stdin.write(f"{start_at}\n")
        p.popen.stdin.flush()
    total = 0
    for p in procs:
        p.popen.wait(seconds + 120)
        m = re.search(r"ops=(\d+)", "".join(p.lines))
        if m is None:
            raise RuntimeError("worker failed:\n" + "".join(p.lines[-20:]))
        total += int(m.group(1))
        if os.environ.get("KVCAKE_HA_BENCH_VERBOSE"):
            print("   ", p.lines[-1].strip())
    if time.time() - start_at > seconds + 30:
        print("  (workers overran their window)")
    return total / seconds


def etcd_db_size(url: str) -> int:
    """etcd's database size in bytes (what its space quota counts)."""
    return int(httpx.post(url + "/v3/maintenance/status", json={}, timeout=5).json()["dbSize"])


def one_round(mode: str, url: str, args: argparse.Namespace, r: int, tmp: str) -> float:
    procs: list[Proc] = []
    try:
        if mode == "plain":
            m = kvcake("master", "--port", "0", "--http-port", "-1", ready="master")
            master = m.info["rpc"]
        elif mode == "dir":
            m = kvcake("master", "--port", "0", "--http-port", "-1", "--state-dir",
                       os.path.join(tmp, f"dir{r}"), ready="master")  # fmt: skip
            master = m.info["rpc"]
        else:
            cluster = f"tp{os.getpid()}r{r}"
            m = ha_master(url, cluster, args.ttl)
            leader_pid(url, cluster)
            master = f"etcd://{url.removeprefix('http://')}/{cluster}"
        procs.append(m)
        procs.append(
            kvcake(
                "store-server", "--master", master, "--segment-size", "1GiB", ready="store-server"
            )
        )
        return run_clients(master, args.clients, args.seconds, 4096, f"{mode}{r}")
    finally:
        for p in reversed(procs):
            p.stop()
        if os.environ.get("KVCAKE_HA_BENCH_VERBOSE") and procs:
            for line in procs[0].lines:  # the master's group-commit statistics at its stop
                if "oplog:" in line:
                    print("   ", line.strip())


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        master, prefix, seconds, size = sys.argv[2:6]
        worker(master, prefix, float(seconds), int(size))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--ttl", type=int, default=2, help="leader lease TTL (s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--modes", default="plain,ha,dir")
    ap.add_argument("--skip-outage", action="store_true")
    ap.add_argument(
        "--etcd-tmpfs",
        action="store_true",
        help="etcd's data in /dev/shm: what the protocol costs when etcd's disk is not the "
        "machine's shared, loaded one (stands for a dedicated etcd SSD; not durable)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvcake-ha-bench-") as tmp:
        data = tempfile.mkdtemp(prefix="kvcake-etcd-", dir="/dev/shm") if args.etcd_tmpfs else None
        etcd, url = start_etcd(data or os.path.join(tmp, "etcd"))
        print(f"etcd data: {'tmpfs (/dev/shm)' if data else 'disk (' + tmp + ')'}")
        try:
            results: dict[str, Any] = {}
            if not args.skip_outage:
                print(f"outage per leader SIGKILL ({args.kills} kills, lease TTL {args.ttl} s):")
                out = measure_outage(url, args.kills, args.ttl)
                results["outage"] = out
                print(f"outage: median {statistics.median(out):.2f} s, max {max(out):.2f} s "
                      f"(goal: median <= 5 s)")  # fmt: skip
            modes = args.modes.split(",")
            rates: dict[str, list[float]] = {m: [] for m in modes}
            print(f"put throughput, {args.clients} client processes, 4 KB single puts, "
                  f"{args.seconds:g} s per run:")  # fmt: skip
            for r in range(args.repeats):
                for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:  # rotated
                    rate = one_round(mode, url, args, r, tmp)
                    rates[mode].append(rate)
                    db = f", etcd db {etcd_db_size(url) / 2**20:.1f} MiB" if mode == "ha" else ""
                    print(f"  round {r + 1} {mode:5}: {rate:8.0f} put/s{db}", flush=True)
            if "plain" in rates:
                for mode in modes:
                    if mode == "plain":
                        continue
                    ratios = [a / b for a, b in zip(rates[mode], rates["plain"], strict=True)]
                    print(f"{mode} / plain: per round {', '.join(f'{x:.2f}' for x in ratios)}; "
                          f"median {statistics.median(ratios):.2f} (goal for ha: >= 0.50)")  # fmt: skip
        finally:
            etcd.stop()
            if data:
                shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
