"""``FieldSchema`` hints for DataProto fields, as the wheel applies them: ``metadata["section"]``
pins a field to ``batch`` / ``non_tensor_batch`` / ``meta_info`` (checked against where the
data has it); a ``non_tensor_batch`` field's ``codec`` picks its codec instead of inference
(``auto`` = inference), ``nullable=False`` refuses ``None`` rows, and ``metadata["dtype"]`` is
the dtype of ``typed_ragged`` and ``ndarray`` fields. Hints for ``batch`` fields are not
used. The ``ragged_tensor_dict`` codec is not supported."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured import _dp_codecs as C
from kvcake.compat.mooncake._structured import _dp_media as media
from kvcake.compat.mooncake._structured import _dp_typed as typed
from kvcake.compat.mooncake._structured import _tensorio as tio

SECTIONS = ("batch", "meta_info", "non_tensor_batch")
LEFT_OUT = ("ragged_tensor_dict",)


def section(name: str, schema: Any) -> str | None:
    declared = schema.metadata.get("section")
    if declared is not None and declared not in SECTIONS:
        raise ValueError(
            f"FieldSchema for {name!r} metadata['section'] must be one of {list(SECTIONS)}"
        )
    return declared


def check_sections(sections: Mapping[str, Mapping[str, Any]], schemas: Mapping[str, Any]) -> None:
    """A field a hint pins to one section must not be in another."""
    for name, schema in schemas.items():
        declared = section(name, schema)
        actual = sorted(s for s, fields in sections.items() if name in fields)
        if declared is None or not actual or declared in actual:
            continue
        found = ", ".join(repr(s) for s in actual)
        raise ValueError(
            f"FieldSchema for {name!r} declares section {declared!r}, but data contains it in {found}"
        )


def for_non_tensor(schemas: Mapping[str, Any] | None, name: str) -> Any:
    schema = (schemas or {}).get(name)
    if schema is None or section(name, schema) not in (None, "non_tensor_batch"):
        return None
    return schema


def ndarray_dtype(schema: Any) -> np.dtype | None:
    name = schema.metadata.get("dtype")
    if name is None:
        return None
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid FieldSchema metadata['dtype']: {name!r}") from exc
    if dtype.kind not in "biufc":
        raise ValueError(f"FieldSchema metadata['dtype'] must be numeric or bool, got {dtype}")
    return dtype


def as_rows(name: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
        return C.object_array(list(value))
    raise TypeError(
        f"non_tensor_batch field {name!r} with FieldSchema must be an ndarray or non-string sequence"
    )


def encode(name: str, value: Any, schema: Any) -> C.Encoded | None:
    """The field encoded as ``schema`` says; ``None`` when inference decides (``auto``)."""
    try:
        rows = as_rows(name, value)
        values = list(rows)
        if not schema.nullable and any(v is None for v in values):
            raise ValueError(f"FieldSchema for 'non_tensor_batch.{name}' is not nullable")
        return _encode(schema, values)
    except (TypeError, ValueError, RuntimeError, AttributeError) as exc:
        raise type(exc)(
            f"failed to encode non_tensor_batch field {name!r} "
            f"with FieldSchema codec {schema.codec!r}: {exc}"
        ) from exc


def _encode(schema: Any, values: list[Any]) -> C.Encoded | None:
    codec = schema.codec
    if codec == "auto":
        return None
    if codec == "typed_ragged":
        payload, metadata = typed.encode(values, ndarray_dtype(schema), kinds="biufc")
        return C.Encoded(codec, len(values), metadata, payload)
    if codec in ("media_bytes", "media_list_ragged"):
        encoder = media.encode_bytes if codec == "media_bytes" else media.encode_lists
        payload, metadata = encoder(values)
        return C.Encoded(codec, len(values), metadata, payload)
    if codec == "ndarray":
        dtype = ndarray_dtype(schema)
        return None if dtype is None else _scalars(values, dtype)
    if codec in LEFT_OUT:
        raise ValueError(f"FieldSchema codec {codec!r} is not supported by kvcake")
    if codec not in _ROWS:
        raise ValueError(f"unsupported schema codec: {codec!r}")
    blobs = [None if v is None else _ROWS[codec](v) for v in values]
    return C.Encoded(codec, len(values), {"schema_source": "field_schema"}, C.ragged(blobs))


def _scalars(values: list[Any], dtype: np.dtype) -> C.Encoded:
    fill = False if dtype == np.bool_ else 0
    data = np.asarray([fill if v is None else v for v in values], dtype=dtype)
    nulls = np.asarray([v is None for v in values], dtype=np.bool_)
    metadata = {"dtype": str(data.dtype), "shape": list(data.shape)}
    return C.Encoded("ndarray", len(values), metadata, {"data": data, "nulls": nulls})


def _tensor(value: Any) -> bytes:
    if not tio.is_tensor(value):
        raise TypeError(
            f"ragged_tensor codec requires torch.Tensor rows, got {type(value).__name__}"
        )
    return tio.serialize(value)


def _bytes(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"bytes_ragged codec requires bytes-like rows, got {type(value).__name__}")
    return bytes(value)


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


_ROWS: dict[str, Callable[[Any], bytes]] = {
    "ragged_tensor": _tensor,
    "bytes_ragged": _bytes,
    "utf8_ragged": lambda v: v.encode("utf-8"),
    "msgpack_ragged": C.PLAIN.encode,
    "json_ragged": _json,
}
