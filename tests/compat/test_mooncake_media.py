"""The ``media_bytes`` / ``media_list_ragged`` codecs: PIL images (and bytes) in DataProto
``non_tensor_batch`` fields round-trip as images with the same pixels, mode, size and format."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcake.compat.mooncake._structured import _dp_codecs as C
from kvcake.compat.mooncake.structured_object_store import FieldSchema, MooncakeBundleTransfer
from tests.compat.structured_store import MemStore

Image = pytest.importorskip("PIL.Image")


def image(mode: str, size: tuple[int, int], seed: int) -> Any:
    img = Image.new(mode, size)
    rng = np.random.default_rng(seed)
    img.putdata(
        [
            tuple(p) if len(p) > 1 else int(p[0])
            for p in rng.integers(0, 255, (size[0] * size[1], len(mode)))
        ]
    )
    return img


def roundtrip(field: list[Any], **kwargs: Any) -> tuple[str, list[Any]]:
    tr = MooncakeBundleTransfer(MemStore(), key_prefix="dp", default_chunk_bytes=32)
    data = {"batch": {}, "non_tensor_batch": {"f": C.object_array(field)}, "meta_info": {}}
    ref = tr.put_dataproto(data, **kwargs)
    got = tr.get_dataproto(ref)["non_tensor_batch"]["f"]
    return ref.encoded_non_tensor["f"]["codec"], got.tolist()


def same(a: Any, b: Any) -> bool:
    return (a.mode, a.size, a.format, a.tobytes()) == (b.mode, b.size, b.format, b.tobytes())


def test_image_rows_roundtrip_as_images() -> None:
    rows = [image("RGB", (3, 2), 1), None, image("L", (1, 4), 2)]
    rows[0].format = "PNG"
    codec, got = roundtrip(rows)
    assert codec == "media_bytes"
    assert got[1] is None and same(got[0], rows[0]) and same(got[2], rows[2])
    assert got[0].format == "PNG" and got[2].format is None


def test_lists_of_images_and_bytes_roundtrip() -> None:
    rows = [[image("RGB", (2, 2), 3), b"raw"], None, [], (bytearray(b"x"),)]
    codec, got = roundtrip(rows)
    assert codec == "media_list_ragged"
    assert same(got[0][0], rows[0][0]) and got[0][1] == b"raw"
    assert got[1:] == [None, [], [b"x"]]
    # lists of bytes only (or empty lists) are media lists too, as on the wheel
    assert roundtrip([[b"a"], [b"b", b""]]) == ("media_list_ragged", [[b"a"], [b"b", b""]])
    assert roundtrip([[], ()]) == ("media_list_ragged", [[], []])


def test_media_schemas_take_images_and_bytes() -> None:
    rows = [image("RGBA", (2, 1), 4), b"png?", None]
    codec, got = roundtrip(rows, field_schemas={"f": FieldSchema("media_bytes")})
    assert codec == "media_bytes" and same(got[0], rows[0]) and got[1:] == [b"png?", None]
    codec, got = roundtrip([[b"a"], None], field_schemas={"f": FieldSchema("media_list_ragged")})
    assert (codec, got) == ("media_list_ragged", [[b"a"], None])


def test_mixed_images_and_other_rows_are_refused_or_fall_back() -> None:
    with pytest.raises(ValueError, match="unsupported structured non-tensor field"):
        roundtrip([image("L", (1, 1), 5), "text"])
