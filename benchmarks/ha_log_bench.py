"""The HA operation log alone (issue 15, "HA puts >= 50% of plain"): where a durable put's time
goes without the master RPC and the clients around it.

``--threads`` (16) threads each append one object record and wait until it is durable (what a
``PutEnd`` does in the master) for ``--seconds``, against a real etcd (Debian's ``etcd``,
started on free loopback ports in a temporary directory), once per ``--depth`` value (the
number of etcd transactions in flight; the master uses 4) and ``--repeats`` times, runs
interleaved. Prints records/s, etcd transactions written, records per transaction (the group
commit's batching) and the process's CPU per record.

    python benchmarks/ha_log_bench.py [--depths 1,2,4,8] [--threads 16] [--seconds 3] [--repeats 2]

Each run is a fresh process on its own etcd key prefix; every process is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_one(url: str, cluster: str, threads: int, seconds: float, depth: int) -> str:
    from kvcake.store.ha.election import Election
    from kvcake.store.ha.etcd import Etcd
    from kvcake.store.ha.etcdlog import EtcdOpLog
    from kvcake.store.ha.view import ObjRec, SegRec

    client = Etcd(url)
    election = Election(client, cluster, "bench", ttl_s=10)
    assert election.campaign(threading.Event())
    log = EtcdOpLog(client, cluster, election.revision, depth=depth)
    log.load()
    log.wait(log.append([SegRec("seg", "node/1/x", "127.0.0.1", "memory", 1 << 40)]))
    stop = time.monotonic() + seconds
    done = [0] * threads

    def worker(w: int) -> None:
        i = 0
        while time.monotonic() < stop:
            rec = ObjRec(
                f"{w}-{i}", 100, False, [("seg", (w * 10**7 + i) * 128, "memory")], sums=[i]
            )
            log.wait(log.append([rec]))
            i += 1
        done[w] = i

    c0, t0 = time.process_time(), time.monotonic()
    ts = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall, cpu, n = time.monotonic() - t0, time.process_time() - c0, sum(done)
    entries = max(1, log.entries_written - 1)
    log.close()
    election.resign()
    client.close()
    return (f"{n / wall:8.0f} rec/s  {entries:6d} txns  {n / entries:5.1f} rec/txn  "
            f"{1e6 * cpu / max(1, n):6.0f} us CPU/rec")  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_etcd(data: str) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("etcd")
    if exe is None:
        sys.exit("etcd is not installed (make etcd)")
    client, peer = free_port(), free_port()
    url, purl = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    p = subprocess.Popen(
        [exe, "--name", "b", "--data-dir", data, "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls", purl,
         "--initial-advertise-peer-urls", purl, "--initial-cluster", f"b={purl}",
         "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.post(url + "/v3/kv/range", json={"key": "eA=="}, timeout=1).is_success:
                return p, url
        except httpx.HTTPError:
            time.sleep(0.1)
    p.kill()
    sys.exit("etcd did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--one", nargs=4, metavar=("URL", "CLUSTER", "THREADS", "DEPTH"),
                    help=argparse.SUPPRESS)  # fmt: skip
    a = ap.parse_args()
    if a.one:
        url, cluster, threads, depth = a.one
        print(run_one(url, cluster, int(threads), a.seconds, int(depth)))
        return 0
    print(f"load: {os.getloadavg()[0]:.1f} (1 min average)")
    with tempfile.TemporaryDirectory(prefix="kvcake-ha-log-") as data:
        etcd, url = start_etcd(data)
        try:
            for r in range(a.repeats):
                for d in (int(x) for x in a.depths.split(",")):
                    out = subprocess.run(
                        [sys.executable, __file__, "--seconds", str(a.seconds), "--one", url,
                         f"r{r}d{d}", str(a.threads), str(d)],
                        capture_output=True, text=True, cwd=ROOT, timeout=120 + a.seconds,
                    )  # fmt: skip
                    print(f"depth {d}: {out.stdout.strip() or out.stderr.strip()[-300:]}")
        finally:
            etcd.terminate()
            etcd.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
