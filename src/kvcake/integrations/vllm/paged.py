"""vLLM's paged KV tensors as rows of pool objects.

A pool object is one block of every layer: the concatenation, in layer registration order, of
each layer's bytes for that block. vLLM's CPU backend keeps a layer as
``[num_blocks, kv_heads, block_size, 2 * head_size]`` (LBHNC), so one layer's block is already
contiguous; GPU backends that split K and V (``[2, num_blocks, ...]``) give two planes per layer.
Gather/scatter are one ``index_select``/``index_copy_`` per plane for all blocks of a step.
Loads from the pool on CPU skip both: :meth:`ranges` names, per block, each plane's row as the
destination of one byte range of the pool object, and the store reads straight into it.

On a CUDA engine the planes live in device memory: gather copies device -> the host staging
row (``.cpu()``), scatter host -> device; nothing else changes (not tested here: CPU only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from kvcake.core.errors import KvcakeError
from kvcake.core.ranges import RangeTable


class LayoutError(KvcakeError):
    """vLLM handed the connector KV tensors it does not know how to page."""


class PagedKV:
    def __init__(self, kv_caches: dict[str, torch.Tensor], num_blocks: int):
        planes: list[torch.Tensor] = []
        self.layer_planes: dict[str, list[int]] = {}  # layer name -> its plane indices
        for name, t in kv_caches.items():
            if t.shape[0] == num_blocks:
                parts = [t]
            elif t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] == num_blocks:
                parts = [t[0], t[1]]
            else:
                raise LayoutError(f"layer {name}: KV shape {tuple(t.shape)} has no block dim")
            for p in parts:
                if not p[0].is_contiguous() or p.stride(0) != p[0].numel():
                    raise LayoutError(f"layer {name}: a block is not contiguous ({p.stride()})")
                self.layer_planes.setdefault(name, []).append(len(planes))
                planes.append(p.view(num_blocks, -1))
        if not planes:
            raise LayoutError("no KV cache tensors registered")
        dtypes = {p.dtype for p in planes}
        if len(dtypes) != 1:
            raise LayoutError(f"mixed KV dtypes {dtypes}")
        self.dtype = planes[0].dtype
        self.device = planes[0].device
        self.planes = planes
        self.num_blocks = num_blocks
        self.offsets: list[int] = []
        off = 0
        for p in planes:
            self.offsets.append(off)
            off += p.shape[1]
        self.row_elems = off
        self.block_bytes = off * planes[0].element_size()
        self._rows: list[Any] | None = None  # per plane: a [num_blocks, row bytes] uint8 view
        # per plane: base address, row stride, offset in the object, row bytes (for tables)
        self._geometry: tuple[npt.NDArray[np.uint64], ...] | None = None

    @property
    def direct(self) -> bool:
        """Whether the store can read straight into the planes (host memory)."""
        return self.device.type == "cpu"

    def ranges(self, block_id: int) -> list[tuple[int, memoryview]]:
        """Where block ``block_id``'s pool object goes: per plane, (the plane's byte offset in
        the object, that plane's row for the block). CPU planes only (:attr:`direct`)."""
        if not 0 <= block_id < self.num_blocks:
            raise LayoutError(f"block id {block_id} out of range [0, {self.num_blocks})")
        if self._rows is None:
            self._rows = [p.numpy().view(np.uint8) for p in self.planes]
        size = self.planes[0].element_size()
        return [
            (off * size, memoryview(rows[block_id]))
            for rows, off in zip(self._rows, self.offsets, strict=True)
        ]

    def tables(
        self, block_ids: Sequence[int], planes: Sequence[int] | None = None
    ) -> list[RangeTable]:
        """:meth:`ranges` of each block as one table (``planes``: only those, e.g. one layer
        group's), built with a few vector operations instead of a view per plane and block:
        what a load hands the store (``Client.batch_get_into_ranges``). CPU planes only."""
        if self._geometry is None:
            size = self.planes[0].element_size()
            self._geometry = tuple(
                np.array(xs, dtype=np.uint64)
                for xs in (
                    [p.data_ptr() for p in self.planes],
                    [p.stride(0) * size for p in self.planes],
                    [off * size for off in self.offsets],
                    [p.shape[1] * size for p in self.planes],
                )
            )
        pick = list(planes) if planes is not None else slice(None)
        bases, strides, offs, lens = (a[pick] for a in self._geometry)
        for b in block_ids:
            if not 0 <= b < self.num_blocks:
                raise LayoutError(f"block id {b} out of range [0, {self.num_blocks})")
        return RangeTable.strided_rows(bases, strides, offs, lens, block_ids, self.planes)

    def layer_groups(self, n: int) -> list[list[str]]:
        """The layers in registration (= forward) order, cut into at most ``n`` contiguous
        groups of about equal size: the units of a layer-wise load."""
        names = list(self.layer_planes)
        n = max(1, min(n, len(names)))
        return [names[len(names) * g // n : len(names) * (g + 1) // n] for g in range(n)]

    def empty(self, n: int) -> torch.Tensor:
        """A host staging buffer for ``n`` blocks (rows are the pool objects)."""
        return torch.empty((n, self.row_elems), dtype=self.dtype, device="cpu")

    def _index(self, block_ids: Sequence[int]) -> torch.Tensor:
        idx = torch.tensor(list(block_ids), dtype=torch.long)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.num_blocks):
            raise LayoutError(f"block id out of range [0, {self.num_blocks})")
        return idx.to(self.device)

    def gather(self, block_ids: Sequence[int], out: torch.Tensor) -> None:
        """Copy blocks ``block_ids`` of every plane into rows of ``out``."""
        idx = self._index(block_ids)
        for p, off in zip(self.planes, self.offsets, strict=True):
            out[:, off : off + p.shape[1]] = p.index_select(0, idx).cpu()

    def scatter(self, block_ids: Sequence[int], rows: torch.Tensor) -> None:
        """Copy rows (pool objects) into blocks ``block_ids`` of every plane."""
        idx = self._index(block_ids)
        for p, off in zip(self.planes, self.offsets, strict=True):
            p.index_copy_(0, idx, rows[:, off : off + p.shape[1]].to(self.device))
