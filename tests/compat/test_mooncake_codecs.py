"""kvcake's DataProto non-tensor codecs beyond the basic ones: ``typed_ragged`` (numeric rows),
``json_ragged`` and ``FieldSchema`` hints, checked against what Mooncake's wheel returns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcake.compat.mooncake._structured import _dp_codecs as C
from kvcake.compat.mooncake.structured_object_store import FieldSchema, MooncakeBundleTransfer
from tests.compat.structured_store import MemStore


def obj(values: list[Any]) -> np.ndarray:
    return C.object_array(values)


def roundtrip(field: list[Any], **kwargs: Any) -> tuple[str, list[Any]]:
    tr = MooncakeBundleTransfer(MemStore(), key_prefix="dp", default_chunk_bytes=64)
    data = {"batch": {}, "non_tensor_batch": {"f": obj(field)}, "meta_info": {}}
    ref = tr.put_dataproto(data, namespace="ns", partition="p", stage="s", **kwargs)
    got = tr.get_dataproto(ref)["non_tensor_batch"]["f"]
    return ref.encoded_non_tensor["f"]["codec"], got.tolist()


def test_typed_ragged_ndarray_rows_keep_shape_and_take_the_common_dtype() -> None:
    rows = [np.arange(3, dtype=np.int32), np.ones((2, 2), np.float32), None, np.array(7)]
    codec, got = roundtrip(rows)
    assert codec == "typed_ragged"
    assert [None if g is None else (g.dtype, g.shape) for g in got] == [
        (np.float64, (3,)),
        (np.float64, (2, 2)),
        None,
        (np.float64, ()),
    ]
    assert all(np.array_equal(g, r) for g, r in zip(got, rows, strict=True) if r is not None)


def test_typed_ragged_list_rows_come_back_as_lists() -> None:
    assert roundtrip([[1, 2, 3], (4.5,), None, []]) == (
        "typed_ragged",
        [[1.0, 2.0, 3.0], [4.5], None, []],
    )
    assert roundtrip([[[1, 2], [3, 4]], [[5, 6]]]) == (
        "typed_ragged",
        [[[1, 2], [3, 4]], [[5, 6]]],
    )
    assert roundtrip([[1, 2], [3]]) == ("typed_ragged", [[1, 2], [3]])


def test_rows_typed_ragged_does_not_take() -> None:
    # jagged nesting, bools, strings and ndarray/list mixes go to msgpack_ragged
    for rows in ([[[1, 2], [3]]], [[True, False]], [["a"]], [np.arange(2), [1]]):
        assert roundtrip(rows)[0] == "msgpack_ragged", rows
    assert roundtrip([[np.arange(2)], [np.arange(1)]])[1] == [[[0, 1]], [[0]]]


def test_typed_ragged_rows_and_slices_read_back() -> None:
    tr = MooncakeBundleTransfer(MemStore(), key_prefix="dp", default_chunk_bytes=16)
    rows = [np.arange(i, dtype=np.int16) for i in range(6)]
    data = {"batch": {}, "non_tensor_batch": {"f": obj(rows)}, "meta_info": {}}
    ref = tr.put_dataproto(data, namespace="ns", partition="p", stage="s")
    got = tr.get_dataproto(ref, rows=[5, 0, 5])["non_tensor_batch"]["f"]
    assert [g.tolist() for g in got] == [[0, 1, 2, 3, 4], [], [0, 1, 2, 3, 4]]
    assert got[0].dtype == np.int16


def test_typed_ragged_decode_checks_its_codec() -> None:
    with pytest.raises(ValueError, match="unsupported structured non-tensor codec"):
        C.decode({"codec": "nope", "metadata": {}}, {})


def test_field_schema_codecs_roundtrip() -> None:
    cases: list[tuple[FieldSchema, list[Any], str, list[Any]]] = [
        (
            FieldSchema("json_ragged"),
            [{"a": 1, "t": (1, 2)}, {1: "x"}, None, "s", 2.5, True, float("nan")],
            "json_ragged",
            [{"a": 1, "t": [1, 2]}, {"1": "x"}, None, "s", 2.5, True],
        ),
        (FieldSchema("json_ragged"), [None, None], "json_ragged", [None, None]),
        (
            FieldSchema("ndarray", metadata={"dtype": "int32"}),
            [1, 2, None],
            "ndarray",
            [1, 2, None],
        ),
        (FieldSchema("ndarray"), [1, 2, None], "msgpack_ragged", [1, 2, None]),
        (
            FieldSchema("typed_ragged", metadata={"dtype": "float32"}),
            [[1, 2], [3], None],
            "typed_ragged",
            [[1.0, 2.0], [3.0], None],
        ),
        (
            FieldSchema("typed_ragged"),
            [[True], [False, True]],
            "typed_ragged",
            [[True], [False, True]],
        ),
        (FieldSchema("utf8_ragged"), ["a", None], "utf8_ragged", ["a", None]),
        (FieldSchema("bytes_ragged"), [b"a", bytearray(b"b")], "bytes_ragged", [b"a", b"b"]),
        (FieldSchema("msgpack_ragged"), [{"a": b"x"}, 1], "msgpack_ragged", [{"a": b"x"}, 1]),
        (FieldSchema("auto"), [[1, 2], [3]], "typed_ragged", [[1, 2], [3]]),
    ]
    for schema, rows, codec, want in cases:
        got_codec, got = roundtrip(rows, field_schemas={"f": schema})
        assert got_codec == codec, schema
        if schema.codec == "json_ragged" and len(rows) > 2:
            assert got[:-1] == want and np.isnan(got[-1])
        else:
            assert got == want, schema


def test_field_schema_typed_ragged_keeps_each_rows_kind_and_takes_plain_arrays() -> None:
    codec, got = roundtrip([np.arange(2), [3]], field_schemas={"f": FieldSchema("typed_ragged")})
    assert codec == "typed_ragged" and isinstance(got[0], np.ndarray) and got[1] == [3]
    tr = MooncakeBundleTransfer(MemStore(), key_prefix="dp")
    data = {"batch": {}, "non_tensor_batch": {"f": np.arange(3)}, "meta_info": {}}
    ref = tr.put_dataproto(data, field_schemas={"f": FieldSchema("typed_ragged")})
    assert tr.get_dataproto(ref)["non_tensor_batch"]["f"].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("schema", "rows", "error", "match"),
    [
        (FieldSchema("json_ragged"), [b"x"], TypeError, "not JSON serializable"),
        (FieldSchema("json_ragged", nullable=False), ["a", None], ValueError, "not nullable"),
        (FieldSchema("auto", nullable=False), ["a", None], ValueError, "not nullable"),
        (FieldSchema("utf8_ragged"), ["a", 1], AttributeError, "encode"),
        (FieldSchema("bytes_ragged"), [b"a", "b"], TypeError, "bytes-like"),
        (FieldSchema("ndarray", metadata={"dtype": "str"}), [1], ValueError, "numeric or bool"),
        (
            FieldSchema("ndarray", metadata={"dtype": "nope"}),
            [1],
            ValueError,
            "invalid FieldSchema",
        ),
        (FieldSchema("typed_ragged"), [["a"]], ValueError, "numeric rows"),
        (FieldSchema("ragged_tensor"), [[1]], TypeError, "torch.Tensor rows"),
        (FieldSchema("ragged_tensor_dict"), [{}], ValueError, "not supported by kvcake"),
        (FieldSchema("media_bytes"), ["x"], TypeError, "PIL images or bytes-like"),
        (FieldSchema("media_list_ragged"), [b"x"], TypeError, "rows must be lists"),
        (FieldSchema("nope"), ["a"], ValueError, "unsupported schema codec: 'nope'"),
    ],
)
def test_field_schema_errors_name_the_field_and_codec(
    schema: FieldSchema, rows: list[Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        roundtrip(rows, field_schemas={"f": schema})
    assert f"non_tensor_batch field 'f' with FieldSchema codec {schema.codec!r}" in str(info.value)


def test_field_schema_sections_are_checked_and_pin_flat_dict_fields() -> None:
    tr = MooncakeBundleTransfer(MemStore(), key_prefix="dp")
    data = {"batch": {"x": np.zeros(2)}, "non_tensor_batch": {"t": obj(["a", "b"])}}
    pin = {"x": FieldSchema("auto", metadata={"section": "non_tensor_batch"})}
    with pytest.raises(ValueError, match="declares section 'non_tensor_batch'.*'batch'"):
        tr.put_dataproto(data, field_schemas=pin)
    bad = {"t": FieldSchema("auto", metadata={"section": "rows"})}
    with pytest.raises(ValueError, match=r"metadata\['section'\] must be one of"):
        tr.put_dataproto(data, field_schemas=bad)
    with pytest.raises(TypeError, match="ndarray or non-string sequence"):
        tr.put_dataproto(
            {"non_tensor_batch": {"t": "ab"}}, field_schemas={"t": FieldSchema("json_ragged")}
        )
    flat = {"ids": np.arange(3), "tags": ["a", "b", "c"], "steps": [1, 2], "labels": [1, 2, 3]}
    schemas = {
        "tags": FieldSchema("json_ragged", metadata={"section": "non_tensor_batch"}),
        "steps": FieldSchema("auto", metadata={"section": "meta_info"}),
    }
    ref = tr.put(flat, type="dict", field_schemas=schemas)
    assert ref.encoded_non_tensor["tags"]["codec"] == "json_ragged"
    assert ref.meta_info == {"steps": [1, 2], "labels": [1, 2, 3]}
    got = tr.get(ref, type="dict")
    assert got["tags"] == ["a", "b", "c"] and got["ids"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="inconsistent batch sizes"):
        tr.put(
            {"a": [1], "b": [1, 2]},
            type="dict",
            field_schemas={
                "a": FieldSchema("auto", metadata={"section": "non_tensor_batch"}),
                "b": FieldSchema("auto", metadata={"section": "batch"}),
            },
        )


def test_append_takes_field_schemas() -> None:
    tr = MooncakeBundleTransfer(MemStore(), key_prefix="dp")
    ref = tr.put_dataproto({"batch": {"x": np.zeros(2)}})
    ref = tr.append_dataproto_fields(
        ref,
        {"non_tensor_batch": {"j": obj([{"a": 1}, None])}},
        stage="s2",
        field_schemas={"j": FieldSchema("json_ragged", nullable=True)},
    )
    assert ref.encoded_non_tensor["j"]["codec"] == "json_ragged"
    assert tr.get_dataproto(ref)["non_tensor_batch"]["j"].tolist() == [{"a": 1}, None]
