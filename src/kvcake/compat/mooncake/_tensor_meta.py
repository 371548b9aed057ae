"""Mooncake 0.3.13's stored-tensor layout, byte for byte: a 304-byte little-endian header
followed by the raw C-contiguous data, so a tensor written by kvcake reads back with the wheel's
``_deserialize_tensor`` and vice versa (layout read off the wheel's ``_serialize_tensor``).

Header (int64 words unless noted): magic ``NOOM\\x01\\x000\\x01`` · dtype (int32) + ndim (int32)
· flags (1 = a parallel shard) · header size (304) · data bytes · global shape[8] · local shape[8]
(-1 padded) · parallel block: axis count, then per axis kind, rank (int32) + size (int32),
split dim, offset along it (4 axes at most)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

MAGIC = 0x13000014D4F4F4E
HEADER = 304
MAX_DIMS = 8
MAX_AXES = 4
AXIS_TP = 1
_HEAD = struct.Struct("<QiiqqQ")  # magic, dtype, ndim, flags, header size, data bytes
_SHAPE = struct.Struct(f"<{MAX_DIMS}q")
_AXIS = struct.Struct("<qiiqq")  # kind, rank, size, split_dim, offset

DTYPES = [
    "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
    "uint64", "bool", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
]  # fmt: skip


class TensorFormatError(ValueError):
    pass


@dataclass(frozen=True)
class Shard:
    """This piece's place in the whole tensor (tensor parallelism along one dimension)."""

    rank: int
    size: int
    split_dim: int
    offset: int
    global_shape: tuple[int, ...]


def dtype_code(tensor: Any) -> int:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise TensorFormatError(f"unsupported tensor for Mooncake tensor serialization: {name}")
    return DTYPES.index(name)


def _shape(dims: tuple[int, ...]) -> bytes:
    if len(dims) > MAX_DIMS:
        raise TensorFormatError(f"at most {MAX_DIMS} dimensions, got {len(dims)}")
    return _SHAPE.pack(*dims, *([-1] * (MAX_DIMS - len(dims))))


def header(tensor: Any, shard: Shard | None = None) -> bytes:
    shape = tuple(int(d) for d in tensor.shape)
    nbytes = tensor.numel() * tensor.element_size()
    out = bytearray(HEADER)
    flags = 1 if shard is not None else 0
    _HEAD.pack_into(out, 0, MAGIC, dtype_code(tensor), len(shape), flags, HEADER, nbytes)
    pos = _HEAD.size
    out[pos : pos + _SHAPE.size] = _shape(shard.global_shape if shard else shape)
    out[pos + _SHAPE.size : pos + 2 * _SHAPE.size] = _shape(shape)
    if shard is not None:
        pos += 2 * _SHAPE.size
        struct.pack_into("<q", out, pos, 1)
        _AXIS.pack_into(
            out, pos + 8, AXIS_TP, shard.rank, shard.size, shard.split_dim, shard.offset
        )
    return bytes(out)


def encode(tensor: Any, shard: Shard | None = None) -> bytes:
    """Header + data of a CPU tensor (copied to contiguous CPU memory first)."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TensorFormatError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    t = tensor.detach().cpu().contiguous()
    head = header(t, shard)
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return head + raw


def parse(blob: Any) -> tuple[str, tuple[int, ...], int, Shard | None]:
    """(dtype name, local shape, data bytes, shard) of a stored tensor; TensorFormatError if the
    bytes are not one."""
    mv = memoryview(blob).cast("B")
    if mv.nbytes < HEADER:
        raise TensorFormatError("Invalid data format: insufficient data for metadata")
    magic, code, ndim, flags, size, nbytes = _HEAD.unpack_from(mv, 0)
    if magic != MAGIC or size != HEADER or not 0 <= code < len(DTYPES) or not 0 <= ndim <= 8:
        raise TensorFormatError("Invalid data format: not a Mooncake tensor")
    if mv.nbytes < HEADER + nbytes:
        raise TensorFormatError("Invalid data format: insufficient data for tensor payload")
    pos = _HEAD.size
    global_shape = _SHAPE.unpack_from(mv, pos)[:ndim]
    local = _SHAPE.unpack_from(mv, pos + _SHAPE.size)[:ndim]
    shard = None
    if flags & 1:
        _, rank, n, dim, off = _AXIS.unpack_from(mv, pos + 2 * _SHAPE.size + 8)
        shard = Shard(rank, n, dim, off, tuple(global_shape))
    return DTYPES[code], tuple(local), nbytes, shard


def decode(blob: Any, copy: bool = True) -> Any:
    """The tensor in ``blob`` (a fresh copy, or a view of ``blob``'s memory with copy=False)."""
    import torch

    name, shape, nbytes, _ = parse(blob)
    dtype = getattr(torch, name)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    mv = memoryview(blob).cast("B")[HEADER : HEADER + nbytes]
    data = bytearray(mv) if copy else mv
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)


def split(tensor: Any, parts: int, dim: int) -> list[tuple[Any, Shard]]:
    """``parts`` shards along ``dim`` (torch.chunk's sizes), each with its place."""
    if parts < 1 or not -tensor.dim() <= dim < max(tensor.dim(), 1):
        raise TensorFormatError(f"cannot split {tuple(tensor.shape)} into {parts} along {dim}")
    dim = dim % tensor.dim()
    chunks = tensor.chunk(parts, dim)
    if len(chunks) != parts:
        raise TensorFormatError(f"dimension {dim} of size {tensor.shape[dim]} < {parts} shards")
    out, offset = [], 0
    for rank, c in enumerate(chunks):
        out.append((c, Shard(rank, parts, dim, offset, tuple(tensor.shape))))
        offset += c.shape[dim]
    return out
