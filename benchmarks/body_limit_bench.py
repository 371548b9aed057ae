"""The proxy under a 20 MB request body (issue 12): ``/health`` latency while the body is sent
and refused, and the proxy's RSS afterwards.

An emulated 1P+1D cluster (no store) runs two proxies over the same instances: this tree's
(413 before parsing, ``proxy.max_body_bytes`` = 8 MiB) and, with ``--baseline REV``, the proxy of
an earlier git revision (checked out into a temporary worktree; it parsed and tokenized the whole
body on the event loop). Runs alternate A, B, A, B... ``--repeats`` times; each sends one 20 MB
``/v1/completions`` body (with ``Content-Length``; ``--chunked`` also without) while a thread
polls ``/health`` every 20 ms and records each answer's latency. ``--codec torch`` gives both
proxies SmolLM2's tokenizer (as the default torch cluster has) instead of the byte codec.

Run: ``python benchmarks/body_limit_bench.py [--baseline 6dda18e] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from kvcake.launch.launcher import Cluster, load_serve_file

SIZE = 20_000_000


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_proxy(
    cluster: Cluster, pythonpath: str | None, log: Path, codec: str
) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "kvcake", "proxy", "--backend", codec, "--port", "0",
            "--admission", "none"]  # fmt: skip
    for name, url in cluster.instance_urls.items():
        argv += ["--decode" if name.startswith("decode") else "--prefill", url]
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env)
    assert proc.stdout is not None
    url = proc.stdout.readline().split()[-1].removesuffix("/v1")
    for _ in range(300):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"proxy at {url} never became healthy (log {log})")


def body(chunked: bool, size: int) -> bytes | Iterator[bytes]:
    words = b"lorem ipsum dolor sit amet " * (size // 27 + 1)
    data = b'{"prompt": "' + words[: size - 40] + b'", "max_tokens": 1}'
    if not chunked:
        return data
    step = 1 << 20
    return (data[i : i + step] for i in range(0, len(data), step))


def one_run(url: str, pid: int, chunked: bool, size: int) -> dict[str, Any]:
    lat: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=300) as c:
            while not done.is_set():
                t0 = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):  # counted as its full wait
                    c.get(url + "/health")
                lat.append(time.perf_counter() - t0)
                time.sleep(0.02)

    th = threading.Thread(target=poll)
    th.start()
    time.sleep(0.1)
    t0 = time.perf_counter()
    try:
        r = httpx.post(url + "/v1/completions", content=body(chunked, size), timeout=300,
                       headers={"content-type": "application/json"})  # fmt: skip
        status: Any = r.status_code
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    answer_s = time.perf_counter() - t0
    time.sleep(0.3)
    done.set()
    th.join()
    return {"status": status, "answer_s": round(answer_s, 3),
            "health_max_s": round(max(lat), 4), "health_p50_s": round(statistics.median(lat), 4),
            "health_polls": len(lat), "rss_after_mib": round(rss_mib(pid), 1)}  # fmt: skip


def worktree(rev: str, tmp: Path) -> str:
    path = tmp / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True)  # fmt: skip
    return str(path / "src")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--baseline", help="git revision whose proxy to compare with")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", type=int, default=SIZE, help="body bytes (default 20 MB)")
    ap.add_argument(
        "--codec",
        choices=("emulated", "torch"),
        default="emulated",
        help="the proxy's tokenizer: emulated = bytes, torch = SmolLM2's",
    )
    ap.add_argument("--chunked", action="store_true", help="also send without Content-Length")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ov = {"cluster": {"proxy_port": 0, "store_servers": 0, "run_dir": str(tmp)},
              "instance": {"backend": "emulated", "kv_blocks": 64}, "conductor": {"admission_policy": "none"}}  # fmt: skip
        base_src = worktree(args.baseline, tmp) if args.baseline else None
        try:
            with Cluster(load_serve_file(None, ov), run_dir=tmp / "run", quiet=True) as c:
                proxies = {"this tree": start_proxy(c, None, tmp / "a.log", args.codec)}
                if base_src:
                    proxies[f"baseline {args.baseline}"] = start_proxy(
                        c, base_src, tmp / "b.log", args.codec
                    )
                for name, (proc, _) in proxies.items():
                    print(json.dumps({"proxy": name, "rss_idle_mib": round(rss_mib(proc.pid), 1)}))
                try:
                    for rep in range(args.repeats):
                        for name, (proc, url) in proxies.items():
                            for chunked in (False, True) if args.chunked else (False,):
                                res = one_run(url, proc.pid, chunked, args.size)
                                print(json.dumps({"proxy": name, "repeat": rep,
                                                  "chunked": chunked, **res}), flush=True)  # fmt: skip
                finally:
                    for proc, _ in proxies.values():
                        proc.terminate()
                        proc.wait(20)
        finally:
            if base_src:
                subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "baseline")],
                               capture_output=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
