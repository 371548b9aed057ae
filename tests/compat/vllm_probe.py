"""vLLM's own Mooncake store set-up and the store calls its MooncakeStoreWorker makes, over
whatever ``mooncake`` is importable (the kvcake shim in the test). Prints one JSON line.

    PYTHONPATH=SHIM_DIR python tests/compat/vllm_probe.py MOONCAKE_CONFIG.json
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    import torch
    from mooncake.store import MooncakeDistributedStore
    from vllm.distributed.mooncake_store import MooncakeStoreConfig, setup_mooncake_store

    os.environ["MOONCAKE_CONFIG_PATH"] = sys.argv[1]
    cfg = MooncakeStoreConfig.load_from_config()  # vLLM's parser of the JSON config
    store = MooncakeDistributedStore()
    setup_mooncake_store(store, cfg, "127.0.0.1")  # raises unless setup() returned 0
    out: dict[str, object] = {
        "shim": bool(getattr(sys.modules["mooncake.store"], "__kvcake__", False))
    }

    # The worker's pattern: one registered KV region, blocks put/get as multi-buffer objects
    # (K and V pages of a block = two buffers), existence checked first.
    kv = torch.arange(2 * 8 * 256, dtype=torch.float32).reshape(2, 8, 256)  # [K|V, blocks, elems]
    base, nbytes = kv.data_ptr(), kv.numel() * kv.element_size()
    out["register"] = store.register_buffer(base, nbytes)
    page = 256 * 4
    keys = [f"vllm@blk{b}" for b in range(4)]
    ptrs = [[base + b * page, base + (8 + b) * page] for b in range(4)]
    sizes = [[page, page] for _ in range(4)]
    out["exist_before"] = store.batch_is_exist(keys)
    out["put"] = store.batch_put_from_multi_buffers(keys, ptrs, sizes)
    out["exist_after"] = store.batch_is_exist(keys)
    dst = torch.zeros_like(kv)
    dbase = dst.data_ptr()
    out["register_dst"] = store.register_buffer(dbase, nbytes)
    dptrs = [[dbase + b * page, dbase + (8 + b) * page] for b in range(4)]
    out["get"] = store.batch_get_into_multi_buffers(keys, dptrs, sizes)
    out["equal"] = bool(torch.equal(dst[:, :4], kv[:, :4]))
    # Where vLLM's CPU path stops: the store worker's save path and the P/D worker's init.
    for name, call in (
        ("cuda_event", lambda: torch.cuda.Event()),
        ("accelerator_index", lambda: torch.accelerator.current_device_index()),
    ):
        try:
            call()
            out[name] = "ok"
        except RuntimeError as exc:
            out[name] = f"RuntimeError: {exc}"
    out["close"] = store.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
