"""Prefill -> decode through the Transfer Engine (issue 13): what the direct path costs the
prefill's forward pass, and what it saves the decode (real vLLM, CPU).

Two engines with the KvcakeConnector (``pd_transport = "te"``), one kvcake master (its
directory publishes the engines' KV segments) and a store-server (for the pool hand-off):
``p`` (prefill, core 0) and ``d`` (decode, core 1). Each repeat uses fresh seeded token
prompts of ``--tokens`` tokens, interleaved, and measures client-side latencies of
``max_tokens=1`` completions (= TTFT):

* ``p_plain``   — an ordinary prompt on p (no P/D): the baseline forward pass;
* ``p_te``      — a P/D prefill on p (``do_remote_decode``, direct: blocks kept for d);
* ``p_pool``    — the same with ``kvcake_transport: pool`` (blocks copied out and pooled);
* ``p_serving`` — an ordinary prompt on p while a reader in this process pulls a previous
  request's KV from p's registered tensors in a loop: the worst case for p's Transfer Engine
  server thread (registered tensors are vLLM's own memory; the server's wake-ups and copies
  are the whole cost);
* ``d_te`` / ``d_pool`` / ``d_cold`` — the decode's TTFT with the te params (a pull), with the
  pool params (a pool load) and with none (recompute); ``d_pull_s_mean`` is the te read
  itself (the connector's ``pd_pull_seconds``; the first pull from an engine also looks its
  30 segments up in the directory).

The TE server itself runs in every connector worker (it is the pool client's), so "TE on vs
off" is ``p_serving`` vs ``p_plain``; ``p_te`` vs ``p_pool`` is the hand-off's own cost.

Run: ``python benchmarks/vllm_pd_bench.py [--repeats 3] [--tokens 1024]``. Needs
``make install-vllm``. Prints JSON lines and a table of medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from kvcake.core.promtext import parse_metrics, total
from kvcake.fleet.procs import (
    VllmEngine,
    VllmEngineSpec,
    default_model_dir,
    spawn_kvcake,
    start_engine,
)
from kvcake.integrations.vllm.pd_wire import segment_name

PLANES = 30  # SmolLM2: one KV plane per layer on vLLM's CPU backend
PLANE_BLOCK_BYTES = 49_152  # one layer's block at block 32, fp32


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ask(engine: VllmEngine, prompt: list[int], params: dict[str, Any] | None = None
        ) -> tuple[float, dict[str, Any]]:  # fmt: skip
    body: dict[str, Any] = {"model": "smollm2", "prompt": prompt, "max_tokens": 1,
                            "temperature": 0}  # fmt: skip
    if params is not None:
        body["kv_transfer_params"] = params
    t0 = time.perf_counter()
    r = httpx.post(engine.url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0, dict(r.json().get("kv_transfer_params") or {})


def metrics(engine: VllmEngine, name: str) -> float:
    return total(parse_metrics(httpx.get(engine.url + "/metrics", timeout=10).text), name)


class Reader:
    """Pulls p's kept blocks (every plane) in a loop until stopped, like a busy decode."""

    def __init__(self, master: str, params: dict[str, Any]):
        from kvcake.store.client import Client
        from kvcake.transfer import Op, TransferRequest

        self.client = Client(master=master)
        te = self.client.engine
        ids = params["remote_block_ids"]
        self.buf = bytearray(len(ids) * PLANE_BLOCK_BYTES * PLANES)
        te.register_memory("pd-bench-reader", self.buf)
        self.reqs = [
            TransferRequest(
                Op.READ, "pd-bench-reader", (p * len(ids) + i) * PLANE_BLOCK_BYTES,
                segment_name(params["remote_engine_id"], 0, p), b * PLANE_BLOCK_BYTES,
                PLANE_BLOCK_BYTES,
            )
            for p in range(PLANES)
            for i, b in enumerate(ids)
        ]  # fmt: skip
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        te = self.client.engine
        while not self._stop.is_set():
            te.transfer(self.reqs).raise_for_errors()
            self.bytes += len(self.buf)

    def __enter__(self) -> Reader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self.client.close()


def one_repeat(p: VllmEngine, d: VllmEngine, master: str, n: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)

    def toks() -> list[int]:
        return rng.integers(100, 40000, n).tolist()

    out: dict[str, float] = {}
    out["p_plain"], _ = ask(p, toks())
    pt = toks()
    out["p_te"], te_params = ask(p, pt, {"do_remote_decode": True})
    pp = toks()
    out["p_pool"], pool_params = ask(p, pp, {"do_remote_decode": True, "kvcake_transport": "pool"})
    keep = toks()  # blocks p keeps for the reader (released at the lease's end)
    _, reader_params = ask(p, keep, {"do_remote_decode": True})
    with Reader(master, reader_params) as reader:
        t0 = time.perf_counter()
        out["p_serving"], _ = ask(p, toks())
        out["reader_MBps"] = reader.bytes / (time.perf_counter() - t0) / 1e6
    out["d_te"], _ = ask(d, pt, te_params)
    out["d_pool"], _ = ask(d, pp, pool_params)
    out["d_cold"], _ = ask(d, toks())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=1024, help="prompt length (block 32)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="kvcake-vllm-pd-bench-"))
    model = default_model_dir()
    master = spawn_kvcake("master", "--port", "0", "--http-port", "-1")
    addr = master.info["rpc"]
    store = spawn_kvcake("store-server", "--master", addr, "--segment-size", "1GiB")
    extra = {"pd_lease_s": 120.0}
    specs = [
        VllmEngineSpec("p", free_port(), model, master=addr, cpu="0", connector_extra=extra),
        VllmEngineSpec("d", free_port(), model, master=addr, cpu="1", connector_extra=extra),
    ]
    engines: list[VllmEngine] = []
    try:
        engines = [start_engine(s, logs) for s in specs]
        t0 = time.monotonic()
        for e in engines:
            e.wait_ready(900)
        print(f"# engines ready in {time.monotonic() - t0:.0f} s; logs in {logs}", flush=True)
        p, d = engines
        time.sleep(5)  # the connectors attach to the master (and register the KV segments)
        for e in engines:  # warm-up: the first request pays one-off costs
            ask(e, list(range(200, 264)))
        runs = []
        for r in range(args.repeats):
            res = one_repeat(p, d, addr, args.tokens, seed=2000 + r)
            runs.append(res)
            print(json.dumps({"repeat": r, **{k: round(v, 4) for k, v in res.items()}}),
                  flush=True)  # fmt: skip
        summary = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        pulls = metrics(d, "kvcake_connector_pd_pull_seconds_total")
        summary["d_pull_s_mean"] = pulls / args.repeats  # the te read itself, one per repeat
        summary["ratio_p_serving_over_plain"] = summary["p_serving"] / summary["p_plain"]
        summary["ratio_p_te_over_pool"] = summary["p_te"] / summary["p_pool"]
        summary["ratio_d_te_over_cold"] = summary["d_te"] / summary["d_cold"]
        summary["ratio_d_te_over_pool"] = summary["d_te"] / summary["d_pool"]
        print(json.dumps({"summary": {k: round(v, 4) for k, v in summary.items()}}), flush=True)
        for k, v in summary.items():
            unit = "" if k.startswith("ratio") else (" MB/s" if k.endswith("MBps") else " s")
            print(f"{k:28s} {v:10.3f}{unit}")
        if args.json:
            args.json.write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    finally:
        for e in engines:
            e.stop()
        store.stop()
        master.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
