"""kvcake's mooncake.structured_object_store: bundles and structured objects over a store with
Mooncake's methods (tests/compat/structured_store.py checks that every fast-path buffer is
registered while the store touches it), and once over a real kvcake master + store."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcake.compat.mooncake.structured_object_store import (
    BundleTransferPolicy,
    MooncakeBundleTransfer,
    RemoteBundleRef,
    StructuredObjectPayload,
)
from tests.compat.structured_store import MemStore

RNG = np.random.default_rng(14)


def make(store: MemStore | None = None, **kw: object) -> tuple[MemStore, MooncakeBundleTransfer]:
    s = store or MemStore()
    return s, MooncakeBundleTransfer(s, key_prefix="t", **kw)  # type: ignore[arg-type]


def test_members_roundtrip_with_specs_and_chunked_keys() -> None:
    store, tr = make()
    weights = RNG.standard_normal((5, 7)).astype(np.float32)
    ref = tr.put_structured_object(
        StructuredObjectPayload({"kind": "x"}, {"w": weights, "raw": b"abc", "empty": b""}),
        chunk_bytes=32,
    )
    chunks = ref.manifest["buffers"]["w"]["chunks"]
    assert [c["bytes"] for c in chunks] == [32] * 4 + [12]
    assert {c["key"] for c in chunks} <= set(store.objects)
    assert ref.manifest["buffers"]["empty"] == {
        "key": ref.manifest["buffers"]["empty"]["key"],
        "bytes": 0,
        "chunks": [],
    }
    got = tr.materialize(tr.read_spec(ref))
    assert np.array_equal(got.objects["w"], weights) and got.objects["raw"] == b"abc"
    assert got.objects["empty"] == b""
    specs = got.metadata["__mooncake_structured_fields__"]
    assert specs["w"] == {"encoding": "ndarray", "dtype": "<f4", "shape": [5, 7]}
    assert got.metadata["kind"] == "x" and store.registered == {}


@pytest.mark.parametrize(("start", "end", "step"), [(1, 4, 1), (0, 5, 2), (3, 3, 1), (-2, 9, 1)])
def test_row_slices_read_only_the_rows(start: int, end: int, step: int) -> None:
    store, tr = make()
    a = np.arange(5 * 6, dtype=np.int64).reshape(5, 6)
    ref = tr.put_structured_object(StructuredObjectPayload(buffers={"a": a}), chunk_bytes=40)
    before = store.calls["get_into_ranges"]
    spec = tr.read_spec(ref).slice_member("a", 0, start, end, step)
    got = tr.materialize(spec).objects["a"]
    assert np.array_equal(got, a[start:end:step])
    assert store.calls["get_into_ranges"] == before + (1 if got.size else 0)


def test_materialize_into_checks_and_fills_the_destination() -> None:
    store, tr = make()
    a = np.arange(24, dtype=np.int16).reshape(6, 4)
    ref = tr.put_structured_object(StructuredObjectPayload(buffers={"a": a}), chunk_bytes=8)
    spec = tr.read_spec(ref).slice_member("a", 0, 1, 3)
    out = np.empty((2, 4), np.int16)
    assert tr.materialize_into(spec, {"a": out}).objects["a"] is out
    assert np.array_equal(out, a[1:3])
    for bad, msg in [
        (np.empty((3, 4), np.int16), "shape mismatch"),
        (np.empty((2, 4), np.int32), "dtype mismatch"),
        (np.empty((4, 2), np.int16).T, "C-contiguous"),
    ]:
        with pytest.raises(ValueError, match=msg):
            tr.materialize_into(spec, {"a": bad})
    with pytest.raises(ValueError, match="axis=0"):
        tr.materialize(tr.read_spec(ref).slice_member("a", 1, 0, 1))
    assert store.registered == {}


def test_caller_registered_memory_stays_registered() -> None:
    store, tr = make()
    a = np.arange(64, dtype=np.uint8)
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(a))
    store.register_buffer(ptr, a.nbytes)
    ref = tr.put_structured_object(StructuredObjectPayload(buffers={"a": a}))
    assert store.registered == {ptr: 64}
    calls = store.calls["register_buffer"]
    tr.put_structured_object(
        StructuredObjectPayload(buffers={"a": a}), pre_registered_buffers={"a": True}
    )
    assert store.calls["register_buffer"] == calls  # pinned payload, metadata by plain put
    assert np.array_equal(tr.materialize(tr.read_spec(ref)).objects["a"], a)
    with pytest.raises(ValueError, match="pre-registered"):
        tr.put_structured_object(
            StructuredObjectPayload(buffers={"a": a[::2]}), pre_registered_buffers={"a": True}
        )


class FailSecondRegister(MemStore):
    def register_buffer(self, ptr: int, size: int) -> int:
        if self.calls["register_buffer"] == 1:
            self.calls["register_buffer"] += 1
            return -1
        return super().register_buffer(ptr, size)


def test_failed_registration_unwinds_and_removes_the_chunks() -> None:
    store, tr = make(FailSecondRegister())
    with pytest.raises(RuntimeError, match="register_buffer"):
        tr.put_bundle(b"meta", {"p": bytes(range(64))}, chunk_bytes=32)
    assert store.registered == {} and store.objects == {}


def test_parallel_puts_overlap_and_copy_mode_uses_plain_puts() -> None:
    store, tr = make(MemStore(delay_s=0.01))
    data = bytes(RNG.integers(0, 256, 256, dtype=np.uint8))
    payload = StructuredObjectPayload(buffers={"p": data})
    policy = BundleTransferPolicy(max_inflight_put=4, put_mode="parallel")
    ref = tr.put_structured_object(payload, chunk_bytes=16, policy=policy)
    assert store.max_active > 1
    assert tr.materialize(tr.read_spec(ref)).objects["p"] == data
    store.calls.clear()
    copy = BundleTransferPolicy(copy_mode="copy")
    ref = tr.put_structured_object(payload, chunk_bytes=64, policy=copy)
    chunks = [*ref.manifest["meta"]["chunks"], *ref.manifest["buffers"]["p"]["chunks"]]
    assert store.calls["batch_put_from"] == 0 and store.calls["register_buffer"] == 0
    assert store.calls["put"] == len(chunks) + 1  # and the manifest


def test_remove_takes_every_key_in_one_batch_and_is_idempotent() -> None:
    store, tr = make()
    ref = tr.put_bundle(b"meta", {"a": b"xy" * 10, "b": b"z"}, chunk_bytes=4)
    tr.remove_bundle(ref)
    assert store.objects == {} and store.calls["batch_remove"] == 1
    tr.remove_bundle({"manifest_key": ref.manifest_key})  # gone already: nothing to do


def test_a_tampered_manifest_never_reaches_other_keys() -> None:
    store, tr = make()
    store.objects["victim"] = b"keep"
    ref = tr.put_bundle(b"meta", {"p": b"abcdef"}, chunk_bytes=2)
    for field, value in [
        ("cleanup_keys", ["victim"]),
        (
            "buffers",
            {"p": {"key": "victim", "bytes": 4, "chunks": [{"key": "victim", "bytes": 4}]}},
        ),
    ]:
        store.objects[ref.manifest_key] = json.dumps({**ref.manifest, field: value}).encode()
        with pytest.raises(ValueError, match="namespace"):
            tr.remove_bundle({"manifest_key": ref.manifest_key})
    other = RemoteBundleRef(manifest_key="t/other/manifest", manifest=ref.manifest)
    with pytest.raises(ValueError, match="manifest_key"):
        tr.remove_bundle(other)
    assert store.objects["victim"] == b"keep"


def test_put_object_wraps_single_values_and_rejects_bad_metadata() -> None:
    _, tr = make()
    a = np.arange(3.0)
    assert np.array_equal(tr.get_object(tr.put_object(a)), a)
    assert tr.get_object(tr.put_object({"x": b"1"})) == {"x": b"1"}
    with pytest.raises(TypeError, match="JSON-serializable"):
        tr.put_structured_object(StructuredObjectPayload({"o": object()}, {}))
    with pytest.raises(ValueError, match="reserved"):
        tr.put_structured_object(StructuredObjectPayload({"__mooncake_structured_fields__": 1}, {}))


def test_torch_tensor_members_whole_and_sliced() -> None:
    torch = pytest.importorskip("torch")
    _store, tr = make()
    t = torch.arange(40, dtype=torch.int64).reshape(10, 4)
    ref = tr.put_structured_object(
        StructuredObjectPayload(buffers={"t": t, "s": torch.tensor(2.5)})
    )
    got = tr.materialize(tr.read_spec(ref)).objects
    assert torch.equal(got["t"], t) and torch.equal(got["s"], torch.tensor(2.5))
    part = tr.materialize(tr.read_spec(ref).select_members(["t"]).slice_member("t", 0, 2, 7))
    assert torch.equal(part.objects["t"], t[2:7])


def test_over_a_real_kvcake_store(real_store: Any) -> None:
    s = real_store
    tr = MooncakeBundleTransfer(s, key_prefix="real")
    a = RNG.standard_normal((64, 33)).astype(np.float32)
    ref = tr.put_structured_object(
        StructuredObjectPayload({"v": 1}, {"a": a, "b": b"xyz"}), chunk_bytes=1000
    )
    spec = tr.read_spec({"manifest_key": ref.manifest_key})
    got = tr.materialize(spec)
    assert np.array_equal(got.objects["a"], a) and got.objects["b"] == b"xyz"
    part = tr.materialize(spec.select_members(["a"]).slice_member("a", 0, 10, 50, 3))
    assert np.array_equal(part.objects["a"], a[10:50:3])
    tr.remove_bundle(ref)
    assert s.is_exist(ref.manifest_key) == 0
    assert all(s.is_exist(c["key"]) == 0 for c in ref.manifest["buffers"]["a"]["chunks"])


def test_the_shim_resolves_both_modules_to_kvcake(tmp_path: Path) -> None:
    from kvcake.compat.mooncake import shim

    shim.install(tmp_path)
    code = (
        "import mooncake.structured_object_store as s, mooncake.dataproto_catalog as c; "
        "print(s.__kvcake__, c.__kvcake__, s.MooncakeBundleTransfer.__module__)"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["True", "True", "kvcake.compat.mooncake._structured._transfer"]
