"""Soak test (issue 12, section 3; on demand, not in CI): mixed traffic with aborts against a
local cluster for ``--minutes`` (default 30), then: is every process's RSS, open fds and threads,
and the /dev/shm use, flat (within 10 %) from the start (after ``--warmup-s`` of the same
traffic) to the end (after the traffic stopped and ``--settle-s`` passed)?

Traffic, from ``--clients`` threads: streaming and non-streaming completions and chats, prompts
with shared prefixes (KV reuse, pool puts and fetches), stop strings, requests aborted after a few
streamed chunks (the client closes the stream), and malformed bodies (400s).

Run: ``python benchmarks/soak.py [--config configs/cluster.toml] [--backend emulated]
[--minutes 30] [--out soak.json]``. The default cluster is the real-model one; ``--backend
emulated`` keeps its shape with the emulated engine. Prints JSON lines and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from kvcake.core import memtrace
from kvcake.launch.launcher import Cluster, load_serve_file
from kvcake.serve.config import default_cluster_file

TOLERANCE = 0.10


def proc_sample(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    vals = {ln.split(":")[0]: ln.split(":")[1].split() for ln in status if ":" in ln}
    kib = lambda k: int(vals.get(k, ["0"])[0]) / 1024  # noqa: E731
    # RSS = private heap (RssAnon) + mapped files + shared memory (RssShmem). A process that
    # writes into a store node's /dev/shm segment (pool puts over shm) counts the pages it
    # touched there: they grow with the pool's fill up to the segment size — use, not a leak.
    return {"rss_mib": kib("VmRSS"), "rss_anon_mib": kib("RssAnon"),
            "rss_shmem_mib": kib("RssShmem"), "rss_file_mib": kib("RssFile"),
            "threads": int(vals["Threads"][0]), "fds": len(os.listdir(f"/proc/{pid}/fd"))}  # fmt: skip


def shm_sample(pids: list[int]) -> dict[str, float]:
    """/dev/shm files mapped by the cluster's processes (other users of /dev/shm excluded)."""
    paths: set[str] = set()
    for pid in pids:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            if "/dev/shm/" in line and not line.endswith("(deleted)"):
                paths.add(line[line.index("/dev/shm/") :])
    files = {p: Path(p).stat() for p in sorted(paths) if Path(p).exists()}
    per = {p: {"used_mib": round(st.st_blocks * 512 / 2**20, 1), "size_mib": round(st.st_size / 2**20, 1)}
           for p, st in files.items()}  # fmt: skip
    used = sum(st.st_blocks * 512 for st in files.values())
    # Segments fill up to their size (the store pool takes puts until eviction): growth up to
    # size_mib is use, growth beyond it would be a leak. Reported per file.
    return {"shm_files": len(paths), "shm_used_mib": used / 2**20, "shm_per_file": per}


def sample(c: Cluster) -> dict[str, Any]:
    live = {ch.name: ch.proc.pid for ch in c.children if ch.proc and ch.proc.poll() is None}
    procs = {name: proc_sample(pid) for name, pid in live.items()}
    return {"t": time.time(), "procs": procs, **shm_sample(list(live.values()))}


class Traffic:
    def __init__(self, url: str, clients: int, seed: int):
        self.url, self.clients, self.seed = url, clients, seed
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)
        ]
        self.prefixes = [f"Document {k}: " + "lorem ipsum dolor sit amet " * 40 for k in range(4)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)

    def _count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def _run(self, i: int) -> None:
        rng = random.Random(self.seed * 1000 + i)
        with httpx.Client(base_url=self.url, timeout=120) as http:
            while not self.stop.is_set():
                try:
                    self._count(self._one(http, rng))
                except httpx.HTTPError as exc:
                    self._count(f"client_error:{type(exc).__name__}")
                    time.sleep(0.5)

    def _one(self, http: httpx.Client, rng: random.Random) -> str:
        kind = rng.choices(["complete", "chat", "stream", "abort", "stop", "bad"],
                           [3, 2, 3, 2, 1, 1])[0]  # fmt: skip
        text = rng.choice(self.prefixes) + f"question {rng.randrange(10**6)}?"
        if kind == "bad":
            r = http.post("/v1/completions", content=b'{"prompt": "\\ud800"}')
            return f"bad:{r.status_code}"
        body: dict[str, Any] = {"max_tokens": rng.randint(4, 48), "temperature": 0}
        if kind == "chat":
            body["messages"] = [{"role": "user", "content": text}]
            return f"chat:{http.post('/v1/chat/completions', json=body).status_code}"
        body["prompt"] = text
        if kind == "stop":
            body["stop"] = [" ", "\n"]
        if kind in ("stream", "abort"):
            body["stream"] = True
            with http.stream("POST", "/v1/completions", json=body) as r:
                for n, _ in enumerate(r.iter_lines()):
                    if kind == "abort" and n >= 3:
                        break  # the client goes away mid-stream
            return f"{kind}:{r.status_code}"
        return f"{kind}:{http.post('/v1/completions', json=body).status_code}"


