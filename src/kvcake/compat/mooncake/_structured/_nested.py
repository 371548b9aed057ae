"""Nested (``torch.jagged`` layout) tensors as structured members, as the wheel stores them: a
``torch_tensor`` field spec with ``nested: true``; the payload is the tensor's ``values``,
``offsets`` and (when set) ``lengths``, each in Mooncake's stored-tensor layout, one after the
other (``part_bytes`` gives their sizes). Reads take the whole payload; row slices and row picks
(axis 0) are taken from it (destinations are refused, as on the wheel)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvcake.compat.mooncake._structured import _tensorio as tio


def encode(value: Any) -> tuple[dict[str, Any], bytes]:
    torch = tio.torch_module()
    if value.layout != torch.jagged:
        raise ValueError("structured nested tensor fields require torch.jagged layout")
    lengths = value.lengths()
    parts = [value.values(), value.offsets(), *([] if lengths is None else [lengths])]
    blobs = [tio.serialize(p.detach().cpu().contiguous()) for p in parts]
    spec = {
        "encoding": "torch_tensor",
        "dtype": str(value.dtype),
        "nested": True,
        "format": "tensor_parts",
        "part_bytes": [len(b) for b in blobs],
        "has_lengths": lengths is not None,
        "ragged_idx": int(getattr(value, "_ragged_idx", 1)),
    }
    return spec, b"".join(blobs)


def decode(blob: bytes, spec: Mapping[str, Any]) -> Any:
    if spec.get("format") != "tensor_parts":
        raise ValueError(f"unsupported nested tensor payload format: {spec.get('format')}")
    sizes = spec.get("part_bytes")
    if not isinstance(sizes, list) or len(sizes) != (3 if spec.get("has_lengths") else 2):
        raise ValueError("nested tensor payload has invalid part metadata")
    parts, at = [], 0
    for size in sizes:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError("nested tensor payload has invalid part size")
        if at + size > len(blob):
            raise ValueError("nested tensor payload is truncated")
        parts.append(tio.deserialize(blob[at : at + size]))
        at += size
    if at != len(blob):
        raise ValueError("nested tensor payload has trailing bytes")
    lengths = parts[2] if len(parts) == 3 else None
    return _build(parts[0], parts[1], lengths, int(spec.get("ragged_idx", 1)))


def _build(values: Any, offsets: Any, lengths: Any, ragged_idx: int) -> Any:
    torch = tio.torch_module()
    seqlens = lengths if lengths is not None else offsets.diff()
    lo, hi = (int(seqlens.min()), int(seqlens.max())) if seqlens.numel() else (0, 0)
    return torch.nested.nested_tensor_from_jagged(
        values,
        offsets=offsets,
        lengths=lengths,
        jagged_dim=ragged_idx,
        min_seqlen=lo,
        max_seqlen=hi,
    )


def select_rows(value: Any, indices: Sequence[int]) -> Any:
    torch = tio.torch_module()
    rows = value.unbind()
    picked = [rows[int(i)] for i in indices]
    if picked:
        out = torch.nested.as_nested_tensor(picked, layout=value.layout)
    else:
        offsets = torch.zeros(1, dtype=value.offsets().dtype)
        out = torch.nested.nested_tensor_from_jagged(value.values()[:0], offsets=offsets)
    if hasattr(value, "_ragged_idx"):
        out._ragged_idx = value._ragged_idx
    return out
