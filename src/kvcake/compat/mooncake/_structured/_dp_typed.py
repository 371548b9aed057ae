"""The ``typed_ragged`` codec: rows of numbers (numeric ndarrays, or lists / tuples numpy turns
into a numeric array) stored as one flat array of the rows' common dtype, with per-row offsets,
shapes, ranks and nulls. ndarray rows come back as ndarrays (their shape, the common dtype),
list rows as lists; a field mixing the two keeps each row's kind."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

_SCALARS = (bool, int, float, complex, np.generic)


def numeric_array(value: Any, kinds: str = "iufc") -> np.ndarray | None:
    """``value`` as an array of one of ``kinds`` (default numeric, not bool), else ``None``;
    with ``"b"`` in ``kinds`` (a ``FieldSchema`` hint) scalars are taken too."""
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, list | tuple) or ("b" in kinds and isinstance(value, _SCALARS)):
        try:
            array = np.asarray(value)
        except (TypeError, ValueError, OverflowError):
            return None
    else:
        return None
    return array if array.dtype.kind in kinds else None


def accepts(rows: list[Any]) -> bool:
    """All rows ndarrays, or all lists / tuples, each numeric (the wheel's choice)."""
    if not rows:
        return False
    arrays = all(isinstance(v, np.ndarray) for v in rows)
    if not arrays and not all(isinstance(v, list | tuple) for v in rows):
        return False
    return all(numeric_array(v) is not None for v in rows)


def encode(
    values: list[Any], dtype: np.dtype | None = None, kinds: str = "iufc"
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    arrays = [None if v is None else _as_array(v, kinds) for v in values]
    present = [a for a in arrays if a is not None]
    if dtype is None:
        dtype = np.result_type(*present) if present else np.dtype(np.float64)
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise ValueError("typed_ragged codec requires non-object dtype")
    max_ndim = max((a.ndim for a in present), default=0)
    shapes = np.zeros((len(values), max(max_ndim, 1)), dtype=np.int64)
    for row, array in enumerate(arrays):
        if array is not None and array.ndim:
            shapes[row, : array.ndim] = array.shape
    flats = [a.astype(dtype, copy=False).reshape(-1) for a in present]
    sizes = [0 if a is None else a.size for a in arrays]
    is_array = [isinstance(v, np.ndarray) for v in values]
    payload = {
        "data": np.concatenate(flats) if flats else np.zeros(0, dtype=dtype),
        "offsets": np.cumsum([0, *sizes], dtype=np.int64),
        "shapes": shapes,
        "ndims": np.asarray([0 if a is None else a.ndim for a in arrays], dtype=np.int16),
        "nulls": np.asarray([v is None for v in values], dtype=np.bool_),
    }
    metadata = {"dtype": str(dtype), "max_ndim": int(max_ndim), "shape_policy": "ragged"}
    metadata.update(_row_format(values, is_array))
    return payload, metadata


def _as_array(value: Any, kinds: str) -> np.ndarray:
    array = numeric_array(value, kinds)
    if array is None:
        raise ValueError(f"typed_ragged codec requires numeric rows, got {type(value).__name__}")
    return array


def _row_format(values: list[Any], is_array: list[bool]) -> dict[str, Any]:
    present = [flag for v, flag in zip(values, is_array, strict=True) if v is not None]
    if all(present):
        return {"row_format": "ndarray", "ndarray_rows": None}
    if any(present):
        return {"row_format": "mixed", "ndarray_rows": is_array}
    return {"row_format": "list", "ndarray_rows": None}


def decode(payload: Mapping[str, Any], metadata: Mapping[str, Any]) -> list[Any]:
    dtype = np.dtype(metadata.get("dtype", "float64"))
    data = np.asarray(payload["data"])
    if data.dtype != dtype:
        data = np.frombuffer(data.tobytes(), dtype=dtype)
    offsets = np.asarray(payload["offsets"]).tolist()
    shapes = np.asarray(payload["shapes"]).tolist()
    ndims = np.asarray(payload["ndims"]).tolist()
    nulls = np.asarray(payload["nulls"]).tolist()
    fmt = metadata.get("row_format", "list")
    flags = metadata.get("ndarray_rows") or [fmt == "ndarray"] * len(nulls)
    out: list[Any] = []
    for row, null in enumerate(nulls):
        if null:
            out.append(None)
            continue
        shape = tuple(shapes[row][: ndims[row]])
        array = data[offsets[row] : offsets[row + 1]].reshape(shape).copy()
        out.append(array if flags[row] else array.tolist())
    return out
