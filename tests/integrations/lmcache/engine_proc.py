"""LMCache engines (CPU) whose remote storage is kvcake; run by the LMCache venv's Python.

``python engine_proc.py MASTER store|load`` prints one JSON line (see ``main``). The stand-in
for LMCache's GPU connector copies between LMCache's chunks and a CPU tensor laid out like them
([2, layers, tokens, hidden]); nothing else of LMCache is replaced. Run with PYTHONHASHSEED set:
LMCache's chunk hashes use Python's ``hash`` here (vLLM's hasher is not loaded)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any

import torch
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata

CHUNK, TOKENS, HEADS, HEAD_SIZE, LAYERS = 16, 72, 2, 8, 3  # 4 full chunks and a partial one
HIDDEN = HEADS * HEAD_SIZE


class CpuConnector(GPUConnectorInterface):
    def __init__(self, layers: int):
        self.layers = layers

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.layers, num_tokens, HIDDEN])

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kw: Any) -> None:
        memory_obj.tensor.copy_(kw["kv"][:, :, start:end])

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kw: Any) -> None:
        kw["kv"][:, :, start:end].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kw: Any) -> None:
        for obj, s, e in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, s, e, **kw)

    def batched_to_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kw: Any) -> None:
        for obj, s, e in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(obj, s, e, **kw)


def plugin_config(master: str) -> tuple[str, dict[str, str]]:
    """kvcake's own plugin, or (BACKEND=mooncakestore) LMCache's Mooncake connector, which
    then imports kvcake's Mooncake shim (on PYTHONPATH) and stores through the same pool."""
    if os.environ.get("BACKEND") == "mooncakestore":
        return "mooncakestore", {
            "mooncake_master_server_address": master, "mooncake_metadata_server": "P2PHANDSHAKE",
            "mooncake_local_hostname": "127.0.0.1", "mooncake_global_segment_size": "0",
            "mooncake_local_buffer_size": str(16 << 20), "mooncake_protocol": "tcp",
        }  # fmt: skip
    return "kvcake", {
        "remote_storage_plugin.kvcake.module_path": "kvcake.integrations.lmcache.connector",
        "remote_storage_plugin.kvcake.class_name": "KvcakeConnectorAdapter",
        "remote_storage_plugin.kvcake.master": master,
    }


def engine(master: str, name: str, layers: int) -> Any:
    plugin, extra = plugin_config(master)
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05, save_unfull_chunk=True,
        remote_storage_plugins=[plugin], lmcache_instance_id=name, extra_config=extra,
    )  # fmt: skip
    meta = LMCacheMetadata(model_name="smol", world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=torch.bfloat16,
                           kv_shape=(layers, 2, CHUNK, HEADS, HEAD_SIZE), chunk_size=CHUNK)  # fmt: skip
    eng = LMCacheEngineBuilder.get_or_create(
        name, config, meta, CpuConnector(layers), lambda t, r: None, lambda o, r: o
    )
    eng.post_init()  # creates the storage backends (vLLM's integration calls it too)
    return eng


def connector(eng: Any) -> Any:
    backend = next(b for n, b in eng.storage_manager.storage_backends.items() if "Remote" in n)
    conn = backend.connection
    while not hasattr(conn, "exists_sync") or type(conn).__name__.startswith("Instrumented"):
        conn = conn._connector  # LMCache wraps connectors (instrumentation)
    return conn


def bad_calls(eng: Any, conn: Any, tokens: torch.Tensor, layers: int) -> dict[str, Any]:
    """A chunk stored with another dtype is a counted miss; a put whose bytes disagree with
    its shapes raises and stores nothing."""
    from lmcache.v1.memory_management import MemoryFormat

    from kvcake.integrations.lmcache import layout as L

    foreign, unwritten = [r[2] for r in eng.token_database.process_tokens(tokens + 1)][:2]
    shape = (2, layers, CHUNK, HIDDEN)
    blob = L.encode(L.Layout("KV_2LTD", (L.Group("torch.float16", 2, shape),)))
    conn.client.put(conn.pool_key(foreign), blob + bytes(2 * 2 * layers * CHUNK * HIDDEN))
    miss = conn.get_sync(foreign) is None

    class Torn:  # a MemoryObj whose buffer is shorter than its shape says
        byte_array = memoryview(bytearray(100))
        get_shapes = staticmethod(lambda: [torch.Size(shape)])
        get_dtypes = staticmethod(lambda: [torch.bfloat16])
        get_memory_format = staticmethod(lambda: MemoryFormat.KV_2LTD)

    try:
        conn.put_sync(unwritten, Torn())
        raised = ""
    except L.BadChunk as e:
        raised = str(e)
    return {
        "foreign_miss": miss,
        "bad_put_error": raised,
        "bad_put_stored": conn.exists_sync(unwritten),
    }


def store(master: str, tokens: torch.Tensor, kv: torch.Tensor) -> dict[str, Any]:
    eng = engine(master, "writer", kv.shape[1])
    conn = connector(eng)
    eng.store(tokens, kv=kv)
    keys = [r[2] for r in eng.token_database.process_tokens(tokens)]
    deadline = time.monotonic() + 60  # LMCache puts to remote storage in the background
    while not all(conn.exists_sync(k) for k in keys) and time.monotonic() < deadline:
        time.sleep(0.05)
    stored = all(conn.exists_sync(k) for k in keys)
    LMCacheEngineBuilder.destroy("writer")
    errors = getattr(conn, "errors", {})
    return {"chunks": len(keys), "stored": stored, "digest": digest(kv), "errors": errors}


def load(master: str, name: str, tokens: torch.Tensor, layers: int) -> dict[str, Any]:
    eng = engine(master, name, layers)
    out = torch.zeros(2, layers, TOKENS, HIDDEN, dtype=torch.bfloat16)
    got = int(eng.retrieve(tokens, kv=out).sum())
    result = {
        "tokens": got,
        "digest": digest(out),
        "errors": dict(getattr(connector(eng), "errors", {})),
    }
    if name == "reader" and plugin_config(master)[0] == "kvcake":
        result.update(bad_calls(eng, connector(eng), tokens, layers))
    LMCacheEngineBuilder.destroy(name)
    return result


def digest(kv: torch.Tensor) -> str:
    return hashlib.sha256(kv.view(torch.int16).numpy().tobytes()).hexdigest()


def main() -> None:
    """``store``: engine "writer" stores; ``load``: engine "reader" (same layout) and engine
    "other" (one more layer: same keys, another shape) retrieve, then the bad calls."""
    master, mode = sys.argv[1], sys.argv[2]
    torch.manual_seed(35)
    tokens = torch.randint(0, 30000, (TOKENS,))
    kv = torch.randn(2, LAYERS, TOKENS, HIDDEN).to(torch.bfloat16)
    if mode == "store":
        result = store(master, tokens, kv)
    else:
        result = {"reader": load(master, "reader", tokens, LAYERS)}
        if plugin_config(master)[0] == "kvcake":
            result["other"] = load(master, "other", tokens, LAYERS + 1)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    from proc_exit import run  # this script's folder (it runs by path)

    run(main)
