"""Codecs for object-dtype ``non_tensor_batch`` fields. Every codec stores one byte string per row
as a ragged layout (``data`` bytes, ``offsets`` int64, ``nulls`` bool) next to the DataProto's
other members:

- ``typed_ragged`` (numeric ndarray rows, or numeric list / tuple rows: ``_dp_typed``),
- ``media_bytes`` (PIL image rows), ``media_list_ragged`` (rows that are lists of PIL images or
  bytes: ``_dp_media``),
- ``utf8_ragged`` (str rows), ``bytes_ragged`` (bytes-like rows), ``ragged_tensor`` (torch
  tensor rows, each in Mooncake's stored-tensor layout),
- ``msgpack_ragged`` (dicts, lists, scalars: msgpack via msgspec; numpy values become plain
  numbers and lists),
- ``structured_recursive`` (containers holding tensors, arrays or bytes at any depth: the row's
  skeleton in msgpack with each tensor an extension referring to a stored tensor; ``rows.missing``
  marks null rows). ``None`` rows stay ``None``; dict keys that are absent stay absent.

Only a ``FieldSchema`` hint (``_dp_schema``) picks ``json_ragged`` (rows as JSON) or ``ndarray``
(numeric scalar rows: ``data`` in the hinted dtype plus ``nulls``); both decode here."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from kvcake.compat.mooncake._structured import _dp_media as media
from kvcake.compat.mooncake._structured import _dp_typed as typed
from kvcake.compat.mooncake._structured import _tensorio as tio
from kvcake.compat.mooncake._structured._dp_infer import is_media_list, is_pil_image

_TENSOR_EXT = 1


@dataclass(frozen=True)
class Encoded:
    codec: str
    rows: int
    metadata: dict[str, Any]
    payload: dict[str, np.ndarray]


def ragged(blobs: list[bytes | None]) -> dict[str, np.ndarray]:
    sizes = [0 if b is None else len(b) for b in blobs]
    data = np.frombuffer(b"".join(b for b in blobs if b is not None), dtype=np.uint8)
    return {
        "data": data.copy(),
        "offsets": np.cumsum([0, *sizes], dtype=np.int64),
        "nulls": np.asarray([b is None for b in blobs], dtype=np.bool_),
    }


def unragged(payload: Mapping[str, Any], prefix: str = "") -> list[bytes | None]:
    data = bytes(memoryview(payload[f"{prefix}data"]).cast("B"))
    offsets = np.asarray(payload[f"{prefix}offsets"]).tolist()
    nulls = np.asarray(payload[f"{prefix}nulls"]).tolist()
    return [
        None if n else data[a:b] for a, b, n in zip(offsets[:-1], offsets[1:], nulls, strict=True)
    ]


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__}")


PLAIN = msgspec.msgpack.Encoder(enc_hook=_plain)


def _is_bytes(v: Any) -> bool:
    return isinstance(v, bytes | bytearray | memoryview)


def _has_special_leaf(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(_has_special_leaf(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_special_leaf(v) for v in value)
    return tio.is_tensor(value) or isinstance(value, np.ndarray) or _is_bytes(value)


def _has_tensor(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(_has_tensor(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_tensor(v) for v in value)
    return tio.is_tensor(value)


def choose(values: list[Any]) -> str:
    rows = [v for v in values if v is not None]
    if not rows:
        return "msgpack_ragged"
    if all(tio.is_tensor(v) for v in rows):
        return "ragged_tensor"
    if all(is_media_list(v) for v in rows):
        return "media_list_ragged"
    if all(is_pil_image(v) for v in rows):
        return "media_bytes"
    if typed.accepts(rows) and not any(_has_tensor(v) for v in rows):
        return "typed_ragged"
    containers = all(isinstance(v, Mapping | list | tuple) for v in rows)
    if containers and any(_has_special_leaf(v) for v in rows):
        return "structured_recursive"
    if all(isinstance(v, str) for v in rows):
        return "utf8_ragged"
    if all(_is_bytes(v) for v in rows):
        return "bytes_ragged"
    return "msgpack_ragged"


def encode(path: str, array: np.ndarray) -> Encoded:
    values = list(array)
    codec = choose(values)
    try:
        if codec == "structured_recursive":
            return _encode_recursive(path, values)
        if codec in _CODERS:
            payload, metadata = _CODERS[codec][0](values)
            return Encoded(codec, len(values), metadata, payload)
        blobs = [None if v is None else _ROW_ENCODERS[codec](v) for v in values]
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"unsupported structured non-tensor field {path}: {exc}") from exc
    return Encoded(codec, len(values), {}, ragged(blobs))


_Coded = tuple[dict[str, np.ndarray], dict[str, Any]]
_CODERS: dict[str, tuple[Callable[[list[Any]], _Coded], Callable[..., list[Any]]]] = {
    "typed_ragged": (typed.encode, typed.decode),
    "media_bytes": (media.encode_bytes, media.decode_bytes),
    "media_list_ragged": (media.encode_lists, media.decode_lists),
}
_ROW_ENCODERS: dict[str, Callable[[Any], bytes]] = {
    "ragged_tensor": tio.serialize,
    "utf8_ragged": lambda v: v.encode(),
    "bytes_ragged": lambda v: bytes(v),
    "msgpack_ragged": PLAIN.encode,
}
_ROW_DECODERS: dict[str, Callable[[bytes], Any]] = {
    "ragged_tensor": tio.deserialize,
    "utf8_ragged": lambda b: b.decode(),
    "bytes_ragged": bytes,
    "msgpack_ragged": msgspec.msgpack.decode,
    "json_ragged": json.loads,
}


def decode(encoded: Mapping[str, Any], payload: Mapping[str, Any]) -> list[Any]:
    codec = encoded["codec"]
    if codec == "structured_recursive":
        return _decode_recursive(payload)
    if codec in _CODERS:
        return _CODERS[codec][1](payload, encoded.get("metadata") or {})
    if codec == "ndarray":
        nulls = np.asarray(payload["nulls"]).tolist()
        data = np.asarray(payload["data"]).tolist()
        return [None if n else v for v, n in zip(data, nulls, strict=True)]
    if codec not in _ROW_DECODERS:
        raise ValueError(f"unsupported structured non-tensor codec: {codec!r}")
    decode_row = _ROW_DECODERS[codec]
    return [None if b is None else decode_row(b) for b in unragged(payload)]


def _encode_recursive(path: str, values: list[Any]) -> Encoded:
    tensors: list[bytes] = []

    def hook(value: Any) -> Any:
        if tio.is_tensor(value):
            tensors.append(tio.serialize(value))
            return msgspec.msgpack.Ext(_TENSOR_EXT, struct.pack("<q", len(tensors) - 1))
        return _plain(value)

    encoder = msgspec.msgpack.Encoder(enc_hook=hook)
    rows = [None if v is None else encoder.encode(v) for v in values]
    payload = {f"skeleton.{k}": v for k, v in ragged(rows).items()}
    payload.update({f"tensors.{k}": v for k, v in ragged(list(tensors)).items()})
    payload["rows.missing"] = np.asarray([v is None for v in values], dtype=np.bool_)
    nodes: dict[str, str] = {}
    leaves: dict[str, str] = {}
    for v in values:
        _describe(v, "$", nodes, leaves)
    metadata = {
        "schema_source": "inferred_from_runtime_values",
        "structure_version": 1,
        "root_path": path,
        "nodes": [{"path": p, "node_type": t} for p, t in nodes.items()],
        "leaves": [{"path": p, "kind": k} for p, k in leaves.items()],
    }
    return Encoded("structured_recursive", len(values), metadata, payload)


def _decode_recursive(payload: Mapping[str, Any]) -> list[Any]:
    tensors = unragged(payload, "tensors.")

    def hook(code: int, data: memoryview) -> Any:
        if code != _TENSOR_EXT:
            raise ValueError(f"unknown msgpack extension {code}")
        blob = tensors[struct.unpack("<q", data)[0]]
        return tio.deserialize(blob)

    decoder = msgspec.msgpack.Decoder(ext_hook=hook)
    return [None if b is None else decoder.decode(b) for b in unragged(payload, "skeleton.")]


def _describe(value: Any, path: str, nodes: dict[str, str], leaves: dict[str, str]) -> None:
    if value is None:
        return
    if isinstance(value, Mapping):
        nodes.setdefault(path, "dict")
        for key, item in value.items():
            _describe(item, f"{path}.{key}", nodes, leaves)
    elif isinstance(value, list | tuple):
        nodes.setdefault(path, "list")
        for item in value:
            _describe(item, f"{path}[]", nodes, leaves)
    else:
        kind = "tensor" if tio.is_tensor(value) else type(value).__name__
        leaves.setdefault(path, kind)


def object_array(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out
