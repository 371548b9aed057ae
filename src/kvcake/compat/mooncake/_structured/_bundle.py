"""Bundles: raw metadata bytes plus named payloads, stored as chunk objects and a JSON manifest
written last (a bundle is visible once its manifest is). A failed put removes what it wrote;
removal takes every chunk and the manifest in one batch."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvcake.compat.mooncake._structured import _manifest as M
from kvcake.compat.mooncake._structured import _tensorio as tio
from kvcake.compat.mooncake._structured._fields import BytesPayload, Payload, TensorPayload
from kvcake.compat.mooncake._structured._port import Port, check, with_config
from kvcake.compat.mooncake._structured._types import (
    BundleTransferPolicy,
    RemoteBundleRef,
    TensorObjectBuffer,
)
from kvcake.compat.mooncake._structured._writer import Chunk, ChunkWriter, split


@dataclass(frozen=True)
class PutOptions:
    chunk_bytes: int
    policy: BundleTransferPolicy
    config: Any = None
    pinned: frozenset[str] = frozenset()  # members whose memory the caller registered


def _copied(opts: PutOptions) -> PutOptions:
    """The metadata blob is a private copy already: a plain ``put`` stores it (registering it
    for an in-place write would gain nothing)."""
    policy = BundleTransferPolicy(opts.policy.max_inflight_put, opts.policy.put_mode, "copy")
    return PutOptions(opts.chunk_bytes, policy, opts.config)


class BundleStore:
    def __init__(self, port: Port, prefix: str, default_chunk_bytes: int) -> None:
        self.port = port
        self.ns = M.Namespace(prefix)
        self.default_chunk_bytes = default_chunk_bytes
        self.writer = ChunkWriter(port)

    def options(
        self,
        chunk_bytes: int | None,
        policy: BundleTransferPolicy | None,
        max_inflight_put: int | None,
        config: Any,
    ) -> PutOptions:
        size = M.check_chunk_bytes(self.default_chunk_bytes if chunk_bytes is None else chunk_bytes)
        checked = (policy or BundleTransferPolicy()).checked(max_inflight_put)
        return PutOptions(size, checked, config)

    def put(
        self,
        meta: BytesPayload,
        payloads: Mapping[str, Payload],
        partition: str,
        opts: PutOptions,
        extends: Mapping[str, Any] | None = None,
    ) -> RemoteBundleRef:
        """A new bundle; with ``extends`` (a manifest) it also lists that bundle's payloads, which
        are not rewritten, and takes over its manifest and meta keys for cleanup."""
        M.check_segment(partition, "partition")
        object_id = f"{partition}/{uuid.uuid4().hex}"
        base = self.ns.base(object_id)
        inherited = dict(extends["buffers"]) if extends else {}
        clash = sorted(set(inherited) & set(payloads))
        if clash:
            raise ValueError(f"structured members already exist: {clash}")
        written: list[str] = []
        try:
            meta_spec = self._put_bytes(f"{base}/meta", meta, _copied(opts), pinned=False)
            written += M.payload_keys(meta_spec)
            specs = {}
            for name, payload in payloads.items():
                M.check_segment(name, "buffer name")
                specs[name] = self._put_payload(f"{base}/buffer/{name}", name, payload, opts)
                written += M.payload_keys(specs[name])
            manifest = {
                "version": 1,
                "layout": "bundle",
                "object_id": object_id,
                "meta": meta_spec,
                "buffers": {**inherited, **specs},
            }
            if extends:
                manifest.update(self._lineage(extends, object_id))
            self.ns.validate(manifest)
            self.port.put(
                f"{base}/manifest", M.encode_json(manifest, "bundle manifest"), opts.config
            )
        except Exception:
            self.port.remove_keys(written, strict=False)
            raise
        return RemoteBundleRef(manifest_key=f"{base}/manifest", manifest=manifest)

    def _lineage(self, old: Mapping[str, Any], object_id: str) -> dict[str, Any]:
        owners = {*old.get("buffer_object_ids", [old["object_id"]]), object_id}
        cleanup = [
            *old.get("cleanup_keys", []),
            self.ns.manifest_key(old),
            *M.payload_keys(old["meta"]),
        ]
        return {"buffer_object_ids": sorted(owners), "cleanup_keys": list(dict.fromkeys(cleanup))}

    def _put_payload(self, key: str, name: str, payload: Payload, opts: PutOptions) -> M.Spec:
        if isinstance(payload, TensorObjectBuffer):
            return self._put_tensor_object(key, payload, opts.config)
        if isinstance(payload, TensorPayload):
            return self._put_tensor(key, payload.tensor, opts)
        return self._put_bytes(key, payload, opts, pinned=name in opts.pinned)

    def _put_bytes(self, key: str, payload: BytesPayload, opts: PutOptions, pinned: bool) -> M.Spec:
        views = split(payload.view, opts.chunk_bytes)
        keys = [key] if len(views) == 1 else [f"{key}/chunk/{i}" for i in range(len(views))]
        chunks = [Chunk(k, v, pinned) for k, v in zip(keys, views, strict=True)]
        self.writer.write(chunks, opts.policy, opts.config)
        entries = [{"key": c.key, "bytes": len(c.view)} for c in chunks]
        return {"key": key, "bytes": len(payload.view), "chunks": entries}

    def _put_tensor_object(self, key: str, buf: TensorObjectBuffer, config: Any) -> M.Spec:
        """A serialized tensor in caller memory, stored by address (``put_tensor_from``)."""
        put_tensor_from, put_from = self.port.fn("put_tensor_from"), self.port.fn("put_from")
        if config is None and put_tensor_from is not None:
            status = put_tensor_from(key, buf.ptr, buf.size)
        elif put_from is not None:
            status = with_config(put_from, key, buf.ptr, buf.size, config=config)
        else:
            raise RuntimeError("put_from is unavailable")
        check(status, "put_from", key)
        return {"key": key, "bytes": buf.size, "chunks": [{"key": key, "bytes": buf.size}]}

    def _put_tensor(self, key: str, tensor: Any, opts: PutOptions) -> M.Spec:
        mode = opts.policy.copy_mode
        if mode == "zero_copy":
            raise ValueError(
                "zero-copy structured tensor fields require a BufferPool tensor-object buffer"
            )
        put_tensor = self.port.fn("put_tensor" if opts.config is None else "pub_tensor")
        if mode == "auto" and put_tensor is not None:
            check(with_config(put_tensor, key, tensor, config=opts.config), "put_tensor", key)
            total = tio.HEADER + int(tensor.numel()) * int(tensor.element_size())
            return {
                "key": key,
                "kind": "tensor",
                "bytes": total,
                "dtype": str(tensor.dtype),
                "shape": list(tensor.shape),
                "chunks": [{"key": key, "bytes": total}],
                "metadata_bytes": tio.HEADER,
            }
        scalar = tensor.dim() == 0
        blob = tio.torch_save(tensor) if scalar else tio.serialize(tensor)
        whole = PutOptions(max(len(blob), 1), opts.policy, opts.config)
        spec = self._put_bytes(key, BytesPayload(memoryview(blob), False), whole, pinned=False)
        if scalar:
            spec["format"] = "torch_save"
        else:
            spec["metadata_bytes"] = tio.HEADER
        return spec

    # --- reading the manifest back, removing ---------------------------------------------

    def resolve(self, ref: RemoteBundleRef | Mapping[str, Any]) -> dict[str, Any]:
        manifest = ref.manifest if isinstance(ref, RemoteBundleRef) else ref.get("manifest")
        if not manifest:
            key = ref.manifest_key if isinstance(ref, RemoteBundleRef) else ref.get("manifest_key")
            if not isinstance(key, str):
                raise ValueError("bundle ref must include manifest_key")
            manifest = M.decode_json(self.port.store.get(key), "bundle manifest")
        self.ns.validate(manifest)
        return manifest

    def remove(self, ref: RemoteBundleRef | Mapping[str, Any]) -> None:
        key = ref.manifest_key if isinstance(ref, RemoteBundleRef) else ref.get("manifest_key")
        embedded = ref.manifest if isinstance(ref, RemoteBundleRef) else ref.get("manifest")
        is_exist = self.port.fn("is_exist")
        if not embedded and isinstance(key, str) and is_exist is not None:
            status = is_exist(key)
            if status == 0:
                return  # removed already
            if status != 1:
                raise RuntimeError(f"is_exist failed for {key}: {status}")
        manifest = self.resolve(ref)
        expected = self.ns.manifest_key(manifest)
        if key is not None and key != expected:
            raise ValueError("bundle manifest_key does not match manifest object_id")
        keys = [*M.all_payload_keys(manifest), *manifest.get("cleanup_keys", []), expected]
        self.port.remove_keys(keys, strict=True)

    def remove_own(self, ref: RemoteBundleRef | Mapping[str, Any]) -> None:
        """Removes a bundle's manifest, meta and the payloads it wrote itself, not those it
        lists from the bundle it extends."""
        key = ref.manifest_key if isinstance(ref, RemoteBundleRef) else ref.get("manifest_key")
        is_exist = self.port.fn("is_exist")
        if isinstance(key, str) and is_exist is not None and is_exist(key) == 0:
            return
        manifest = self.resolve(ref)
        own = [
            s
            for s in manifest["buffers"].values()
            if self.ns.object_id_of(s["key"]) == manifest["object_id"]
        ]
        keys = [*M.payload_keys(manifest["meta"]), *(k for s in own for k in M.payload_keys(s))]
        self.port.remove_keys([*keys, self.ns.manifest_key(manifest)], strict=True)
