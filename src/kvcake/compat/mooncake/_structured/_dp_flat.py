"""Flat dicts as DataProtos (``put(type="dict")`` / ``get(type="dict")``): values with the common
leading dimension go to ``batch`` (dense arrays and tensors) or ``non_tensor_batch`` (object
arrays and other sequences); everything else is ``meta_info``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured import _dp_codecs as C
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


def flat_to_envelope(data: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(data, Mapping):
        raise TypeError("flat dict payload must be a mapping")
    rows = _rows(data)
    out: dict[str, dict[str, Any]] = {"batch": {}, "non_tensor_batch": {}, "meta_info": {}}
    for key, value in data.items():
        if rows and _dense(value) and len(value) == rows:
            out["batch"][key] = value
        elif rows and _sequence(value) and len(value) == rows:
            array = value if isinstance(value, np.ndarray) else C.object_array(list(value))
            out["non_tensor_batch"][key] = array
        else:
            out["meta_info"][key] = value
    return out


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
