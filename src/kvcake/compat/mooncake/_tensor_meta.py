"""Mooncake 0.3.13's stored-tensor layout, byte for byte: a 304-byte little-endian header
followed by the raw C-contiguous data, so a tensor written by kvcake reads back with the wheel's
``_deserialize_tensor`` and vice versa (layout read off the wheel's ``_serialize_tensor``).

Header (int64 words unless noted): magic ``NOOM\\x01\\x000\\x01`` · dtype (int32) + ndim (int32)
· flags (1 = a parallel shard) · header size (304) · data bytes · global shape[8] · local shape[8]
(-1 padded) · parallel block: axis count, then per axis (32 bytes, int32 unless noted) kind
(dp 0, tp 1, ep 2, pp 3), axis index, rank, size, split dim (-1: none), expert / stage id, and
the shard's extent along its split dim (int64); 4 axes at most. Read off the wheel's stored
shards (``put_tensor_with_parallelism`` of each axis kind)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

MAGIC = 0x13000014D4F4F4E
HEADER = 304
MAX_DIMS = 8
MAX_AXES = 4
KINDS = ("dp", "tp", "ep", "pp")  # the stored kind codes, also the wheel's canonical axis order
AXIS_TP = KINDS.index("tp")
_HEAD = struct.Struct("<QiiqqQ")  # magic, dtype, ndim, flags, header size, data bytes
_SHAPE = struct.Struct(f"<{MAX_DIMS}q")
_AXIS = struct.Struct("<iiiiiiq")  # kind, index, rank, size, split_dim, expert/stage id, extent

DTYPES = [
    "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
    "uint64", "bool", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
]  # fmt: skip


class TensorFormatError(ValueError):
    pass


@dataclass(frozen=True)
class Axis:
    """One parallel axis of a stored shard (``split_dim`` -1: the axis does not split)."""

    kind: int
    rank: int
    size: int
    split_dim: int = -1
    tag: int = 0  # expert id (ep) or stage id (pp)


@dataclass(frozen=True)
class Shard:
    """This piece's place in the whole tensor: the whole's shape and the axes that name it."""

    global_shape: tuple[int, ...]
    axes: tuple[Axis, ...]

    def axis(self, kind: int) -> Axis | None:
        return next((a for a in self.axes if a.kind == kind), None)


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
        struct.pack_into("<q", out, pos, len(shard.axes))
        for i, a in enumerate(shard.axes):
            extent = shape[a.split_dim] if 0 <= a.split_dim < len(shape) else 0
            _AXIS.pack_into(
                out, pos + 8 + i * _AXIS.size, a.kind, i, a.rank, a.size, a.split_dim, a.tag, extent
            )
    return bytes(out)


def encode(tensor: Any, shard: Shard | None = None) -> bytes:
    """Header + data of a CPU tensor (copied to contiguous CPU memory first)."""
    # lazy: optional dependency (torch)
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
        pos += 2 * _SHAPE.size
        count = min(struct.unpack_from("<q", mv, pos)[0], MAX_AXES)
        axes = []
        for i in range(max(count, 0)):
            kind, _, rank, n, dim, tag, _ = _AXIS.unpack_from(mv, pos + 8 + i * _AXIS.size)
            axes.append(Axis(kind, rank, n, dim, tag))
        shard = Shard(tuple(global_shape), tuple(axes))
    return DTYPES[code], tuple(local), nbytes, shard


def decode(blob: Any, copy: bool = True) -> Any:
    """The tensor in ``blob`` (a fresh copy, or a view of ``blob``'s memory with copy=False)."""
    # lazy: optional dependency (torch)
    import torch

    name, shape, nbytes, _ = parse(blob)
    dtype = getattr(torch, name)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    mv = memoryview(blob).cast("B")[HEADER : HEADER + nbytes]
    data = bytearray(mv) if copy else mv
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)


def split(tensor: Any, parts: int, dim: int) -> list[tuple[Any, Shard]]:
    """``parts`` equal shards along ``dim``, each with its place. The wheel refuses a dimension
    that ``parts`` does not divide (TensorFormatError)."""
    if parts < 1 or not -tensor.dim() <= dim < max(tensor.dim(), 1):
        raise TensorFormatError(f"cannot split {tuple(tensor.shape)} into {parts} along {dim}")
    dim = dim % tensor.dim()
    if tensor.shape[dim] % parts:
        raise TensorFormatError(
            f"dimension {dim} of size {tensor.shape[dim]} is not {parts} equal shards"
        )
    whole = tuple(int(d) for d in tensor.shape)
    return [
        (c, Shard(whole, (Axis(AXIS_TP, rank, parts, dim),)))
        for rank, c in enumerate(tensor.chunk(parts, dim))
    ]
