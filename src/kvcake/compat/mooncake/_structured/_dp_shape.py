"""DataProto shapes: taking a DataProto-like value apart (an object with ``batch`` /
``non_tensor_batch`` / ``meta_info``, an envelope dict of those, or a plain dict of batch
fields), checking its batch size, choosing fields and rows to read, and building the result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured._types import MooncakeDataProtoRef, StructuredMemberSlice

SECTIONS = ("batch", "non_tensor_batch", "meta_info")


def _as_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    items = getattr(value, "items", None)
    if callable(items):
        return dict(items())
    raise TypeError(f"expected mapping-like value, got {type(value).__name__}")


def _is_envelope(data: Mapping[str, Any]) -> bool:
    if not data or not set(data) <= set(SECTIONS):
        return False
    return all(
        v is None or isinstance(v, Mapping) or callable(getattr(v, "items", None))
        for v in data.values()
    )


def split(data: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(batch, non_tensor_batch, meta_info). A dict whose keys are section names but whose
    values are not mappings is a plain dict of batch fields."""
    if isinstance(data, Mapping):
        if _is_envelope(data):
            return tuple(_as_dict(data.get(s)) for s in SECTIONS)  # type: ignore[return-value]
        return dict(data), {}, {}
    return tuple(_as_dict(getattr(data, s, None)) for s in SECTIONS)  # type: ignore[return-value]


def batch_size(batch: Mapping[str, Any], non_tensor: Mapping[str, Any]) -> int:
    sizes = {len(v) for section in (batch, non_tensor) for v in section.values()}
    if len(sizes) > 1:
        raise ValueError(f"DataProto fields have inconsistent batch sizes: {sorted(sizes)}")
    return sizes.pop() if sizes else 0


def build_result(
    batch: dict[str, Any], non_tensor: dict[str, Any], meta: dict[str, Any], data_cls: Any
) -> Any:
    if data_cls is None or data_cls is dict:
        return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": meta}
    try:
        from_dict = getattr(data_cls, "from_dict", None)
        if callable(from_dict):
            return from_dict(batch, non_tensor, meta_info=meta)
        return data_cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
    except TypeError as exc:
        name = getattr(data_cls, "__name__", data_cls)
        raise TypeError(
            f"{name!r} cannot be constructed from batch, non_tensor_batch, and meta_info"
        ) from exc


def choose_fields(
    ref: MooncakeDataProtoRef,
    fields: Sequence[str] | None,
    batch_fields: Sequence[str] | None,
    non_tensor_fields: Sequence[str] | None,
) -> list[str]:
    """The field names to read (each field's section is in the ref's index)."""
    if fields is not None and (batch_fields is not None or non_tensor_fields is not None):
        raise ValueError("fields cannot be combined with batch_fields or non_tensor_fields")
    if fields is not None:
        chosen = list(fields)
    elif batch_fields is None and non_tensor_fields is None:
        chosen = list(ref.field_index)
    else:
        chosen = [*(batch_fields or ()), *(non_tensor_fields or ())]
    missing = [n for n in chosen if n not in ref.field_index]
    if missing:
        raise KeyError(f"unknown DataProto fields: {missing}")
    return chosen


@dataclass(frozen=True)
class Rows:
    """A row selection: a slice (``cut``) or explicit indices; ``count`` rows result."""

    count: int
    cut: StructuredMemberSlice | None = None
    indices: tuple[int, ...] | None = None


def choose_rows(rows: Any, total: int) -> Rows | None:
    if rows is None:
        return None
    if isinstance(rows, StructuredMemberSlice):
        if rows.axis != 0:
            raise ValueError("DataProto row slicing currently supports axis=0 only")
        return Rows(len(range(*rows.bounds(total))), cut=rows)
    if isinstance(rows, slice):
        start, end, step = rows.indices(total)
        if step <= 0:
            raise ValueError("DataProto row slicing step must be positive")
        return Rows(len(range(start, end, step)), cut=StructuredMemberSlice(0, start, end, step))
    if isinstance(rows, Sequence) and not isinstance(rows, str | bytes | bytearray):
        picked = tuple(_row_index(i, total) for i in rows)
        return Rows(len(picked), indices=picked)
    raise TypeError("DataProto rows must be a slice, StructuredMemberSlice, or row index sequence")


def _row_index(index: Any, total: int) -> int:
    if isinstance(index, bool) or not isinstance(index, int | np.integer):
        raise TypeError("DataProto row indices must be integers")
    i = int(index) + (total if int(index) < 0 else 0)
    if not 0 <= i < total:
        raise IndexError(f"DataProto row index {index} out of range for {total} rows")
    return i


def select_meta(meta: Mapping[str, Any], keys: Sequence[str] | None) -> dict[str, Any]:
    return dict(meta) if keys is None else {k: meta[k] for k in keys if k in meta}
