"""kvcake as SGLang's HiCache L3 storage: a ``HiCacheStorage`` loaded by SGLang's factory.

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name": "kvcake", "module_path": "kvcake.integrations.sglang.backend",
      "class_name": "KvcakeHiCacheStorage", "interface_v1": 1, "master": "127.0.0.1:50051"}'

Pages go through kvcake's store client (integrity checksums on every put and read). The
zero-copy calls (``batch_get_v1`` / ``batch_set_v1``) read straight into the registered host
pool; a page spread over several runs is copied once on a put. They always return one bool per
key (``[False] * n`` on any failure, logged): SGLang's prefetch and backup threads die on
``None`` or an exception. Keys: :mod:`kvcake.integrations.sglang.keys`."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from kvcake.integrations.sglang.keys import PageLayoutError, PageNamer
from kvcake.integrations.sglang.pages import HostPages
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig
from kvcake.store.errors import ObjectAlreadyExists, ObjectNotFound

log = logging.getLogger(__name__)


def _refuse_unsupported(cfg: HiCacheStorageConfig) -> None:
    """Shardings whose page bytes are split differently than by TP/PP rank: refused, since a
    key that does not name the shard would hand one shard's bytes to another."""
    if cfg.attn_cp_size > 1 or cfg.dcp_size > 1 or cfg.should_split_heads:
        raise PageLayoutError(
            "kvcake HiCache backend: attention context parallelism, DCP and split heads "
            f"(attn_cp_size={cfg.attn_cp_size}, dcp_size={cfg.dcp_size}, "
            f"should_split_heads={cfg.should_split_heads}) are not supported"
        )


