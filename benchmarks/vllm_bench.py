"""vLLM on kvcake (issue 13): what the KvcakeConnector buys a fleet of real vLLM engines (CPU).

Three engines, started once: ``plain`` (vLLM alone, its own prefix cache), ``a`` and ``b``
(both with the connector, one kvcake master + store-server). Each repeat uses fresh seeded
token prompts, interleaved, and measures the client-side latency of a ``max_tokens=1``
completion (= TTFT: prefill plus one sampled token) for

* ``cold``    — a 2,048-token prompt nobody has seen (engine b; b saves it into the pool);
* ``pooled``  — 1,792 tokens prefilled by engine a, then the same 1,792 + 256 new tokens on b:
  b loads the 1,792 from the pool (goal: >= 5x lower than cold);
* ``local``   — b again with the same 1,792 + another 256: vLLM's own local prefix hit
  (goal: pooled within 1.25x of local);
* ``miss_plain`` / ``miss_conn`` — a fresh 2,048-token prompt on plain vLLM vs on b: the
  connector's overhead on a pool miss (lookup + synchronous copy-out of the blocks it saves;
  goal <= 5% of TTFT). plain and b are pinned to different cores, so the two are compared
  over several repeats as ratios.

``--part fleet`` (issue cases a, a', b): the bundled conversation sample as token prompts
(``core.trace.tokens_from_hash_ids``, 32 tokens per trace block: equal hash ids = equal blocks)
replayed by 2 closed-loop clients against (a) 2 plain vLLM engines behind round-robin, (a')
the same behind session affinity (a conversation = its first non-system block id, sticky), and
(b) 2 engines with the connector behind kvcake's proxy (pool + conductor). TTFT p50/p99
(first streamed token), requests/s, prefix-hit rate (vLLM's local + external hits / queries),
and the share of prefills that ran while another request was on the same engine.

Run: ``kvcake bench vllm`` or ``python benchmarks/vllm_bench.py [--repeats 3]``. Needs
``make install-vllm``. Prints JSON lines and a table; recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from kvcake.integrations.vllm.keys import BlockNamer
from kvcake.serve.vllm_procs import (
    VllmEngine,
    VllmEngineSpec,
    default_model_dir,
    spawn_kvcake,
    start_engine,
)

BS = 32


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def latency(engine: VllmEngine, prompt: list[int]) -> float:
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    r = httpx.post(engine.url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0


def wait_pooled(master: str, model_key: str, prompt: list[int], timeout_s: float = 60) -> None:
    from kvcake.store.client import Client

    keys = BlockNamer(model_key, "float32", BS).keys(prompt)
    with Client(master=master) as c:
        deadline = time.monotonic() + timeout_s
        while not all(c.batch_is_exist(keys)):
            if time.monotonic() > deadline:
                raise RuntimeError("blocks never reached the pool")
            time.sleep(0.1)


def ttft_stream(url: str, prompt: list[int], max_tokens: int) -> tuple[float, float, str]:
    """(TTFT, whole request, the engine that ran it: kvcake's proxy names it in a header)."""
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}  # fmt: skip
    t0 = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        engine = r.headers.get("x-kvcake-engine", url)
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("no token streamed")
    return first, time.perf_counter() - t0, engine


def shared_share(spans: list[tuple[float, float, float, str]]) -> float:
    """The share of requests whose prefill ran while another request was on the same engine
    (spans: start, first token, end, engine): what a placement could have avoided."""
    shared = 0
    for i, (s, f, _e, eng) in enumerate(spans):
        if any(j != i and e2 == eng and s2 < f and e > s for j, (s2, _f, e, e2) in
               enumerate(spans)):  # fmt: skip
            shared += 1
    return shared / max(1, len(spans))


