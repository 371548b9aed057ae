"""kvcake's DataProto helpers (mooncake.structured_object_store) and mooncake.dataproto_catalog:
stages, appends, row reads, non-tensor codecs, ref handles, and the catalog's fragment
lifetimes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcake.compat.mooncake.dataproto_catalog import DataProtoCatalog, DataProtoCatalogTransfer
from kvcake.compat.mooncake.structured_object_store import (
    MooncakeBundleTransfer,
    export_dataproto_ref,
    import_dataproto_ref,
)
from tests.compat.structured_store import MemStore

RNG = np.random.default_rng(15)


def make() -> tuple[MemStore, MooncakeBundleTransfer]:
    s = MemStore()
    return s, MooncakeBundleTransfer(s, key_prefix="dp", default_chunk_bytes=64)


def obj(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def sample(rows: int = 6) -> dict[str, Any]:
    return {
        "batch": {"ids": np.arange(rows * 3).reshape(rows, 3), "p": RNG.random(rows)},
        "non_tensor_batch": {
            "text": obj(["", "b", None, "三", "d" * 40, "f"][:rows]),
            "blob": obj([b"x", bytearray(b"yz"), None, memoryview(b"w"), b"", b"v"][:rows]),
            "meta": obj([{"i": i, "l": [i, None]} if i % 2 else None for i in range(rows)]),
            "mixed": obj([{"a": np.arange(i), "b": b"q"} for i in range(rows)]),
        },
        "meta_info": {"step": 3},
    }


def test_fields_rows_and_codecs_roundtrip() -> None:
    store, tr = make()
    data = sample()
    ref = tr.put_dataproto(data, namespace="ns", partition="p", stage="roll")
    codecs = {n: e["codec"] for n, e in ref.encoded_non_tensor.items()}
    assert codecs == {
        "text": "utf8_ragged",
        "blob": "bytes_ragged",
        "meta": "msgpack_ragged",
        "mixed": "structured_recursive",
    }
    full = tr.get_dataproto(ref)
    assert np.array_equal(full["batch"]["ids"], data["batch"]["ids"])
    assert full["non_tensor_batch"]["text"].tolist() == data["non_tensor_batch"]["text"].tolist()
    assert full["non_tensor_batch"]["blob"].tolist() == [b"x", b"yz", None, b"w", b"", b"v"]
    assert full["non_tensor_batch"]["meta"].tolist() == data["non_tensor_batch"]["meta"].tolist()
    assert full["non_tensor_batch"]["mixed"][3] == {"a": [0, 1, 2], "b": b"q"}
    for rows in ([5, 0, 5, 2], slice(1, 6, 2), [], slice(4, 4)):
        got = tr.get_dataproto(ref, fields=["ids", "text"], rows=rows, meta_info_keys=[])
        want = np.arange(6)[rows].tolist()
        assert np.array_equal(got["batch"]["ids"], data["batch"]["ids"][want])
        assert got["non_tensor_batch"]["text"].tolist() == [
            data["non_tensor_batch"]["text"][i] for i in want
        ]
        assert got["meta_info"] == {}
    out = np.empty((2, 3), dtype=np.int64)
    assert (
        tr.get_dataproto(ref, batch_fields=["ids"], rows=[4, 1], destinations={"ids": out})[
            "batch"
        ]["ids"]
        is out
    )
    assert np.array_equal(out, data["batch"]["ids"][[4, 1]])
    tr.cleanup_dataproto(ref)
    assert store.objects == {}


def test_selection_errors() -> None:
    _, tr = make()
    ref = tr.put_dataproto(sample(4))
    for kwargs, exc, msg in [
        ({"fields": ["x"]}, KeyError, "unknown DataProto fields"),
        ({"fields": ["ids"], "batch_fields": ["p"]}, ValueError, "combined"),
        ({"rows": [4]}, IndexError, "out of range"),
        ({"rows": ["0"]}, TypeError, "row indices"),
        ({"rows": slice(None, None, -1)}, ValueError, "step"),
    ]:
        with pytest.raises(exc, match=msg):
            tr.get_dataproto(ref, **kwargs)
    with pytest.raises(ValueError, match="inconsistent batch sizes"):
        tr.put_dataproto({"a": np.arange(3), "b": np.arange(4)})
    with pytest.raises(ValueError, match="unsupported structured non-tensor field"):
        tr.put_dataproto({"batch": {}, "non_tensor_batch": {"o": obj([object()])}})


def test_same_stage_append_keeps_the_old_ref_and_overwrite_replaces() -> None:
    store, tr = make()
    ref = tr.put_dataproto({"a": np.arange(4)}, stage="s")
    old = ref
    ref = tr.append_dataproto_fields(
        ref, {"batch": {"b": np.arange(4.0)}, "meta_info": {"m": 1}}, stage="s"
    )
    assert ref.stage_refs["s"].manifest_key != old.stage_refs["s"].manifest_key
    assert np.array_equal(tr.get_dataproto(old)["batch"]["a"], np.arange(4))
    got = tr.get_dataproto(ref)
    assert set(got["batch"]) == {"a", "b"} and got["meta_info"] == {"m": 1}
    with pytest.raises(ValueError, match="already exist"):
        tr.append_dataproto_fields(ref, {"a": np.arange(4)}, stage="t")
    with pytest.raises(ValueError, match="must include existing fields"):
        tr.append_dataproto_fields(ref, {"a": np.arange(4)}, stage="s", overwrite=True)
    ref = tr.append_dataproto_fields(
        ref, {"a": np.ones(4), "b": np.zeros(4)}, stage="s", overwrite=True
    )
    assert np.array_equal(tr.get_dataproto(ref)["batch"]["a"], np.ones(4))
    view = tr.dataproto_manifest_view(ref)
    assert (
        view["batch_fields"]["a"]["spec"]["dtype"] == "<f8"
        and view["stages"]["s"]["dataproto"]["stage"] == "s"
    )
    tr.cleanup_dataproto(ref)
    assert store.objects == {}


def test_cleanup_of_an_unpublished_append_leaves_the_previous_ref_whole() -> None:
    store, tr = make()
    prev = tr.put_dataproto({"a": np.arange(4)}, stage="s")
    before = dict(store.objects)
    grown = tr.append_dataproto_fields(prev, {"b": np.arange(4.0), "c": np.ones(4)}, stage="s")
    other = tr.append_dataproto_fields(prev, {"d": np.arange(4)}, stage="t")
    assert len(store.objects) > len(before)
    tr.cleanup_dataproto_append(prev, grown)
    tr.cleanup_dataproto_append(prev, other)
    assert store.objects == before
    assert np.array_equal(tr.get_dataproto(prev)["batch"]["a"], np.arange(4))


def test_handles_travel_as_json_and_are_checked() -> None:
    _, tr = make()
    ref = tr.put_dataproto({"batch": {"a": np.arange(2)}, "meta_info": {"v": np.int64(7)}})
    handle = export_dataproto_ref(ref)
    assert handle["meta_info"] == {"v": 7}
    assert np.array_equal(tr.get_dataproto(handle)["batch"]["a"], np.arange(2))
    for field, value, msg in [
        ("version", 3, "version"),
        ("global_indexes", "0", "global_indexes"),
        ("field_index", {"a": {"stage": "x", "member": "m", "section": "batch"}}, "unknown stage"),
    ]:
        with pytest.raises(ValueError, match=msg):
            import_dataproto_ref({**handle, field: value})


def handle(name: str, fields: list[str], rows: int = 1) -> dict[str, Any]:
    return {
        "type": "mooncake_dataproto_ref",
        "version": 1,
        "kind": "bundle_stages",
        "batch_size": rows,
        "partition": "p",
        "stage_refs": {"s": {"manifest_key": name}},
        "field_index": {
            f: {"stage": "s", "member": f"batch.{f}", "section": "batch"} for f in fields
        },
    }


def test_catalog_retires_managed_fragments_after_rows_and_readers_let_go() -> None:
    cat = DataProtoCatalog()
    cat.publish("op", "p", ["k"], handle=handle("m1", ["v"]))
    pinned = cat.resolve("p", ["k"], pin=True)
    assert cat.remove("p", ["k"])["retired_handles"] == []  # a reader still holds m1
    retired = cat.release_read(pinned["read_token"])["retired_handles"]
    assert [h["stage_refs"]["s"]["manifest_key"] for h in retired] == ["m1"]
    assert cat.ack_retired(retired)["retired_handles"] == []
    cat.update("p", ["k"], handle=handle("u1", ["v"]))  # unmanaged: never retired
    assert cat.remove("p", ["k"])["retired_handles"] == []
    assert cat.publish("op", "q", ["z"], handle=handle("m2", ["v"]))["keys"] == ["k"]  # replayed


def test_catalog_append_is_checked_and_idempotent() -> None:
    cat = DataProtoCatalog()
    first = handle("m1", ["a"], rows=2)
    cat.publish("op1", "p", ["x", "y"], handle=first)
    grown = {**first, "field_index": {**first["field_index"], **handle("m1", ["b"])["field_index"]}}
    grown["stage_refs"] = {"s": {"manifest_key": "m2"}}
    result = cat.publish_append("op2", "m1", "p", ["x", "y"], previous_handle=first, handle=grown)
    assert result["fields"] == ["a", "b"]
    assert (
        cat.publish_append("op2", "m1", "p", ["x"], previous_handle=first, handle=grown) == result
    )
    stale = cat.publish_append("op3", "zz", "p", ["x", "y"], previous_handle=first, handle=grown)
    assert "stale" in stale["append_rejected"]


class Puts:
    def __init__(self) -> None:
        self.count, self.cleaned, self.released = 0, [], []

    def put(self, data: Any, **_: Any) -> Any:
        self.count += 1
        return import_dataproto_ref(handle(f"m{self.count}", ["v"], len(data)))

    def cleanup_dataproto(self, ref: Any) -> None:
        self.cleaned.append(ref["stage_refs"]["s"]["manifest_key"])

    def release_result(self, result: Any) -> None:
        self.released.append(result)


def test_catalog_transfer_retries_a_lost_publication_without_duplicates() -> None:
    cat, puts = DataProtoCatalog(), Puts()
    lost = [True, True]

    def call(method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(cat, method)(*args, **kwargs)
        if method == "publish" and lost:
            lost.pop()
            raise RuntimeError("answer lost")
        return result

    client = DataProtoCatalogTransfer(puts, call)
    with pytest.raises(RuntimeError, match="answer lost"):
        client.put([1], partition="p", keys=["k"])
    client.close()  # the pending publication is replayed: same answer, now acknowledged
    assert cat.resolve("p", ["k"])["fields"] == ["v"] and puts.count == 1
    client.remove("p", ["k"])
    assert puts.cleaned == ["m1"]
    client.drain()


def test_dataproto_over_a_real_kvcake_store(real_store: Any) -> None:
    s = real_store
    tr = MooncakeBundleTransfer(s, key_prefix="dpreal", default_chunk_bytes=256)
    data = sample(6)
    ref = tr.put_dataproto(data, stage="roll")
    ref = tr.append_dataproto_fields(ref, {"v": RNG.random(6)}, stage="roll")
    handle = export_dataproto_ref(ref)
    got = tr.get_dataproto(handle, fields=["ids", "v", "text"], rows=[5, 1, 1])
    assert np.array_equal(got["batch"]["ids"], data["batch"]["ids"][[5, 1, 1]])
    assert got["non_tensor_batch"]["text"].tolist() == ["f", "b", "b"]
    stage = ref.stage_refs["roll"]
    specs = [stage.manifest["meta"], *stage.manifest["buffers"].values()]
    keys = [c["key"] for spec in specs for c in spec["chunks"]]
    keys += [*stage.manifest["cleanup_keys"], stage.manifest_key]
    assert all(s.is_exist(k) == 1 for k in keys)
    tr.cleanup_dataproto(handle)
    assert [k for k in keys if s.is_exist(k) != 0] == []
