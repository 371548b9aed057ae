"""Real vLLM (CPU) engines with the kvcake connector, shared by the whole session.

Two engines start *before* the kvcake master exists (so start-up without the pool is exercised
once, for free), serve a request each, then a master and a store-server start on the reserved
port and the connectors attach (``connect_retry_s`` = 2 s). Engine A reads the pool over shared
memory, engine B over TCP (so a stopped store-server really stalls B's loads). Logs stay in
/tmp/kvcake-vllm-tests-*.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvcake.core.ports import free_port
from kvcake.core.promtext import parse_metrics, total
from kvcake.fleet.procs import VllmEngine, VllmEngineSpec, default_model_dir, start_engine
from tests.store.procs import Proc, spawn

EXTRA = {"connect_retry_s": 2.0, "backoff_s": 1.0, "load_timeout_s": 3.0}


def complete(engine: VllmEngine, prompt: list[int], max_tokens: int = 12) -> list[int]:
    body = {
        "model": "smollm2",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
    }
    r = httpx.post(engine.url + "/v1/completions", json=body, timeout=180)
    r.raise_for_status()
    return list(r.json()["choices"][0]["token_ids"])


def metric(engine: VllmEngine, name: str) -> float:
    """Sum of a Prometheus series on the engine's /metrics (all label sets)."""
    return total(parse_metrics(httpx.get(engine.url + "/metrics", timeout=10).text), name)


def wait_log(engine: VllmEngine, needle: str, count: int = 1, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine.log_text().count(needle) >= count:
            return True
        time.sleep(0.5)
    return False


@dataclass
class Cluster:
    a: VllmEngine
    b: VllmEngine
    master: Proc
    store: Proc
    master_addr: str
    before_pool: dict[str, Any] = field(default_factory=dict)

    def start_store(self) -> None:
        self.store = spawn(
            "store-server", "--master", self.master_addr, "--segment-size", "512MiB",
            ready="store-server",
        )  # fmt: skip


# Package scope: torn down before tests/integrations/vllm_up starts its own engines.
@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    # Kept after the run (pytest's tmp dirs rotate away): the engines' logs explain failures.
    logs = Path(tempfile.mkdtemp(prefix="kvcake-vllm-tests-"))
    mport = free_port()
    addr = f"127.0.0.1:{mport}"
    model = default_model_dir()
    a = start_engine(
        VllmEngineSpec(
            "a",
            free_port(),
            model,
            master=addr,
            connector_extra=EXTRA,
            cpu="0",
            kv_events_port=free_port(),
        ),
        logs,
    )
    b = start_engine(
        VllmEngineSpec(
            "b", free_port(), model, master=addr, cpu="1", kv_events_port=free_port(),
            # TCP: a stopped store-server stalls B's reads; a deadline below the transfer
            # engine's own 2 s timeout makes the connector's deadline fire first. B loads
            # layer-wise (A whole, the default), so both load paths run inside vLLM.
            connector_extra={**EXTRA, "protocol": "tcp", "load_timeout_s": 1.0,
                             "load_layer_groups": 3},
        ),
        logs,
    )  # fmt: skip
    procs: list[Proc] = []
    try:
        a.wait_ready(900)  # ~50 s on an idle 2-core machine, minutes when it is shared
        b.wait_ready(900)
        # Master down at start-up: both engines must serve.
        probe = [5, 6, 7, 8] * 20
        before = {"a": complete(a, probe), "b": complete(b, probe), "probe": probe}
        before["logs"] = {"a": a.log_text(), "b": b.log_text()}
        master = spawn(
            "master", "--port", str(mport), "--http-port", "-1", "--client-ttl-s", "30",
            ready="master",
        )  # fmt: skip
        procs.append(master)
        store = spawn(
            "store-server", "--master", addr, "--segment-size", "512MiB", ready="store-server"
        )
        procs.append(store)
        for e in (a, b):  # scheduler and worker side each attach
            assert wait_log(e, "connected to master", 2, 60), e.log_text()[-3000:]
        c = Cluster(a, b, master, store, addr, before)
        yield c
        procs.append(c.store)
    finally:
        a.stop()
        b.stop()
        for p in reversed(procs):
            p.stop()
