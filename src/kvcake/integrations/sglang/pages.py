"""A registered SGLang host pool as byte segments per page (zero copy: views of the pool).

SGLang's ``get_page_buffer_meta(host_indices)`` gives raw pointers and sizes: per page, K and V
of all layers (``page_first``, ``page_head``: 2 runs), or K and V per layer (``layer_first``:
2 x layers runs), or K only (MLA). Pointers are turned back into views of the pool's own tensor,
after checking that every run lies inside it, so a wrong pointer or size from a caller is an
error and never a write to memory outside the pool."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvcake.integrations.sglang.keys import LAYOUTS, PageLayoutError


class HostPages:
    def __init__(self, pool: Any) -> None:
        # lazy: optional dependency (torch)
        import torch

        layout = getattr(pool, "layout", None)
        if layout not in LAYOUTS:
            raise PageLayoutError(
                f"host pool layout {layout!r} is not supported (supported: {sorted(LAYOUTS)})"
            )
        buf = getattr(pool, "kv_buffer", None)
        if not isinstance(buf, torch.Tensor):
            raise PageLayoutError(
                f"{type(pool).__name__} has no kv_buffer tensor (a logical or hybrid pool: "
                "this backend serves MHA and MLA KV pools)"
            )
        if buf.device.type != "cpu" or not buf.is_contiguous():
            raise PageLayoutError("the host pool's kv_buffer must be a contiguous CPU tensor")
        self.pool = pool
        self.layout: str = layout
        self.page_size: int = int(pool.page_size)
        self.dtype = str(pool.dtype).removeprefix("torch.")
        self.base: int = buf.data_ptr()
        self.bytes = buf.reshape(-1).view(torch.uint8).numpy()  # shares the pool's memory
        probe = self.runs(torch.arange(self.page_size, dtype=torch.int64), 1)
        self.runs_per_page = len(probe[0])
        self.page_bytes = sum(n for _, n in probe[0])

    def runs(self, host_indices: Any, pages: int) -> list[list[tuple[int, int]]]:
        """Per page, its (offset in the pool, size) runs, checked against the pool."""
        if len(host_indices) != pages * self.page_size:
            raise PageLayoutError(
                f"{len(host_indices)} host slots for {pages} pages of {self.page_size} tokens"
            )
        ptrs, sizes = self.pool.get_page_buffer_meta(host_indices)
        if len(ptrs) != len(sizes) or len(ptrs) % max(pages, 1):
            raise PageLayoutError(f"{len(ptrs)} buffers / {len(sizes)} sizes for {pages} pages")
        per = len(ptrs) // max(pages, 1)
        out = []
        for p in range(pages):
            page = []
            sl = slice(p * per, (p + 1) * per)
            for ptr, size in zip(ptrs[sl], sizes[sl], strict=True):
                off = int(ptr) - self.base
                if off < 0 or size <= 0 or off + int(size) > self.bytes.nbytes:
                    raise PageLayoutError(f"buffer {ptr:#x}+{size} lies outside the host pool")
                page.append((off, int(size)))
            out.append(page)
        return out

    def checked_runs(self, host_indices: Any, pages: int) -> list[list[tuple[int, int]]]:
        out = self.runs(host_indices, pages)
        for page in out:
            if sum(n for _, n in page) != self.page_bytes:
                raise PageLayoutError(
                    f"a page of {sum(n for _, n in page)} bytes, the pool's are {self.page_bytes}"
                )
        return out

    def value(self, page: list[tuple[int, int]]) -> np.ndarray:
        """The page's bytes as one value (a view for one run, else one copy)."""
        parts = [self.bytes[off : off + n] for off, n in page]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def scatter(self, page: list[tuple[int, int]]) -> list[tuple[int, np.ndarray]]:
        """(offset in the stored value, writable view of the pool) per run: a read's ranges."""
        ranges, at = [], 0
        for off, n in page:
            ranges.append((at, self.bytes[off : off + n]))
            at += n
        return ranges
