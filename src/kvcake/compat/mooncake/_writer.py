"""``writer_partition`` writes, as the wheel 0.3.13.post1 stores them: a writer holding the whole
tensor passes an object with ``rank``, ``size`` and ``split_dim`` (a dict or list is refused,
-600) and stores its equal share as ``{key}__writer_{rank}of{size}_sd{split_dim}`` (a tp-shard
header) plus the 96-byte manifest ``{key}__writer_manifest``: magic ``NAMW``, version 1, size
96, dtype, ndim, split dim, shard count, 0, 4 bytes padding, the whole's shape (8 × int64, -1
padded). ``ReadTarget(mode="full")`` without a parallelism rebuilds the whole from the manifest
and every writer's share; a ``shard`` read of one tp axis finds a writer's share of that rank."""

from __future__ import annotations

import struct
from typing import Any

from kvcake.compat.mooncake import _tensor_meta as M
from kvcake.store import errors as E

MANIFEST = struct.Struct("<IHHiiiii4x8q")
MAGIC = 0x574D414E


def shard_key(key: str, rank: int, size: int, split_dim: int) -> str:
    return f"{key}__writer_{rank}of{size}_sd{split_dim}"


def manifest_key(key: str) -> str:
    return f"{key}__writer_manifest"


def spec(wp: Any) -> tuple[int, int, int]:
    try:
        r, n, d = wp.rank, wp.size, wp.split_dim
    except AttributeError:
        raise E.InvalidParams("writer_partition needs rank, size and split_dim") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (r, n, d)):
        raise E.InvalidParams("writer_partition rank, size and split_dim must be ints")
    return r, n, d


def plan(key: str, tensor: Any, wp: Any) -> list[tuple[str, bytes]]:
    """(key, stored bytes) of this writer's share, then of the manifest; InvalidParams for an
    impossible partition (the wheel's -600)."""
    r, n, d = spec(wp)
    shape = tuple(int(x) for x in tensor.shape)
    if not (n > 0 and 0 <= r < n and 0 <= d < len(shape)) or shape[d] % n:
        raise E.InvalidParams(f"writer partition {r}/{n} along {d} of {shape}")
    ext = shape[d] // n
    share = tensor.narrow(d, r * ext, ext).contiguous()
    shard = M.Shard(shape, (M.Axis(M.AXIS_TP, r, n, d),))
    dims = (*shape, *([-1] * (M.MAX_DIMS - len(shape))))
    code = M.dtype_code(tensor)
    manifest = MANIFEST.pack(MAGIC, 1, MANIFEST.size, code, len(shape), d, n, 0, *dims)
    return [(shard_key(key, r, n, d), M.encode(share, shard)), (manifest_key(key), manifest)]


def manifest(raw: Any) -> tuple[tuple[int, ...], int, int] | None:
    """(whole shape, split dim, shard count) of a stored manifest, None if it is not one."""
    if raw is None or len(raw) < MANIFEST.size:
        return None
    magic, ver, size, _, ndim, d, n, _, *dims = MANIFEST.unpack_from(bytes(raw[: MANIFEST.size]))
    if magic != MAGIC or ver != 1 or size != MANIFEST.size or not 0 <= d < ndim <= M.MAX_DIMS:
        return None
    return tuple(dims[:ndim]), d, n


def rebuild(key: str, raw_manifest: Any, get_many: Any) -> Any:
    """The whole tensor from every writer's share, None if any is missing or disagrees."""
    # lazy: optional dependency (torch)
    import torch

    m = manifest(raw_manifest)
    if m is None or m[2] <= 0:
        return None
    shape, d, n = m
    parts = []
    for r, blob in enumerate(get_many([shard_key(key, r, n, d) for r in range(n)])):
        try:
            s = None if blob is None else M.parse(blob)[3]
        except M.TensorFormatError:
            return None
        if s is None or s.global_shape != shape or s.axes != (M.Axis(M.AXIS_TP, r, n, d),):
            return None
        parts.append(M.decode(blob))
    whole = torch.cat(parts, dim=d)
    return whole if tuple(whole.shape) == shape else None
