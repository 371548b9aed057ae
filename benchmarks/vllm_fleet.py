"""The fleet part of ``vllm_bench.py`` (issue 13, cases a, a', b): the bundled conversation
sample replayed against 2 vLLM engines behind round-robin, session affinity, or kvcake's proxy.

Two replays:

* **closed loop** (``replay``): 2 clients take the next request in trace order; TTFT p50/p99,
  requests/s, hit rate, the share of prefills that ran next to another request on one engine.
* **open loop at a swept rate** (``open_replay`` / ``slo_sweep``): requests arrive as a seeded
  Poisson process in trace order (the same arrival times for every router, whatever it
  serves: the offered load does not depend on the router under test). Each router's
  **throughput at the TTFT SLO** is the arrival rate at which the share of requests whose TTFT
  meets the SLO falls below the target (interpolated between the swept rates), as DistServe and
  the Mooncake paper measure capacity under an SLO.
"""

from __future__ import annotations

import itertools
import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np

from kvcake.core.promtext import parse_metrics, total
from kvcake.core.stats import percentile
from kvcake.fleet.procs import VllmEngine

BS = 32
Request = tuple[str, list[int], int]  # session, prompt tokens, max_tokens
Route = Callable[[int, str], str]


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


def workload(n: int, seed: int, max_prompt: int = 3000) -> list[Request]:
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


def ideal_hit_rate(reqs: list[Request]) -> float:
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
        m = parse_metrics(httpx.get(e.url + "/metrics", timeout=10).text)
        q += total(m, "vllm:prefix_cache_queries_total")
        h += total(m, "vllm:prefix_cache_hits_total")
        h += total(m, "vllm:external_prefix_cache_hits_total")
    return q, h


def run_all(threads: list[threading.Thread]) -> None:
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def replay(route: Route, engines: list[VllmEngine], reqs: list[Request],
           clients: int = 2) -> dict[str, float]:  # fmt: skip
    """Closed loop: ``clients`` threads take the next request in trace order."""
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
    run_all([threading.Thread(target=client) for _ in range(clients)])
    wall = time.perf_counter() - t0
    q1, h1 = hit_counters(engines)
    ttfts.sort()
    return {
        "ttft_p50": statistics.median(ttfts),
        "ttft_p99": percentile(ttfts, 99),
        "req_per_s": len(reqs) / wall,
        "hit_rate": (h1 - h0) / max(1.0, q1 - q0),
        "shared": shared_share(spans),
    }


def routers(plain: list[VllmEngine]) -> tuple[Route, Route]:
    """(round-robin, session affinity) over the plain engines; affinity gives each new
    conversation the next engine in turn and keeps it there. Thread-safe."""
    sticky: dict[str, str] = {}
    lock = threading.Lock()

    def rr(i: int, session: str) -> str:
        return plain[i % 2].url

    def affinity(i: int, session: str) -> str:
        with lock:
            if session not in sticky:
                sticky[session] = plain[len(sticky) % 2].url
            return sticky[session]

    return rr, affinity


def fleet_repeat(plain: list[VllmEngine], conn: list[VllmEngine], proxy_url: str, n: int,
                 r: int) -> dict[str, dict[str, float]]:  # fmt: skip
    rr, affinity = routers(plain)
    print(json.dumps({"fleet_repeat": r, "ideal_hit_rate": round(
        ideal_hit_rate(workload(n, seed=10 * r + 3)), 3)}), flush=True)  # fmt: skip
    return {
        "a_round_robin": replay(rr, plain, workload(n, seed=10 * r + 1)),
        "a2_session_affinity": replay(affinity, plain, workload(n, seed=10 * r + 2)),
        "b_kvcake": replay(lambda i, s: proxy_url, conn, workload(n, seed=10 * r + 3)),
    }


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


def arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Seeded Poisson arrival times (s, the first at 0) of ``n`` requests at ``rate``/s."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, max(0, n - 1))
    return [0.0, *np.cumsum(gaps).tolist()][:n]


