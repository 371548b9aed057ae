"""Flat dicts as DataProtos (``put(type="dict")`` / ``get(type="dict")``): values with the common
leading dimension go to ``batch`` (dense arrays and tensors) or ``non_tensor_batch`` (object
arrays and other sequences); everything else is ``meta_info``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured import _dp_codecs as C
from kvcake.compat.mooncake._structured import _dp_schema as SC
from kvcake.compat.mooncake._structured import _tensorio as tio


def _dense(value: Any) -> bool:
    if tio.is_tensor(value):
        return bool(value.ndim > 0)
    return isinstance(value, np.ndarray) and value.dtype != object and value.ndim > 0


def _sequence(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim > 0
    return isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray)


def _rows(data: Mapping[str, Any]) -> int:
    for kind, test in (("dense fields", _dense), ("fields", _sequence)):
        sizes = {len(v) for v in data.values() if test(v)}
        if len(sizes) > 1:
            raise ValueError(f"flat dict {kind} have ambiguous batch sizes: {sorted(sizes)}")
        if sizes:
            return sizes.pop()
    return 0


def flat_to_envelope(
    data: Any, schemas: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """``FieldSchema`` hints with ``metadata["section"]`` pin fields to sections; the pinned
    row-aligned fields then give the row count (and unpinned sequences go to ``meta_info``)."""
    if not isinstance(data, Mapping):
        raise TypeError("flat dict payload must be a mapping")
    schemas = schemas or {}
    pinned = {k: SC.section(k, v) for k, v in schemas.items() if k in data}
    rows = _schema_rows(data, pinned)
    by_schema = rows > 0
    if not by_schema:
        rows = _rows({k: v for k, v in data.items() if pinned.get(k) != "meta_info"})
    out: dict[str, dict[str, Any]] = {"batch": {}, "non_tensor_batch": {}, "meta_info": {}}
    for key, value in data.items():
        where = pinned.get(key) or _auto_section(value, rows, by_schema)
        if where == "non_tensor_batch":
            value = _non_tensor(key, value, rows, schemas.get(key))
        out[where][key] = value
    return out


def _auto_section(value: Any, rows: int, by_schema: bool) -> str:
    if rows and _dense(value) and len(value) == rows:
        return "batch"
    if rows and not by_schema and _sequence(value) and len(value) == rows:
        return "non_tensor_batch"
    return "meta_info"


def _schema_rows(data: Mapping[str, Any], pinned: Mapping[str, str | None]) -> int:
    sizes = set()
    for key, where in pinned.items():
        if where in ("batch", "non_tensor_batch"):
            try:
                sizes.add(len(data[key]))
            except TypeError as exc:
                raise ValueError(f"flat dict row-aligned field {key!r} must be sized") from exc
    if len(sizes) > 1:
        raise ValueError(f"flat dict fields have inconsistent batch sizes: {sorted(sizes)}")
    return sizes.pop() if sizes else 0


def _non_tensor(key: str, value: Any, rows: int, schema: Any) -> np.ndarray:
    if not _sequence(value):
        raise TypeError(
            f"flat dict non_tensor_batch field {key!r} must be an ndarray or non-string sequence"
        )
    if len(value) != rows:
        raise ValueError(
            f"flat dict non_tensor_batch field {key!r} has batch size {len(value)}, expected {rows}"
        )
    if not isinstance(value, np.ndarray):
        return C.object_array(list(value))
    dtype = None if schema is None or schema.codec != "ndarray" else SC.ndarray_dtype(schema)
    if dtype is not None and (value.dtype != object or all(v is not None for v in value)):
        return np.asarray(value, dtype=dtype)
    return value


def to_flat(
    batch: dict[str, Any], non_tensor: dict[str, Any], meta: dict[str, Any]
) -> dict[str, Any]:
    clash = (
        (set(meta) & set(batch)) | (set(meta) & set(non_tensor)) | (set(batch) & set(non_tensor))
    )
    if clash:
        raise ValueError(f"Duplicate keys found across DataProto sections: {sorted(clash)}")
    out = {**meta, **batch}
    for key, value in non_tensor.items():
        is_objects = isinstance(value, np.ndarray) and value.dtype == object
        out[key] = value.tolist() if is_objects else value
    return out
