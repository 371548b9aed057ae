"""vLLM on kvcake (issue 13): what the KvcakeConnector buys a fleet of real vLLM engines (CPU).

Four engines, started once: ``plain0`` and ``plain1`` (vLLM alone, its own prefix cache),
``a`` and ``b`` (both with the connector, one kvcake master + store-server); ``plain0`` and
``a`` pinned to core 0, ``plain1`` and ``b`` to core 1. Each repeat uses fresh seeded
token prompts, interleaved, and measures the client-side latency of a ``max_tokens=1``
completion (= TTFT: prefill plus one sampled token) for

* ``cold``    — a 2,048-token prompt nobody has seen (engine b; b saves it into the pool);
* ``pooled``  — 1,792 tokens prefilled by engine a, then the same 1,792 + 256 new tokens on b:
  b loads the 1,792 from the pool (goal: >= 5x lower than cold);
* ``local``   — b again with the same 1,792 + another 256: vLLM's own local prefix hit
  (goal: pooled within 1.25x of local);
* ``miss_plain`` / ``miss_conn`` — a fresh 2,048-token prompt on plain vLLM (``plain1``) vs on
  b, ABAB, both pinned to core 1 (until the eleventh session ``plain`` ran on core 0, so the
  two cores' difference was in the ratio): the connector's overhead on a pool miss (lookup +
  synchronous copy-out of the blocks it saves; goal <= 5% of TTFT).

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
from vllm_fleet import BS, fleet_repeat, fleet_table, slo_sweep, slo_table

from kvcake.fleet.procs import (
    VllmEngine,
    VllmEngineSpec,
    default_model_dir,
    spawn_kvcake,
    start_engine,
)
from kvcake.integrations.vllm.keys import BlockNamer


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

    keys = BlockNamer(model_key, "float32", BS).objects(prompt)
    with Client(master=master) as c:
        deadline = time.monotonic() + timeout_s
        while not all(c.batch_is_exist(keys)):
            if time.monotonic() > deadline:
                raise RuntimeError("blocks never reached the pool")
            time.sleep(0.1)


def start_proxy(master: str, engines: list[VllmEngine]) -> tuple[Any, str]:
    import subprocess
    import sys

    argv = [sys.executable, "-m", "kvcake", "vllm-proxy", "--master", master]
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

    def on_b(prompt: list[int]) -> float:
        """b's latency; then wait until b's background save of the prompt has ended, so the
        next timed request (maybe on plain1, the same core) does not run next to it."""
        t = latency(eng["b"], prompt)
        wait_pooled(master, model_key, prompt[:-1])
        return t

    out["cold"] = on_b(toks(2048))
    # ABAB: connector miss vs plain vLLM, both on core 1
    out["miss_plain"] = latency(eng["plain1"], toks(2048))
    miss_conn = on_b(toks(2048))
    out["miss_plain"] = (out["miss_plain"] + latency(eng["plain1"], toks(2048))) / 2
    out["miss_conn"] = (miss_conn + on_b(toks(2048))) / 2
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--part", choices=("reuse", "fleet", "slo", "all"), default="all",
                    help="reuse: the 2,048-token cells; fleet: the closed-loop replay; slo: the "
                    "open-loop replay at --rates (throughput at the TTFT SLO); all: every part")  # fmt: skip
    ap.add_argument("--requests", type=int, default=24, help="fleet/slo: requests per case")
    ap.add_argument("--rates", default="0.5,0.8,1.1,1.4",
                    help="slo: arrival rates to sweep, requests/s (comma-separated)")  # fmt: skip
    ap.add_argument("--slo-s", type=float, default=8.0, help="slo: the TTFT SLO, seconds")
    ap.add_argument("--attain", type=float, default=0.9,
                    help="slo: the share of requests that must meet the SLO")  # fmt: skip
    ap.add_argument("--first-repeat", type=int, default=0,
                    help="slo: number the repeats from here (each repeat's arrivals and prompts "
                    "are seeded by its number: a second run with a new number is independent)")  # fmt: skip
    ap.add_argument("--connector-extra", type=json.loads, default={},
                    help='more kv_connector_extra_config for engines a and b, as JSON '
                    '(e.g. \'{"load_layer_groups": 1}\')')  # fmt: skip
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    extra = dict(args.connector_extra)
    logs = Path(tempfile.mkdtemp(prefix="kvcake-vllm-bench-"))
    model = default_model_dir()
    model_key = f"{Path(model).name}@vllm"
    master = spawn_kvcake("master", "--port", "0", "--http-port", "-1")
    store = spawn_kvcake("store-server", "--master", master.info["rpc"], "--segment-size", "2GiB")
    addr = master.info["rpc"]
    specs = {
        "plain0": VllmEngineSpec("plain0", free_port(), model, cpu="0"),
        "plain1": VllmEngineSpec("plain1", free_port(), model, cpu="1"),
        "a": VllmEngineSpec("a", free_port(), model, master=addr, cpu="0",
                            kv_events_port=free_port(), connector_extra=extra),
        "b": VllmEngineSpec("b", free_port(), model, master=addr, cpu="1",
                            kv_events_port=free_port(), connector_extra=extra),
    }  # fmt: skip
    fleet = args.part in ("fleet", "slo", "all")
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
        if fleet:
            plain = [eng["plain0"], eng["plain1"]]
            proxy, purl = start_proxy(addr, [eng["a"], eng["b"]])
            try:
                doc.update(run_fleet(args, plain, [eng["a"], eng["b"]], purl))
            finally:
                proxy.terminate()
                proxy.wait(10)
        if args.json:
            args.json.write_text(json.dumps(doc, indent=1))
    finally:
        for e in eng.values():
            e.stop()
        store.stop()
        master.stop()
    return 0


def run_fleet(args: argparse.Namespace, plain: list[VllmEngine], conn: list[VllmEngine],
              purl: str) -> dict[str, Any]:  # fmt: skip
    doc: dict[str, Any] = {}
    if args.part in ("fleet", "all"):
        runs = []
        for r in range(args.repeats):
            res = fleet_repeat(plain, conn, purl, args.requests, r)
            runs.append(res)
            print(json.dumps({"fleet_repeat": r, **res}), flush=True)
        fleet_table(runs)
        doc["fleet"] = runs
    if args.part in ("slo", "all"):
        rates = [float(x) for x in args.rates.split(",")]
        first = args.first_repeat
        sweeps = [slo_sweep(plain, conn, purl, args.requests, rates, r, args.slo_s)
                  for r in range(first, first + args.repeats)]  # fmt: skip
        caps = slo_table(sweeps, args.slo_s, args.attain)
        doc["slo"] = {"slo_s": args.slo_s, "attain": args.attain, "runs": sweeps,
                      "capacity": caps}  # fmt: skip
    return doc


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


if __name__ == "__main__":
    raise SystemExit(main())
