"""One SGLang HiCache worker, run by the SGLang venv's Python (tests/integrations/sglang).

SGLang's real classes on CPU: ``MHATokenToKVPool(device="cpu")``, ``MHATokenToKVPoolHost
(pin_memory=False, layout=...)`` and a storage backend made by SGLang's ``StorageBackendFactory``
(kvcake's through ``dynamic``, or SGLang's own ``mooncake`` over kvcake's Mooncake shim).
``write``: fills PAGES host pages with seeded data, ``batch_set_v1``, prints ``written``, waits
for a line on stdin (a Mooncake client's pages live in its own segment), closes. ``read``:
``batch_exists`` and ``batch_get_v1`` into a zeroed pool, compares with the same seeded data.
``misuse``: wrong sizes and unknown layouts get errors, never None or pool writes.
Prints one JSON line ``RESULT {...}``.

SGLang imports ``torchvision`` (PyPI's build is CUDA-only) and ``sgl_kernel`` (no CPU build)
at module level through model configs; neither is called by these classes, so they are
replaced by inert modules, after transformers has recorded that torchvision is absent."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import types

PAGE, PAGES, LAYERS, HEADS, DIM = 4, 4, 2, 2, 8


class _Inert(types.ModuleType):
    def __getattr__(self, name: str) -> _Inert:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert(f"{self.__name__}.{name}")

    def __call__(self, *a: object, **k: object) -> None:
        raise RuntimeError(f"{self.__name__} is a stand-in (not on CPU)")


class _InertFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        mod = _Inert(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        pass


def _install_stand_ins() -> None:
    import importlib.util

    import transformers.utils.import_utils  # noqa: F401  (records torchvision as absent)

    absent = tuple(r for r in ("torchvision", "sgl_kernel") if importlib.util.find_spec(r) is None)
    if absent:
        sys.meta_path.insert(0, _InertFinder(absent))


def pools(layout: str, mla: bool = False):  # type: ignore[no-untyped-def]
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    if mla:  # keys only: a latent of 16 + a rope part of 8 per token and layer
        kv = MLATokenToKVPool(64, PAGE, torch.float32, 16, 8, LAYERS, "cpu", False)
        host = MLATokenToKVPoolHost(
            kv.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, layout, pin_memory=False,
            device_capacity_tokens=kv.size, start_layer=kv.start_layer,
            end_layer=kv.end_layer, target_layer_num=LAYERS,
        )  # fmt: skip
        return kv, host
    kv = MHATokenToKVPool(64, PAGE, torch.float32, HEADS, DIM, LAYERS, "cpu", False)
    host = MHATokenToKVPoolHost(
        kv.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, layout, pin_memory=False,
        device_capacity_tokens=kv.size, start_layer=kv.start_layer, end_layer=kv.end_layer,
    )  # fmt: skip
    return kv, host


def backend(kind: str, master: str, host, rank: int = 0, mla: bool = False):  # type: ignore[no-untyped-def]
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    extra = {"backend_name": "kvcake", "module_path": "kvcake.integrations.sglang.backend",
             "class_name": "KvcakeHiCacheStorage", "interface_v1": 1, "master": master}  # fmt: skip
    cfg = HiCacheStorageConfig(
        tp_rank=rank, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=host.layout.startswith("page_first"), model_name="org/smol",
        extra_config=extra if kind == "kvcake" else None,
    )  # fmt: skip
    name = "dynamic" if kind == "kvcake" else "mooncake"
    store = StorageBackendFactory.create_backend(name, cfg, host)
    store.register_mem_pool_host(host)
    return store


def page_data(host, seed: int):  # type: ignore[no-untyped-def]
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.rand(host.kv_buffer.shape, generator=gen, dtype=torch.float32)


def slots(start_page: int):  # type: ignore[no-untyped-def]
    import torch

    return torch.arange(start_page * PAGE, (start_page + PAGES) * PAGE, dtype=torch.int64)


def keys(seed: int) -> list[str]:
    import hashlib

    return [hashlib.sha256(f"{seed}-{i}".encode()).hexdigest() for i in range(PAGES)]


def page_bytes(host, idx) -> list[bytes]:  # type: ignore[no-untyped-def]
    ptrs, sizes = host.get_page_buffer_meta(idx)
    import ctypes

    per = len(ptrs) // PAGES
    return [b"".join(ctypes.string_at(p, s) for p, s in
                     zip(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per], strict=True))
            for i in range(PAGES)]  # fmt: skip


def write(kind: str, master: str, layout: str, seed: int, keep: list) -> dict:
    mla = kind.endswith("-mla")  # MLA: TP rank 0 writes the page every rank shares
    _, host = pools(layout, mla)
    host.kv_buffer.copy_(page_data(host, seed))
    store = backend(kind.removesuffix("-mla"), master, host, 0, mla)
    idx = slots(1)
    ok = store.batch_set_v1(keys(seed), idx)
    keep.append((kind, store, host))  # stays up until the reader is done
    return {"set": ok}


def read(kind: str, master: str, layout: str, seed: int) -> dict:
    mla = kind.endswith("-mla")  # MLA: TP rank 1 reads what rank 0 wrote
    _, host = pools(layout, mla)
    host.kv_buffer.zero_()
    store = backend(kind.removesuffix("-mla"), master, host, int(mla), mla)
    idx = slots(3)  # other host slots than the writer's
    found = store.batch_exists(keys(seed) + keys(seed + 1))
    got = store.batch_get_v1(keys(seed), idx)
    missing = store.batch_get_v1(keys(seed + 1), idx)
    _, ref = pools(layout, mla)
    ref.kv_buffer.copy_(page_data(ref, seed))
    equal = page_bytes(host, idx) == page_bytes(ref, slots(1))
    return {"exists": found, "get": got, "get_missing": missing, "equal": equal,
            "nonzero": bool(host.kv_buffer.abs().sum() > 0)}  # fmt: skip


def misuse(master: str, seed: int) -> dict:
    """Bad calls: lists of False (never None), errors at registration, no byte written."""
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    from kvcake.integrations.sglang.backend import KvcakeHiCacheStorage
    from kvcake.integrations.sglang.keys import PageLayoutError

    _, host = pools("page_first")
    store = backend("kvcake", master, host)
    host.kv_buffer.zero_()
    idx = slots(0)
    out: dict = {
        "set_short": store.batch_set_v1(keys(seed), idx[:-1]),
        "get_short": store.batch_get_v1(keys(seed), idx[:-1]),
        "get_out_of_pool": store.batch_get_v1(keys(seed), idx + 10_000),
        "untouched": bool(host.kv_buffer.abs().sum() == 0),
    }
    refused = []
    _, other = pools("page_first")
    other.layout = "head_first_unknown"
    mla = HiCacheStorageConfig(
        0, 1, 0, 1, 0, 1, True, False, True, "m", extra_config={"master": master}
    )
    for attempt in (lambda: store.register_mem_pool_host(other),
                    lambda: KvcakeHiCacheStorage(mla).register_mem_pool_host(host)):  # fmt: skip
        try:
            attempt()
            refused.append("accepted")
        except PageLayoutError as exc:
            refused.append(str(exc))
    out["refused"] = refused
    # v0: a page as a tensor, read back into a tensor of its size; a wrong-size target is None
    page = torch.arange(32, dtype=torch.float32)
    out["v0_set"] = store.set(f"v0{seed}", page)
    back = torch.zeros(32, dtype=torch.float32)
    out["v0_get"] = store.get(f"v0{seed}", back) is not None and bool(torch.equal(back, page))
    out["v0_wrong_size"] = store.get(f"v0{seed}", torch.zeros(31, dtype=torch.float32))
    out["v0_exists"] = [store.exists(f"v0{seed}"), store.exists(f"nope{seed}")]
    # a reader with another layout never sees page_first pages
    _, lf = pools("layer_first")
    out["layer_first_sees"] = backend("kvcake", master, lf).batch_exists(keys(seed))
    store.close()
    return out


def main() -> None:
    """``ROLE KIND MASTER SEED CASES``: CASES is a comma list of host layouts (``+mla`` for an
    MLA pool) and ``misuse``, run in this one process (SGLang's import costs ~10 s of CPU)."""
    role, kind, master, seed, cases = sys.argv[1:6]
    _install_stand_ins()
    res, keep = {}, []
    for i, case in enumerate(cases.split(",")):
        layout, _, flag = case.partition("+")
        name = kind + ("-mla" if flag == "mla" else "")
        if case == "misuse":
            res[case] = misuse(master, int(seed) + i)
        elif role == "write":
            res[case] = write(name, master, layout, int(seed) + i, keep)
        else:
            res[case] = read(name, master, layout, int(seed) + i)
    if role == "write":
        print("written", flush=True)
        sys.stdin.readline()  # the reader is done: a Mooncake client's pages live in its segment
        for k, store, _ in keep:
            if k.startswith("kvcake"):
                store.close()
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
