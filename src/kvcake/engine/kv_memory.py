"""Paged KV memory: one contiguous, writable byte region holding fixed-size KV blocks.

Layout ``block-layer-kv`` (docs/engine.md)::

    region = block[num_blocks]
    block  = layer[num_layers]                      (block_bytes)
    layer  = kv[2]  (0 = K, 1 = V)                  (layer_bytes)
    kv     = token[block_tokens]
    token  = kv_heads * head_dim elements of dtype  (token_bytes)

So one block (all layers) is one contiguous range, and one layer of one block is a contiguous
sub-range: moving a block takes one transfer, streaming it layer by layer takes ``num_layers``.

Ownership: a :class:`KVMemory` either owns its region (an anonymous mmap, or a ``/dev/shm`` file it
created and unlinks on :meth:`close`) or borrows a caller's buffer (e.g. from
``TransferEngine.allocate_segment``), which the caller must keep alive and free.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvcake.core.errors import EngineError

LAYOUT_NAME = "block-layer-kv"
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}


@dataclass(frozen=True)
class KVLayout:
    """Geometry of the region. All byte offsets the Transfer Engine needs derive from it."""

    num_blocks: int
    num_layers: int
    block_tokens: int
    kv_heads: int
    head_dim: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if min(self.num_blocks, self.num_layers, self.block_tokens, self.kv_heads) <= 0:
            raise EngineError(f"KV layout sizes must be positive: {self}")
        if self.head_dim <= 0:
            raise EngineError(f"KV layout head_dim must be positive: {self}")
        if self.dtype not in _ITEMSIZE:
            raise EngineError(f"KV dtype must be one of {sorted(_ITEMSIZE)}, got {self.dtype!r}")

    name = LAYOUT_NAME

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    @property
    def width(self) -> int:
        """Elements per token per layer per K or V."""
        return self.kv_heads * self.head_dim

    @property
    def token_bytes(self) -> int:
        return self.width * self.itemsize

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer (K and V) of one block."""
        return 2 * self.block_tokens * self.token_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one block, all layers."""
        return self.num_layers * self.layer_bytes

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.block_bytes // self.block_tokens

    def check_block(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise EngineError(f"block id {block_id} outside [0, {self.num_blocks})")

    def block_offset(self, block_id: int) -> int:
        self.check_block(block_id)
        return block_id * self.block_bytes

    def layer_range(self, block_id: int, layer: int) -> tuple[int, int]:
        """``(offset, length)`` of ``layer`` of ``block_id`` within the region."""
        if not 0 <= layer < self.num_layers:
            raise EngineError(f"layer {layer} outside [0, {self.num_layers})")
        return self.block_offset(block_id) + layer * self.layer_bytes, self.layer_bytes

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_tokens)


class KVMemory:
    """The region plus typed views of it. Thread-safety: none; the engine loop owns writes."""

    def __init__(
        self, layout: KVLayout, buffer: Any | None = None, shm_name: str | None = None
    ) -> None:
        self.layout = layout
        self._mmap: mmap.mmap | None = None
        self._shm_path: Path | None = None
        if buffer is not None:
            self.buffer: Any = buffer
        elif shm_name:
            self.buffer = self._open_shm(shm_name, layout.total_bytes)
        else:
            self._mmap = mmap.mmap(-1, layout.total_bytes)
            self.buffer = self._mmap
        arr = np.frombuffer(self.buffer, dtype=np.uint8)
        if arr.size < layout.total_bytes:
            raise EngineError(
                f"KV buffer holds {arr.size} bytes, layout needs {layout.total_bytes}"
            )
        if not arr.flags.writeable:
            raise EngineError("KV buffer must be writable")
        self.bytes: np.ndarray = arr[: layout.total_bytes]

    def _open_shm(self, name: str, size: int) -> mmap.mmap:
        path = Path("/dev/shm") / name.lstrip("/")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._shm_path = path
        return self._mmap

    @property
    def shm_path(self) -> Path | None:
        """The ``/dev/shm`` file backing the region, if any (another process may map it)."""
        return self._shm_path

    def blocks_array(self) -> np.ndarray:
        """``uint8[num_blocks, num_layers, 2, block_tokens, token_bytes]`` view (no copy)."""
        L = self.layout
        return self.bytes.reshape(L.num_blocks, L.num_layers, 2, L.block_tokens, L.token_bytes)

    def block_view(self, block_id: int) -> memoryview:
        off = self.layout.block_offset(block_id)
        return self.bytes[off : off + self.layout.block_bytes].data

    def export_blocks(self, block_ids: Sequence[int]) -> bytes:
        """Copy the given blocks out, concatenated in order (``len == n * block_bytes``)."""
        for b in block_ids:
            self.layout.check_block(b)
        flat = self.bytes.reshape(self.layout.num_blocks, self.layout.block_bytes)
        return flat[np.asarray(block_ids, dtype=np.int64)].tobytes()

    def import_blocks(self, block_ids: Sequence[int], data: bytes | memoryview) -> None:
        """Write ``data`` (as produced by :meth:`export_blocks`) into ``block_ids``."""
        bb = self.layout.block_bytes
        if len(data) != len(block_ids) * bb:
            raise EngineError(
                f"import of {len(block_ids)} blocks needs {len(block_ids) * bb} bytes, "
                f"got {len(data)}"
            )
        src = np.frombuffer(data, dtype=np.uint8).reshape(len(block_ids), bb)
        for i, b in enumerate(block_ids):
            off = self.layout.block_offset(b)
            self.bytes[off : off + bb] = src[i]

    def close(self) -> None:
        """Release an owned region (views taken earlier must no longer be used)."""
        self.bytes = np.empty(0, dtype=np.uint8)
        if self._mmap is not None:
            # A torch/numpy view may still be alive; the mapping then dies with it.
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None
        if self._shm_path is not None:
            self._shm_path.unlink(missing_ok=True)
            self._shm_path = None
