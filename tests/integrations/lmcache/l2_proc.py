"""kvcake's native L2 plugin driven by LMCache's own ``NativeConnectorL2Adapter`` (the adapter
``lmcache server`` builds from ``{"type": "native_plugin", ...}``); run by the LMCache venv.

``python l2_proc.py MASTER`` prints one JSON line. The chunks are LMCache's view of a MemoryObj
(an object with ``byte_array``, all the adapter reads); keys are LMCache's ``ObjectKey``."""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import (
    NativePluginL2AdapterConfig,
    _create_native_plugin_l2_adapter,
)


class Chunk:
    def __init__(self, data: bytes | bytearray):
        self.byte_array = memoryview(bytearray(data))


def wait(query: Any, task: int) -> Any:
    deadline = time.monotonic() + 30
    while (got := query(task)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return got


def main() -> None:
    rng = random.Random(35)
    config = NativePluginL2AdapterConfig.from_dict({
        "module_path": "kvcake.integrations.lmcache.l2", "class_name": "KvcakeL2Client",
        "adapter_params": {"master": sys.argv[1]},
    })  # fmt: skip
    writer, reader = (
        _create_native_plugin_l2_adapter(config),
        _create_native_plugin_l2_adapter(config),
    )
    keys = [ObjectKey(chunk_hash=rng.randbytes(16), model_name="smol", kv_rank=0) for _ in range(3)]
    data = [rng.randbytes(4096) for _ in keys[:2]]  # the third key is never stored
    task = writer.submit_store_task(keys[:2], [Chunk(d) for d in data])
    stored = wait(lambda t: writer.pop_completed_store_tasks().get(t), task)
    found = wait(reader.query_lookup_and_lock_result, reader.submit_lookup_and_lock_task(keys, {}))
    outs = [Chunk(bytes(4096)), Chunk(bytes(4096)), Chunk(bytes(4096))]
    loaded = wait(reader.query_load_result, reader.submit_load_task(keys, outs))
    short = Chunk(bytes(1000))  # a buffer that does not fit the stored chunk
    misfit = wait(reader.query_load_result, reader.submit_load_task(keys[:1], [short]))
    print(json.dumps({
        "stored": bool(stored and stored.is_successful()),
        "found": [found.test(i) for i in range(3)],
        "loaded": [loaded.test(i) for i in range(3)],
        "equal": [bytes(o.byte_array) == d for o, d in zip(outs[:2], data, strict=True)],
        "misfit_loaded": misfit.test(0), "misfit_untouched": bytes(short.byte_array) == bytes(1000),
        "errors": reader._client.errors,
    }), flush=True)  # fmt: skip
    writer.close()
    reader.close()


if __name__ == "__main__":
    from proc_exit import run  # this script's folder (it runs by path)

    run(main)