def snap(c: Cluster, where: str | None) -> None:
    """Ask the master, the instances and the proxy for a heap snapshot (memtrace: SIGUSR2)."""
    if not where:
        return
    before = len(list(Path(where).glob("*.snap")))
    n = 0
    for ch in c.children:
        if ch.proc and ch.proc.poll() is None and not ch.name.startswith("store"):
            os.kill(ch.proc.pid, signal.SIGUSR2)
            n += 1
    deadline = time.monotonic() + 120  # a traced heap takes seconds to write (renamed when done)
    while len(list(Path(where).glob("*.snap"))) < before + n and time.monotonic() < deadline:
        time.sleep(0.5)


def heap_growth(where: Path) -> None:
    """Per process: the allocation sites that grew most between its first and last snapshot."""
    by: dict[str, list[Path]] = {}
    for p in sorted(where.glob("*.snap"), key=lambda p: int(p.stem.rsplit("-", 1)[1])):
        by.setdefault(p.stem.rsplit("-", 2)[0], []).append(p)
    for name, snaps in sorted(by.items()):
        if len(snaps) >= 2:
            print(f"heap growth of {name} ({snaps[0].name} -> {snaps[-1].name}):")
            for line in memtrace.diff(snaps[0], snaps[-1]):
                print("  " + line)


def compare(start: dict[str, Any], end: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, s in start["procs"].items():
        e = end["procs"].get(name)
        for key in ("rss_mib", "rss_anon_mib", "rss_shmem_mib", "fds", "threads"):
            a, b = s.get(key, 0.0), (e or {}).get(key, float("nan"))
            rows.append({"process": name, "metric": key, "start": round(a, 1), "end": round(b, 1),
                         "ratio": round(b / a, 3) if a else None})  # fmt: skip
    for f, e in end["shm_per_file"].items():
        print(json.dumps({"shm_file": f, "start": start["shm_per_file"].get(f), "end": e}))
    for key in ("shm_files", "shm_used_mib"):
        a, b = start[key], end[key]
        rows.append({"process": "/dev/shm", "metric": key, "start": round(a, 1),
                     "end": round(b, 1), "ratio": round(b / a, 3) if a else None})  # fmt: skip
    shm_size = sum(f["size_mib"] for f in end["shm_per_file"].values())
    for r in rows:
        r["flat"] = r["ratio"] is not None and r["ratio"] <= 1 + TOLERANCE
        if r["metric"] == "rss_mib":  # anon + shared: judged by its two parts below
            r["flat"] = None
        if r["metric"] == "rss_shmem_mib":  # touched pages of mapped segments: bounded by them
            r["flat"] = r["end"] <= shm_size
        if r["metric"] == "shm_used_mib":
            r["flat"] = r["end"] <= shm_size
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=str(default_cluster_file()))
    ap.add_argument("--backend", choices=("torch", "emulated"))
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--warmup-s", type=float, default=60.0)
    ap.add_argument("--settle-s", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the samples and the comparison as JSON")
    ap.add_argument("--store-size", default="",
                    help="the storage node's segment (e.g. 32MB): small enough that the pool is "
                    "full, and evicting, before the start sample; the master's object table and "
                    "the proxy's pool index grow with every stored block until then (~0.8 KB "
                    "each), so a filling pool reads as growth")  # fmt: skip
    ap.add_argument("--tracemalloc", metavar="DIR",
                    help="trace the heap of the master, the instances and the proxy: snapshots at start and "
                    "end in DIR, and the allocation sites that grew most are printed (RSS is then "
                    "not judged: taking a snapshot itself keeps ~16 MiB per process)")  # fmt: skip
    args = ap.parse_args()
    if args.tracemalloc:
        os.environ[memtrace.ENV] = str(Path(args.tracemalloc).resolve())
    with tempfile.TemporaryDirectory() as d:
        ov: dict[str, dict[str, Any]] = {"cluster": {"proxy_port": 0, "run_dir": d},
                                         "conductor": {"admission_policy": "none"}}  # fmt: skip
        if args.backend:
            ov["instance"] = {"backend": args.backend}
        if args.store_size:
            ov["cluster"]["store_size"] = args.store_size
        with Cluster(load_serve_file(args.config, ov), run_dir=Path(d) / "run", quiet=True) as c:
            traffic = Traffic(c.url, args.clients, args.seed)
            traffic.start()
            time.sleep(args.warmup_s)
            start = sample(c)
            snap(c, args.tracemalloc)
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.minutes * 60:
                time.sleep(min(30.0, args.minutes * 60))
                print(
                    json.dumps({"elapsed_s": round(time.monotonic() - t0), **dict(traffic.counts)}),
                    flush=True,
                )
            traffic.join()
            time.sleep(args.settle_s)
            end = sample(c)
            snap(c, args.tracemalloc)
            dead = c.dead_children()
    rows = compare(start, end)
    if args.tracemalloc:  # the snapshots' own memory (taken after `start`) is in `end`'s RSS
        for r in rows:
            if r["metric"].startswith("rss"):
                r["flat"] = None
    if args.tracemalloc:
        heap_growth(Path(args.tracemalloc))
    for r in rows:
        print(json.dumps(r))
    summary = {"minutes": args.minutes, "requests": dict(traffic.counts), "dead": dead,
               "all_flat": all(r["flat"] is not False for r in rows)}  # fmt: skip
    print(json.dumps(summary))
    if args.out:
        Path(args.out).write_text(
            json.dumps({"start": start, "end": end, "rows": rows, **summary}, indent=2)
        )
    return 0 if summary["all_flat"] and not dead else 1


if __name__ == "__main__":
    raise SystemExit(main())