def workload(n: int, seed: int, max_prompt: int = 3000) -> list[tuple[str, list[int], int]]:
    """(session, prompt tokens, max_tokens) of the first ``n`` sample requests that belong to
    multi-turn conversations (a conversation = its first non-system block id), trace order."""
    from collections import Counter

    from kvcake.core.trace import read_trace, tokens_from_hash_ids
    from kvcake.data import sample_trace_path

    recs = [r for r in read_trace(sample_trace_path()) if len(r.hash_ids) > 1]
    turns = Counter(r.hash_ids[1] for r in recs)
    chosen: set[int] = set()  # whole conversations, in order of their first turn
    count = 0
    for rec in recs:
        sid = rec.hash_ids[1]
        if turns[sid] >= 2 and sid not in chosen and count + min(turns[sid], 4) <= n:
            chosen.add(sid)
            count += min(turns[sid], 4)
    seen: Counter[int] = Counter()
    out = []
    for rec in recs:
        sid = rec.hash_ids[1]
        if sid not in chosen or seen[sid] >= 4:
            continue
        seen[sid] += 1
        prompt = tokens_from_hash_ids(list(rec.hash_ids), rec.input_length, tokens_per_block=BS,
                                      seed=seed)[:max_prompt]  # fmt: skip
        out.append((str(rec.hash_ids[1]), prompt, max(1, min(16, rec.output_length // 32))))
        if len(out) == n:
            break
    return out


def ideal_hit_rate(reqs: list[tuple[str, list[int], int]]) -> float:
    """The workload's prefix-hit ceiling: the share of prompt tokens in full blocks whose whole
    prefix an earlier request had (one infinite cache shared by every engine). No router or
    pool can reuse more, so TTFT can fall at most by about this share of prefill work."""
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for _, prompt, _ in reqs:
        total += len(prompt)
        leading = True
        for j in range(len(prompt) // BS):
            prefix = tuple(prompt[: (j + 1) * BS])
            leading = leading and prefix in seen
            hit += BS if leading else 0
            seen.add(prefix)
    return hit / max(1, total)


def hit_counters(engines: list[VllmEngine]) -> tuple[float, float]:
    q = h = 0.0
    for e in engines:
        text = httpx.get(e.url + "/metrics", timeout=10).text
        for line in text.splitlines():
            name = line.split("{", 1)[0]
            if name in ("vllm:prefix_cache_queries_total",):
                q += float(line.rsplit(" ", 1)[1])
            elif name in ("vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total"):
                h += float(line.rsplit(" ", 1)[1])
    return q, h


def replay(route: Any, engines: list[VllmEngine], reqs: list[tuple[str, list[int], int]],
           clients: int = 2) -> dict[str, float]:  # fmt: skip
    """Closed loop: ``clients`` threads take the next request in trace order."""
    import threading

    q0, h0 = hit_counters(engines)
    ttfts: list[float] = []
    spans: list[tuple[float, float, float, str]] = []
    lock = threading.Lock()
    it = iter(enumerate(reqs))

    def client() -> None:
        while True:
            with lock:
                nxt = next(it, None)
            if nxt is None:
                return
            i, (session, prompt, mt) = nxt
            start = time.perf_counter()
            t, whole, engine = ttft_stream(route(i, session), prompt, mt)
            with lock:
                ttfts.append(t)
                spans.append((start, start + t, start + whole, engine))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    q1, h1 = hit_counters(engines)
    ttfts.sort()
    return {
        "ttft_p50": statistics.median(ttfts),
        "ttft_p99": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
        "req_per_s": len(reqs) / wall,
        "hit_rate": (h1 - h0) / max(1.0, q1 - q0),
        "shared": shared_share(spans),
    }


def fleet_repeat(plain: list[VllmEngine], conn: list[VllmEngine], proxy_url: str, n: int,
                 r: int) -> dict[str, dict[str, float]]:  # fmt: skip
    sticky: dict[str, str] = {}

    def rr(i: int, session: str) -> str:
        return plain[i % 2].url

    def affinity(i: int, session: str) -> str:
        if session not in sticky:
            sticky[session] = plain[len(sticky) % 2].url
        return sticky[session]

    print(json.dumps({"fleet_repeat": r, "ideal_hit_rate": round(
        ideal_hit_rate(workload(n, seed=10 * r + 3)), 3)}), flush=True)  # fmt: skip
    return {
        "a_round_robin": replay(rr, plain, workload(n, seed=10 * r + 1)),
        "a2_session_affinity": replay(affinity, plain, workload(n, seed=10 * r + 2)),
        "b_kvcake": replay(lambda i, s: proxy_url, conn, workload(n, seed=10 * r + 3)),
    }


def start_proxy(master: str, engines: list[VllmEngine]) -> tuple[Any, str]:
    import subprocess
    import sys

    argv = [sys.executable, "-m", "kvcake.serve.vllm_proxy", "--master", master]
    for e in engines:
        argv += ["--engine", f"{e.spec.name}={e.url}@tcp://127.0.0.1:{e.spec.kv_events_port}"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    url = p.stdout.readline().split("=", 1)[1].strip()
    deadline = time.monotonic() + 60
    while httpx.get(url + "/health").status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError("proxy not healthy")
        time.sleep(0.3)
    return p, url


def one_repeat(
    eng: dict[str, VllmEngine], master: str, model_key: str, seed: int
) -> dict[str, float]:
    rng = np.random.default_rng(seed)

    def toks(n: int) -> list[int]:
        return rng.integers(100, 40000, n).tolist()

    out: dict[str, float] = {}
    prefix = toks(1792)
    latency(eng["a"], prefix + toks(256))  # engine a prefills (and pools) the prefix
    wait_pooled(master, model_key, prefix)
    out["pooled"] = latency(eng["b"], prefix + toks(256))
    out["local"] = latency(eng["b"], prefix + toks(256))
    out["cold"] = latency(eng["b"], toks(2048))
    # ABAB: connector miss vs plain vLLM
    out["miss_plain"] = latency(eng["plain"], toks(2048))
    miss_conn = latency(eng["b"], toks(2048))
    out["miss_plain"] = (out["miss_plain"] + latency(eng["plain"], toks(2048))) / 2
    out["miss_conn"] = (miss_conn + latency(eng["b"], toks(2048))) / 2
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--part", choices=("reuse", "fleet", "all"), default="all")
    ap.add_argument("--requests", type=int, default=24, help="fleet part: requests per case")
    args = ap.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="kvcake-vllm-bench-"))
    model = default_model_dir()
    model_key = f"{Path(model).name}@vllm"
    master = spawn_kvcake("master", "--port", "0", "--http-port", "-1")
    store = spawn_kvcake("store-server", "--master", master.info["rpc"], "--segment-size", "2GiB")
    addr = master.info["rpc"]
    specs = {
        "plain": VllmEngineSpec("plain", free_port(), model, cpu="0"),
        "a": VllmEngineSpec("a", free_port(), model, master=addr, cpu="0",
                            kv_events_port=free_port()),
        "b": VllmEngineSpec("b", free_port(), model, master=addr, cpu="1",
                            kv_events_port=free_port()),
    }  # fmt: skip
    if args.part in ("fleet", "all"):
        specs["plain1"] = VllmEngineSpec("plain1", free_port(), model, cpu="1")
    if args.part == "fleet":
        del specs["plain"]
        specs["plain0"] = VllmEngineSpec("plain0", free_port(), model, cpu="0")
    eng: dict[str, VllmEngine] = {}
    try:
        for name, spec in specs.items():
            eng[name] = start_engine(spec, logs)
        t0 = time.monotonic()
        for e in eng.values():
            e.wait_ready(600)
        print(f"# engines ready in {time.monotonic() - t0:.0f} s; logs in {logs}", flush=True)
        for e in eng.values():  # warm-up: first request pays one-off costs
            latency(e, list(range(200, 264)))
        doc: dict[str, Any] = {}
        if args.part in ("reuse", "all"):
            runs: list[dict[str, float]] = []
            for r in range(args.repeats):
                res = one_repeat(eng, addr, model_key, seed=1000 + r)
                runs.append(res)
                print(json.dumps({"repeat": r, **{k: round(v, 4) for k, v in res.items()}}),
                      flush=True)  # fmt: skip
            summary = summarize(runs)
            print(json.dumps({"summary": summary}), flush=True)
            table(summary)
            doc["reuse"] = {"runs": runs, "summary": summary}
        if args.part in ("fleet", "all"):
            plain = [eng["plain" if "plain" in eng else "plain0"], eng["plain1"]]
            proxy, purl = start_proxy(addr, [eng["a"], eng["b"]])
            fleet_runs = []
            try:
                for r in range(args.repeats):
                    res = fleet_repeat(plain, [eng["a"], eng["b"]], purl, args.requests, r)
                    fleet_runs.append(res)
                    print(json.dumps({"fleet_repeat": r, **res}), flush=True)
            finally:
                proxy.terminate()
                proxy.wait(10)
            fleet_table(fleet_runs)
            doc["fleet"] = fleet_runs
        if args.json:
            args.json.write_text(json.dumps(doc, indent=1))
    finally:
        for e in eng.values():
            e.stop()
        store.stop()
        master.stop()
    return 0


def summarize(runs: list[dict[str, float]]) -> dict[str, Any]:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    ratios = {
        "cold_over_pooled": [r["cold"] / r["pooled"] for r in runs],
        "pooled_over_local": [r["pooled"] / r["local"] for r in runs],
        "miss_overhead": [r["miss_conn"] / r["miss_plain"] - 1 for r in runs],
    }
    return {
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "ratios": {k: [round(x, 3) for x in v] for k, v in ratios.items()},
    }


def table(summary: dict[str, Any]) -> None:
    med, ratios = summary["median_s"], summary["ratios"]
    print("\n| case | median TTFT (s) |\n|---|---:|")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} |")
    print("\n| ratio | per repeat | goal |\n|---|---|---|")
    goals = {"cold_over_pooled": ">= 5", "pooled_over_local": "<= 1.25", "miss_overhead": "<= 0.05"}
    for k, v in ratios.items():
        print(f"| {k} | {', '.join(f'{x:.3f}' for x in v)} | {goals[k]} |")


def fleet_table(runs: list[dict[str, dict[str, float]]]) -> None:
    print("\n| case | TTFT p50 (s) | TTFT p99 (s) | req/s | hit rate | prefills sharing an engine |"
          "\n|---|---:|---:|---:|---:|---:|")  # fmt: skip
    for case in runs[0]:
        cell = {k: statistics.median(r[case][k] for r in runs) for k in runs[0][case]}
        print(f"| {case} | {cell['ttft_p50']:.3f} | {cell['ttft_p99']:.3f} | "
              f"{cell['req_per_s']:.3f} | {cell['hit_rate']:.2f} | {cell['shared']:.2f} |")  # fmt: skip
    for base in ("a_round_robin", "a2_session_affinity"):
        p50 = [r["b_kvcake"]["ttft_p50"] / r[base]["ttft_p50"] for r in runs]
        thr = [r["b_kvcake"]["req_per_s"] / r[base]["req_per_s"] for r in runs]
        print(
            f"b / {base}: TTFT p50 x{', '.join(f'{x:.2f}' for x in p50)}; "
            f"throughput x{', '.join(f'{x:.2f}' for x in thr)}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
