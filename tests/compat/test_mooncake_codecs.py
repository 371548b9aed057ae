"""kvcake's DataProto non-tensor codecs beyond the basic ones: ``typed_ragged`` (numeric rows),
``json_ragged`` and ``FieldSchema`` hints, checked against what Mooncake's wheel returns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcake.compat.mooncake._structured import _dp_codecs as C
from kvcake.compat.mooncake.structured_object_store import MooncakeBundleTransfer
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
