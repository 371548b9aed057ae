"""Tensors in structured objects, in Mooncake's stored-tensor layout (``_tensor_meta``: a 304-byte
header, then the data) so ``get_tensor`` and range reads see the same bytes. torch is optional:
it is only touched when a value already is a torch tensor (so torch is imported)."""

from __future__ import annotations

import io
import struct
import sys
from typing import Any

from kvcake.compat.mooncake import _tensor_meta as meta

HEADER = meta.HEADER
_DATA_BYTES_AT = 32  # the header's data size word
_GLOBAL_SHAPE_AT = 40  # then 8 int64 dims, then the local shape's 8
_DIMS = struct.Struct(f"<{meta.MAX_DIMS}q")


def torch_module() -> Any:
    return sys.modules.get("torch")


def is_tensor(value: Any) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(value, torch.Tensor)


def serialize(tensor: Any) -> bytes:
    """header + data of a CPU tensor (a copy)."""
    try:
        return meta.encode(tensor)
    except meta.TensorFormatError as exc:
        raise ValueError(str(exc)) from None


def deserialize(blob: bytes) -> Any:
    return meta.decode(blob)


def torch_save(tensor: Any) -> bytes:
    buf = io.BytesIO()
    torch_module().save(tensor, buf)
    return buf.getvalue()


def torch_load(blob: bytes) -> Any:
    # lazy: optional dependency (torch)
    import torch  # a torch_save payload exists only where torch wrote it

    return torch.load(io.BytesIO(blob), weights_only=True)


def sliced_header(head: bytes, shape: tuple[int, ...], data_bytes: int) -> bytes:
    """The header of rows ``[a, b)`` of the stored tensor: shape and data size rewritten."""
    out = bytearray(head)
    struct.pack_into("<Q", out, _DATA_BYTES_AT, data_bytes)
    dims = [*shape, *([-1] * (meta.MAX_DIMS - len(shape)))]
    _DIMS.pack_into(out, _GLOBAL_SHAPE_AT, *dims)
    _DIMS.pack_into(out, _GLOBAL_SHAPE_AT + _DIMS.size, *dims)
    return bytes(out)