def open_replay(route: Route, engines: list[VllmEngine], reqs: list[Request],
                at: list[float], slo_s: float) -> dict[str, float]:  # fmt: skip
    """Open loop: request i is sent at ``at[i]`` whatever the engines are doing (one thread
    per request), so every router gets the same offered load. TTFT counts from the send; a
    failed request misses the SLO."""
    q0, h0 = hit_counters(engines)
    ttfts: list[float] = []
    spans: list[tuple[float, float, float, str]] = []
    lock = threading.Lock()
    t0 = time.perf_counter() + 0.1

    def one(i: int) -> None:
        time.sleep(max(0.0, t0 + at[i] - time.perf_counter()))
        session, prompt, mt = reqs[i]
        start = time.perf_counter()
        try:
            t, whole, engine = ttft_stream(route(i, session), prompt, mt)
        except httpx.HTTPError:
            t, whole, engine = float("inf"), time.perf_counter() - start, "failed"
        with lock:
            ttfts.append(t)
            spans.append((start, start + min(t, whole), start + whole, engine))

    run_all([threading.Thread(target=one, args=(i,)) for i in range(len(reqs))])
    q1, h1 = hit_counters(engines)
    ttfts.sort()
    return {
        "ttft_p50": statistics.median(ttfts),
        "ttft_p90": percentile(ttfts, 90),
        "ttft_p99": percentile(ttfts, 99),
        "attained": sum(t <= slo_s for t in ttfts) / len(ttfts),
        "req_per_s": len(reqs) / (max(s[2] for s in spans) - t0),
        "hit_rate": (h1 - h0) / max(1.0, q1 - q0),
        "shared": shared_share(spans),
        "ttfts": [round(t, 4) for t in ttfts],  # to read the capacity at another SLO later
    }


CASES = ("a_round_robin", "a2_session_affinity", "b_kvcake")


def slo_sweep(plain: list[VllmEngine], conn: list[VllmEngine], proxy_url: str, n: int,
              rates: list[float], r: int, slo_s: float) -> dict[str, dict[str, Any]]:  # fmt: skip
    """One repeat: every rate, the three routers interleaved (their order rotated by repeat),
    the same arrival times for each, fresh seeded prompts for each run."""
    rr, affinity = routers(plain)
    route: dict[str, tuple[Route, list[VllmEngine]]] = {
        "a_round_robin": (rr, plain),
        "a2_session_affinity": (affinity, plain),
        "b_kvcake": (lambda i, s: proxy_url, conn),
    }
    out: dict[str, dict[str, Any]] = {case: {} for case in CASES}
    for k, rate in enumerate(rates):
        at = arrivals(n, rate, seed=1000 * r + k)
        order = CASES[r % 3 :] + CASES[: r % 3]
        for case in order:
            fn, engines = route[case]
            seed = 100_000 + 1000 * r + 10 * k + CASES.index(case)
            res = open_replay(fn, engines, workload(n, seed=seed), at, slo_s)
            out[case][f"{rate:g}"] = res
            print(f"# repeat {r} rate {rate:g}/s {case}: "
                  + ", ".join(f"{a}={b:.3f}" for a, b in res.items() if a != "ttfts"), flush=True)  # fmt: skip
    return out


def capacity(points: dict[str, dict[str, float]], target: float) -> tuple[float, str]:
    """The rate where the SLO attainment first falls below ``target``, linearly interpolated
    between the swept rates; ('>=', the highest rate) if it never does, ('<', the lowest) if it
    is already below at the lowest."""
    pts = sorted((float(rate), res["attained"]) for rate, res in points.items())
    if pts[0][1] < target:
        return pts[0][0], "<"
    for (r0, a0), (r1, a1) in itertools.pairwise(pts):
        if a1 < target:
            return r0 + (r1 - r0) * (a0 - target) / (a0 - a1), "="
    return pts[-1][0], ">="


def slo_table(runs: list[dict[str, dict[str, Any]]], slo_s: float, target: float) -> dict:
    """Print per rate the medians over repeats, then each router's capacity per repeat and the
    goal ratios; returns the capacities for the JSON record."""
    print(f"\n| rate (req/s) | case | TTFT p50 (s) | TTFT p90 (s) | attained (TTFT <= {slo_s:g} s) "
          "| served req/s | hit rate |\n|---:|---|---:|---:|---:|---:|---:|")  # fmt: skip
    for rate in runs[0][CASES[0]]:
        for case in CASES:
            cell = {k: statistics.median(r[case][rate][k] for r in runs) for k in
                    runs[0][case][rate] if k != "ttfts"}  # fmt: skip
            print(
                f"| {rate} | {case} | {cell['ttft_p50']:.3f} | {cell['ttft_p90']:.3f} | "
                f"{cell['attained']:.2f} | {cell['req_per_s']:.3f} | {cell['hit_rate']:.2f} |"
            )
    caps = {case: [capacity(r[case], target) for r in runs] for case in CASES}
    print(f"\ncapacity at >= {target:.0%} of requests within the SLO (req/s, per repeat):")
    for case, cs in caps.items():
        print(f"  {case}: " + ", ".join(f"{flag if flag != '=' else ''}{c:.3f}" for c, flag in cs))
    for base in CASES[:2]:
        ratios = [b[0] / a[0] for a, b in zip(caps[base], caps["b_kvcake"], strict=True)]
        print(f"  b / {base}: x" + ", ".join(f"{x:.2f}" for x in ratios))
    return {case: [{"req_per_s": c, "bound": f} for c, f in cs] for case, cs in caps.items()}
