"""The ``media_bytes`` and ``media_list_ragged`` codecs: rows that are PIL images (or bytes), and
rows that are lists of them. An image is stored as its raw pixels with its mode, size and format
(``media_encodings``, one per image) and comes back as a PIL image with the same pixels, mode,
size and ``format``; bytes-like items come back as ``bytes``. Pillow is needed only to decode
images (without it their raw pixels come back as ``bytes``, as on the wheel)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured._dp_infer import is_bytes, is_pil_image


def _item(value: Any) -> tuple[bytes, dict[str, Any]]:
    if is_bytes(value):
        return bytes(value), {"kind": "bytes"}
    if is_pil_image(value):
        meta = {"kind": "pil_raw", "mode": value.mode, "size": list(value.size)}
        return value.tobytes(), {**meta, "format": getattr(value, "format", None)}
    raise TypeError(
        f"media codecs take PIL images or bytes-like values, not {type(value).__name__}"
    )


def _image(data: bytes, encoding: Mapping[str, Any] | None) -> Any:
    if not encoding or encoding.get("kind") != "pil_raw":
        return data
    try:
        # lazy: optional dependency (Pillow)
        from PIL import Image
    except ImportError:
        return data
    image = Image.frombytes(encoding["mode"], tuple(encoding["size"]), data)
    image.format = encoding.get("format")
    return image


def _media_metadata(encodings: list[dict[str, Any]]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"media_encodings": encodings}
    if any(e["kind"] == "pil_raw" for e in encodings):
        metadata.update(media_types=["image/raw"], encode_source="raw_pixels_from_object")
    return metadata


Coded = tuple[dict[str, np.ndarray], dict[str, Any]]


def _bytes_array(blobs: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(blobs), dtype=np.uint8).copy()


def encode_bytes(values: list[Any]) -> Coded:
    """``media_bytes``: one image (or bytes) per row."""
    items = [(b"", {"kind": "null"}) if v is None else _item(v) for v in values]
    payload = {
        "data": _bytes_array([b for b, _ in items]),
        "offsets": np.cumsum([0, *(len(b) for b, _ in items)], dtype=np.int64),
        "nulls": np.asarray([v is None for v in values], dtype=np.bool_),
    }
    return payload, _media_metadata([e for _, e in items])


def encode_lists(values: list[Any]) -> Coded:
    """``media_list_ragged``: a list of images (or bytes) per row."""
    rows = [[] if v is None else [_item(i) for i in _as_list(v)] for v in values]
    flat = [item for row in rows for item in row]
    payload = {
        "data": _bytes_array([b for b, _ in flat]),
        "row_offsets": np.cumsum([0, *map(len, rows)], dtype=np.int64),
        "byte_offsets": np.cumsum([0, *(len(b) for b, _ in flat)], dtype=np.int64),
        "nulls": np.asarray([v is None for v in values], dtype=np.bool_),
    }
    return payload, _media_metadata([e for _, e in flat])


def _as_list(value: Any) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise TypeError(f"media_list_ragged rows must be lists, not {type(value).__name__}")
    return list(value)


def decode_bytes(payload: Mapping[str, Any], metadata: Mapping[str, Any]) -> list[Any]:
    encodings = metadata.get("media_encodings") or []
    data = np.ascontiguousarray(payload["data"]).tobytes()
    spans = np.asarray(payload["offsets"]).tolist()
    nulls = np.asarray(payload["nulls"]).tolist()
    return [
        None if null else _image(data[spans[i] : spans[i + 1]], _at(encodings, i))
        for i, null in enumerate(nulls)
    ]


def _at(encodings: list[Any], index: int) -> Any:
    return encodings[index] if index < len(encodings) else None


def decode_lists(payload: Mapping[str, Any], metadata: Mapping[str, Any]) -> list[Any]:
    encodings = metadata.get("media_encodings") or []
    data = np.ascontiguousarray(payload["data"]).tobytes()
    rows = np.asarray(payload["row_offsets"]).tolist()
    spans = np.asarray(payload["byte_offsets"]).tolist()
    out: list[Any] = []
    for row, null in enumerate(np.asarray(payload["nulls"]).tolist()):
        if null:
            out.append(None)
            continue
        items = range(rows[row], rows[row + 1])
        out.append([_image(data[spans[i] : spans[i + 1]], _at(encodings, i)) for i in items])
    return out
