"""Encoding a structured object's members. Each member gets a field spec (kept in the object's
metadata under ``__mooncake_structured_fields__``) and a payload: ``ndarray`` members store their
C-contiguous bytes with dtype and shape, torch tensors (nested ones too: ``_nested``) are
``torch_tensor`` members, anything
else bytes-like is a ``bytes`` member."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured import _nested as nested
from kvcake.compat.mooncake._structured import _tensorio as tio
from kvcake.compat.mooncake._structured._manifest import check_segment
from kvcake.compat.mooncake._structured._types import TensorObjectBuffer

FIELD_SPECS_KEY = "__mooncake_structured_fields__"


@dataclass(frozen=True)
class TensorPayload:
    tensor: Any


@dataclass(frozen=True)
class BytesPayload:
    view: memoryview
    in_place: bool  # the caller's own memory (not a copy made while encoding)


Payload = BytesPayload | TensorPayload | TensorObjectBuffer


def bytes_view(value: Any, name: str) -> BytesPayload:
    try:
        view = memoryview(value)
    except TypeError as exc:
        raise TypeError(f"{name} must be bytes-like, got {type(value).__name__}") from exc
    if not view.c_contiguous:
        return BytesPayload(memoryview(view.tobytes()), False)
    return BytesPayload(view.cast("B"), not view.readonly)


def encode_member(value: Any) -> tuple[dict[str, Any], Payload]:
    if isinstance(value, TensorObjectBuffer):
        return {"encoding": "torch_tensor"}, value
    if tio.is_tensor(value):
        if value.is_nested:
            spec, blob = nested.encode(value)
            return spec, BytesPayload(memoryview(blob), False)
        spec = {"encoding": "torch_tensor", "dtype": str(value.dtype), "shape": list(value.shape)}
        return {**spec, "element_size": int(value.element_size())}, TensorPayload(value)
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        spec = {"encoding": "ndarray", "dtype": array.dtype.str, "shape": list(array.shape)}
        flat = array.view(np.uint8).reshape(-1)
        own = array.ctypes.data == value.ctypes.data and array.nbytes == value.nbytes
        in_place = own and bool(array.flags.writeable)
        return spec, BytesPayload(flat.data, in_place)
    return {"encoding": "bytes"}, bytes_view(value, "structured buffer")


def normalize_metadata(metadata: Any) -> dict[str, Any]:
    if not isinstance(metadata, Mapping):
        raise TypeError("structured metadata must be a mapping")
    out = dict(metadata)
    if FIELD_SPECS_KEY in out:
        raise ValueError(f"structured metadata key {FIELD_SPECS_KEY!r} is reserved")
    if not isinstance(out.get("layout", "structured"), str):
        raise ValueError("structured metadata layout must be a string")
    out.setdefault("layout", "structured")
    return out


def encode_object(
    metadata: Any, members: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Payload]]:
    """(metadata with the field specs, payload per member)."""
    meta = normalize_metadata(metadata)
    specs, payloads = {}, {}
    for name, value in members.items():
        check_segment(name, "buffer name")
        specs[name], payloads[name] = encode_member(value)
    if specs:
        meta[FIELD_SPECS_KEY] = specs
    return meta, payloads


def field_specs(metadata: Mapping[str, Any]) -> dict[str, Any]:
    specs = metadata.get(FIELD_SPECS_KEY, {})
    if not isinstance(specs, dict):
        raise ValueError("structured field specs must be a dict")
    return specs


def check_pre_registered(
    names: Mapping[str, bool] | None, payloads: Mapping[str, Payload]
) -> set[str]:
    """The members the caller registered; each must be stored from its own memory."""
    chosen = {n for n, on in (names or {}).items() if on}
    unknown = sorted(chosen - set(payloads))
    if unknown:
        raise ValueError(f"unknown pre-registered structured buffers: {unknown}")
    for name in sorted(chosen):
        payload = payloads[name]
        if not isinstance(payload, BytesPayload) or not payload.in_place:
            raise ValueError(
                f"pre-registered structured buffer {name!r} must be a writable C-contiguous "
                "array or buffer stored in place (this one would be copied)"
            )
    return chosen