class KvcakeHiCacheStorage(HiCacheStorage):
    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        _refuse_unsupported(storage_config)
        extra = dict(storage_config.extra_config or {})
        master = extra.get("master") or os.environ.get("KVCAKE_MASTER")
        if not master:
            raise PageLayoutError(
                'kvcake HiCache backend: set "master" (host:port) in '
                "--hicache-storage-backend-extra-config or KVCAKE_MASTER"
            )
        self.namer = PageNamer(
            model=PageNamer.model_part(storage_config.model_name),
            tp_rank=storage_config.tp_rank,
            tp_size=storage_config.tp_size,
            pp_rank=storage_config.pp_rank,
            pp_size=storage_config.pp_size,
            is_mla=storage_config.is_mla_model,
        )
        self.writer = bool(storage_config.is_storage_writer)
        self.pages: HostPages | None = None
        self.client = Client(
            ClientConfig(master=str(master), protocol=str(extra.get("protocol", "auto")))
        )

    # --- registration ------------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Fixes the page format; refuses a pool whose pages it cannot name exactly."""
        pages = HostPages(mem_pool_host)
        is_mla_pool = "MLA" in type(mem_pool_host).__name__
        if is_mla_pool != self.namer.is_mla:
            raise PageLayoutError(
                f"{type(mem_pool_host).__name__} with is_mla_model={self.namer.is_mla}: "
                "MLA pages are shared by all TP ranks, MHA pages are not"
            )
        if not is_mla_pool and pages.runs_per_page % 2:
            raise PageLayoutError(f"an MHA page of {pages.runs_per_page} runs (K and V expected)")
        fmt = PageNamer.format_part(pages.dtype, pages.layout, pages.page_size, pages.page_bytes)
        self.namer = replace(self.namer, fmt=fmt)
        self.pages = pages
        self.mem_pool_host = mem_pool_host
        log.info("kvcake HiCache backend: pages %s, keys like %s", fmt, self.namer.key("HASH"))

    def _pool(self) -> HostPages:
        if self.pages is None:
            raise PageLayoutError("no host pool registered (register_mem_pool_host)")
        return self.pages

    # --- zero copy (interface v1) -------------------------------------------------------------
    def batch_set_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        n = len(keys)
        try:
            pages = self._pool()
            runs = pages.checked_runs(host_indices, n)
            if not self.writer or n == 0:  # an MLA replica: another rank writes the shared page
                return [True] * n
            names = self.namer.keys(keys)
            results = self.client.batch_put(names, [pages.value(r) for r in runs])
            return [r is None or isinstance(r, ObjectAlreadyExists) for r in results]
        except Exception as exc:
            log.error("kvcake HiCache batch_set_v1 of %d pages failed: %s", n, exc)
            return [False] * n

    def batch_get_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        n = len(keys)
        try:
            pages = self._pool()
            runs = pages.checked_runs(host_indices, n)
            if n == 0:
                return []
            got = self.client.batch_get_into_ranges(
                self.namer.keys(keys), [pages.scatter(r) for r in runs]
            )
            bad = [g for g in got if not isinstance(g, int) and not isinstance(g, ObjectNotFound)]
            if bad:
                log.warning("kvcake HiCache batch_get_v1: %d of %d failed: %s", len(bad), n, bad[0])
            return [g == pages.page_bytes for g in got]
        except Exception as exc:
            log.error("kvcake HiCache batch_get_v1 of %d pages failed: %s", n, exc)
            return [False] * n

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading pages are in the pool."""
        if not keys:
            return 0
        try:
            found = self.client.batch_is_exist(self.namer.keys(keys))
        except Exception as exc:
            log.error("kvcake HiCache batch_exists failed: %s", exc)
            return 0
        return found.index(False) if False in found else len(found)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # --- copying calls (interface v0) ---------------------------------------------------------
    def _target(self, location: Any, size: Any) -> np.ndarray:
        """A writable byte view of a v0 target: a CPU tensor, or a pointer + size that must
        lie inside the registered host pool."""
        if isinstance(location, torch.Tensor):
            if location.device.type != "cpu" or not location.is_contiguous():
                raise PageLayoutError("a v0 target must be a contiguous CPU tensor")
            view: np.ndarray = location.reshape(-1).view(torch.uint8).numpy()
            if size is not None and int(size) != view.nbytes:
                raise PageLayoutError(f"target of {view.nbytes} bytes, target_sizes={size}")
            return view
        pages = self._pool()
        off, n = int(location) - pages.base, int(size)
        if off < 0 or n <= 0 or off + n > pages.bytes.nbytes:
            raise PageLayoutError(f"buffer {int(location):#x}+{n} lies outside the host pool")
        return pages.bytes[off : off + n]

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:  # fmt: skip
        try:
            data = self._target(value if value is not None else target_location, target_sizes)
            self.client.put(self.namer.key(key), data)
            return True
        except ObjectAlreadyExists:
            return True  # content-addressed: the same page is already pooled
        except Exception as exc:
            log.error("kvcake HiCache set failed: %s", exc)
            return False

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:  # fmt: skip
        n = len(keys)
        vals = values if values is not None else [None] * n
        locs = target_locations if target_locations is not None else [None] * n
        sizes = target_sizes if target_sizes is not None else [None] * n
        return all(
            self.set(k, v, loc, s) for k, v, loc, s in zip(keys, vals, locs, sizes, strict=True)
        )

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """The page into ``target_location`` (its exact size, else an error and None), or a
        new uint8 tensor; None on a miss."""
        try:
            name = self.namer.key(key)
            if target_location is None:
                return torch.frombuffer(self.client.get(name), dtype=torch.uint8)
            view = self._target(target_location, target_sizes)
            size = self.client.get_size(name)
            if size != view.nbytes:
                raise PageLayoutError(f"{name}: {size} bytes pooled, target holds {view.nbytes}")
            self.client.get_into(name, view)
            return target_location
        except ObjectNotFound:
            return None
        except Exception as exc:
            log.error("kvcake HiCache get failed: %s", exc)
            return None

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[Any]:  # fmt: skip
        n = len(keys)
        locs = target_locations if target_locations is not None else [None] * n
        sizes = target_sizes if target_sizes is not None else [None] * n
        return [self.get(k, loc, s) for k, loc, s in zip(keys, locs, sizes, strict=True)]

    # --- housekeeping -------------------------------------------------------------------------
    def clear(self) -> None:
        """Removes this model's pages (every rank's: SGLang's flush is cluster-wide)."""
        try:
            self.client.remove_by_regex("^" + re.escape(f"sglang/{self.namer.model}/"))
        except Exception as exc:
            log.error("kvcake HiCache clear failed: %s", exc)

    def close(self) -> None:
        self.client.close()
