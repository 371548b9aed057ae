"""``infer_structure`` and ``MISSING``, as the wheel exposes them: a column of row values is
expanded into interior nodes (dicts with string keys, short lists of containers) and leaves, each
leaf with the codec the wheel's inference would pick for it. A dict key a row lacks is
``MISSING`` in that row's child column (``None`` means the value was ``None``); a row without
the parent container is ``None``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured import _tensorio as tio

MAX_STRUCT_KEYS = 64
MAX_LIST_LEN = 8
MAX_DEPTH = 32


class _Missing:
    """Sentinel for dict keys absent from a row (distinct from a ``None`` value)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<MISSING>"


MISSING = _Missing()


@dataclass
class CodecDecision:
    accepted: bool
    codec: str
    reason: str
    normalized_type: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferredLeaf:
    path: str
    values: list[Any]
    decision: CodecDecision


@dataclass
class InferredNode:
    path: str
    node_type: str
    children: list[Any]
    lengths: list[int] | None = None
    row_mask: list[bool] | None = None


def present(values: list[Any]) -> list[Any]:
    return [v for v in values if v is not None and not isinstance(v, _Missing)]


def is_pil_image(value: Any) -> bool:
    module = getattr(type(value), "__module__", "") or ""
    return module.startswith("PIL.") and hasattr(value, "save")


def is_bytes(value: Any) -> bool:
    return isinstance(value, bytes | bytearray | memoryview)


def is_media_list(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(is_pil_image(v) or is_bytes(v) for v in value)


def _numeric_lists(rows: list[Any]) -> str | None:
    try:
        dtype = np.result_type(*[np.asarray(v).dtype for v in rows])
    except (TypeError, ValueError, OverflowError):
        return None
    return str(dtype) if np.issubdtype(dtype, np.number) else None


def _tensors(rows: list[Any]) -> CodecDecision:
    dtypes = sorted({str(v.dtype) for v in rows})
    if len(dtypes) != 1:
        reason = f"mixed tensor dtype: {dtypes}"
        return CodecDecision(False, "ragged_tensor", reason, "torch.Tensor")
    reason = "all non-null rows are Tensor"
    return CodecDecision(True, "ragged_tensor", reason, "torch.Tensor", {"dtype": dtypes[0]})


def _arrays(rows: list[Any]) -> CodecDecision:
    if all(np.issubdtype(v.dtype, np.number) for v in rows):
        meta = {"recursive_source": "ndarray"}
        reason = "all rows are numeric ndarray"
        return CodecDecision(True, "typed_ragged", reason, "numeric sequence", meta)
    return CodecDecision(False, "msgpack_ragged", "object ndarray rows", "python object")


_SIMPLE = (
    (is_bytes, "bytes_ragged", "all rows are bytes-like", "bytes-like"),
    (is_pil_image, "media_bytes", "all rows are media", "media"),
    (lambda v: isinstance(v, str), "utf8_ragged", "all rows are str", "str"),
    (
        lambda v: isinstance(v, dict | list | tuple),
        "msgpack_ragged",
        "all rows are msgpack-like",
        "msgpack",
    ),
)


def choose_leaf(values: list[Any]) -> CodecDecision:
    """The codec the wheel's inference picks for one column (``accepted=False``: none)."""
    rows = present(values)
    if not rows:
        return CodecDecision(False, "msgpack_ragged", "all rows are null", "msgpack")
    if all(tio.is_tensor(v) for v in rows):
        return _tensors(rows)
    if all(is_media_list(v) for v in rows):
        return CodecDecision(True, "media_list_ragged", "all rows are media lists", "media list")
    if all(isinstance(v, np.ndarray) for v in rows):
        return _arrays(rows)
    dtype = _numeric_lists(rows) if all(isinstance(v, list | tuple) for v in rows) else None
    if dtype is not None:
        reason = "all rows are numeric sequences"
        return CodecDecision(True, "typed_ragged", reason, "numeric sequence", {"dtype": dtype})
    if all(isinstance(v, bool | int | float | np.number) for v in rows):
        meta = {"dtype": str(np.result_type(*rows))}
        return CodecDecision(True, "ndarray", "all rows are numeric scalar", "numeric scalar", meta)
    for test, codec, reason, kind in _SIMPLE:
        if all(test(v) for v in rows):
            return CodecDecision(True, codec, reason, kind)
    return CodecDecision(False, "msgpack_ragged", "no codec matched", "python object")


def _dict_keys(values: list[Any]) -> list[str] | None:
    rows = present(values)
    if not rows or not all(isinstance(v, dict) for v in rows):
        return None
    keys = {k for v in rows for k in v}
    if len(keys) > MAX_STRUCT_KEYS or not all(isinstance(k, str) for k in keys):
        return None
    return sorted(keys)


def _list_len(values: list[Any]) -> int | None:
    rows = present(values)
    if not rows or not all(isinstance(v, list | tuple) for v in rows):
        return None
    longest = max(len(v) for v in rows)
    items_ok = all(i is None or isinstance(i, dict | list | tuple) for v in rows for i in v)
    return longest if longest <= MAX_LIST_LEN and items_ok else None


def escape_key(key: str) -> str:
    return key.replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[")


def infer_structure(
    path: str,
    values: list[Any],
    leaves: list[InferredLeaf],
    nodes: list[InferredNode],
    *,
    _depth: int = 0,
) -> None:
    """Expands ``values`` (one per row) into ``nodes`` and ``leaves`` (appended to)."""
    if _depth > MAX_DEPTH:
        raise ValueError(f"infer_structure exceeded max depth {MAX_DEPTH} at {path!r}")
    keys = _dict_keys(values)
    if keys is not None:
        mask = [isinstance(v, dict) for v in values]
        nodes.append(InferredNode(path, "dict", list(keys), row_mask=mask))
        for key in keys:
            child = [v.get(key, MISSING) if isinstance(v, dict) else None for v in values]
            infer_structure(f"{path}.{escape_key(key)}", child, leaves, nodes, _depth=_depth + 1)
        return
    longest = _list_len(values)
    if longest is not None:
        mask = [isinstance(v, list | tuple) for v in values]
        lengths = [len(v) if m else 0 for v, m in zip(values, mask, strict=True)]
        nodes.append(InferredNode(path, "list", list(range(longest)), lengths, mask))
        for i in range(longest):
            child = [_item(v, i) for v in values]
            infer_structure(f"{path}[{i}]", child, leaves, nodes, _depth=_depth + 1)
        return
    leaves.append(InferredLeaf(path, values, choose_leaf(values)))


def _item(value: Any, index: int) -> Any:
    if not isinstance(value, list | tuple):
        return None
    return value[index] if index < len(value) else MISSING
