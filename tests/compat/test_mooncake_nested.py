"""Nested (``torch.jagged``) tensors as structured members and DataProto batch fields: stored as
values / offsets / lengths parts (the wheel's ``tensor_parts`` layout), read whole, by row
slices and by row picks; destinations and other layouts are refused, as on the wheel."""

from __future__ import annotations

from typing import Any

import pytest

from kvcake.compat.mooncake._structured import _nested as nested
from kvcake.compat.mooncake.structured_object_store import (
    MooncakeBundleTransfer,
    StructuredObjectPayload,
    tensor_object_buffer,
)
from tests.compat.structured_store import MemStore

torch = pytest.importorskip("torch")


def rows(value: Any) -> list[Any]:
    return [t.tolist() for t in value.unbind()]


def jagged() -> Any:
    parts = [torch.arange(3.0), torch.arange(5.0) + 10, torch.zeros(0), torch.ones(2)]
    return torch.nested.nested_tensor(parts, layout=torch.jagged)


def test_nested_members_whole_and_sliced() -> None:
    tr = MooncakeBundleTransfer(MemStore(), key_prefix="n", default_chunk_bytes=128)
    nt = jagged()
    ref = tr.put_structured_object(StructuredObjectPayload(buffers={"nt": nt}))
    spec = tr.read_spec(ref)
    got = tr.materialize(spec).objects["nt"]
    assert got.is_nested and got.layout == torch.jagged and rows(got) == rows(nt)
    part = tr.materialize(spec.select_members(["nt"]).slice_member("nt", 0, 1, 4, 2)).objects
    assert rows(part["nt"]) == [rows(nt)[1], rows(nt)[3]]
    with pytest.raises(ValueError, match="axis=0 only"):
        tr.materialize(spec.select_members(["nt"]).slice_member("nt", 1, 0, 1))
    with pytest.raises(ValueError, match="does not support destinations"):
        tr.materialize_into(spec, {"nt": tensor_object_buffer(0, 1 << 10)})


def test_lengths_and_the_ragged_dim_survive() -> None:
    values, offsets = torch.arange(10.0).reshape(5, 2), torch.tensor([0, 2, 5])
    lengths = torch.tensor([1, 3])
    nt = torch.nested.nested_tensor_from_jagged(values, offsets=offsets, lengths=lengths)
    spec, blob = nested.encode(nt)
    assert spec["has_lengths"] and spec["nested"] and len(spec["part_bytes"]) == 3
    back = nested.decode(blob, spec)
    assert torch.equal(back.values(), values) and torch.equal(back.lengths(), lengths)


def test_strided_nested_and_bad_payloads_are_refused() -> None:
    strided = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    tr = MooncakeBundleTransfer(MemStore(), key_prefix="n")
    with pytest.raises(ValueError, match=r"require torch\.jagged layout"):
        tr.put_structured_object(StructuredObjectPayload(buffers={"nt": strided}))
    spec, blob = nested.encode(jagged())
    with pytest.raises(ValueError, match="truncated"):
        nested.decode(blob[:-1], spec)
    with pytest.raises(ValueError, match="trailing bytes"):
        nested.decode(blob + b"x", spec)
    with pytest.raises(ValueError, match="invalid part metadata"):
        nested.decode(blob, {**spec, "part_bytes": [1]})
    with pytest.raises(ValueError, match="unsupported nested tensor payload format"):
        nested.decode(blob, {**spec, "format": "torch_save"})


def test_dataproto_batch_with_a_nested_field() -> None:
    tr = MooncakeBundleTransfer(MemStore(), key_prefix="dp", default_chunk_bytes=64)
    nt = jagged()
    data = {"batch": {"nt": nt, "ids": torch.arange(4)}, "non_tensor_batch": {}, "meta_info": {}}
    ref = tr.put_dataproto(data)
    assert rows(tr.get_dataproto(ref)["batch"]["nt"]) == rows(nt)
    got = tr.get_dataproto(ref, rows=[3, 0, 3])["batch"]
    assert rows(got["nt"]) == [rows(nt)[i] for i in (3, 0, 3)] and got["ids"].tolist() == [3, 0, 3]
    assert rows(tr.get_dataproto(ref, rows=slice(1, 3))["batch"]["nt"]) == rows(nt)[1:3]
    assert tr.get_dataproto(ref, rows=[])["batch"]["nt"].size(0) == 0
    with pytest.raises(ValueError, match="does not support destinations"):
        tr.get_dataproto(ref, rows=[1], destinations={"nt": tensor_object_buffer(0, 64)})
