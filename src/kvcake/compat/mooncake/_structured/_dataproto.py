"""The DataProto part of ``MooncakeBundleTransfer``. A DataProto is stored as one structured
object per *stage* (members ``batch.{field}`` and ``non_tensor_batch.{field}[.{part}]``); its
ref maps each field to its stage's object. Appending to a new stage writes a new object;
appending to an existing stage writes only the new members plus a manifest listing old and new
(the old ref stays readable); ``overwrite`` replaces a stage's object."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured import _dp_codecs as C
from kvcake.compat.mooncake._structured import _dp_schema as SC
from kvcake.compat.mooncake._structured import _dp_shape as S
from kvcake.compat.mooncake._structured import _fields as F
from kvcake.compat.mooncake._structured._bundle import BundleStore
from kvcake.compat.mooncake._structured._dp_flat import flat_to_envelope, to_flat
from kvcake.compat.mooncake._structured._dp_read import DataProtoReader
from kvcake.compat.mooncake._structured._dp_view import manifest_view
from kvcake.compat.mooncake._structured._handles import resolve_dataproto_ref
from kvcake.compat.mooncake._structured._manifest import encode_json
from kvcake.compat.mooncake._structured._objects import StructuredObjects
from kvcake.compat.mooncake._structured._types import (
    BundleTransferPolicy,
    MooncakeDataProtoRef,
    RemoteBundleRef,
    StructuredFieldLocation,
    StructuredObjectPayload,
)


class DataProtos:
    """DataProtos as structured objects over the transfer's bundle store and structured-object
    part (both owned by the ``MooncakeBundleTransfer`` and shared). Keeps no state of its own:
    refs returned are the caller's; thread safety is the store's."""

    def __init__(self, bundles: BundleStore, objects: StructuredObjects) -> None:
        self._bundles = bundles
        self._objects = objects

    def put(
        self,
        data: Any,
        *,
        type: str = "dataproto",
        namespace: str = "default",
        partition: str = "default",
        stage: str = "default",
        chunk_bytes: int | None = None,
        policy: BundleTransferPolicy | None = None,
        config: Any = None,
        field_schemas: Mapping[str, Any] | None = None,
    ) -> MooncakeDataProtoRef:
        """Stores a DataProto-like value (``type="dict"``: a flat dict, split by shape);
        ``field_schemas`` are ``FieldSchema`` hints (``_dp_schema``)."""
        if type not in ("dataproto", "dict"):
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        value = flat_to_envelope(data, field_schemas) if type == "dict" else data
        opts = self._bundles.options(chunk_bytes, policy, None, config)
        return self._put_stage(None, value, namespace, partition, stage, opts, False, field_schemas)

    def put_dataproto(self, data: Any, **kwargs: Any) -> MooncakeDataProtoRef:
        return self.put(data, type="dataproto", **kwargs)

    def append_dataproto_fields(
        self,
        ref: Any,
        data: Any,
        *,
        stage: str,
        overwrite: bool = False,
        chunk_bytes: int | None = None,
        policy: BundleTransferPolicy | None = None,
        field_schemas: Mapping[str, Any] | None = None,
        config: Any = None,
    ) -> MooncakeDataProtoRef:
        ref = resolve_dataproto_ref(ref)
        opts = self._bundles.options(chunk_bytes, policy, None, config)
        return self._put_stage(
            ref, data, ref.namespace, ref.partition, stage, opts, overwrite, field_schemas
        )

    def get(
        self,
        ref: Any,
        *,
        type: str = "dataproto",
        fields: Sequence[str] | None = None,
        batch_fields: Sequence[str] | None = None,
        non_tensor_fields: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        data_cls: Any = None,
        destinations: Mapping[str, Any] | None = None,
        rows: Any = None,
    ) -> Any:
        if type not in ("dataproto", "dict"):
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        ref = resolve_dataproto_ref(ref)
        picked = S.choose_rows(rows, ref.batch_size)
        names = S.choose_fields(ref, fields, batch_fields, non_tensor_fields)
        values = DataProtoReader(self._objects).read(ref, names, picked, destinations or {})
        batch = {n: v for n, v in values.items() if ref.field_index[n].section == "batch"}
        rest = {n: v for n, v in values.items() if n not in batch}
        meta = S.select_meta(ref.meta_info, meta_info_keys)
        if type == "dict":
            return to_flat(batch, rest, meta)
        return S.build_result(batch, rest, meta, data_cls)

    def get_dataproto(self, ref: Any, **kwargs: Any) -> Any:
        return self.get(ref, type="dataproto", **kwargs)

    def dataproto_manifest_view(self, ref: Any) -> dict[str, Any]:
        return manifest_view(self._objects, resolve_dataproto_ref(ref))

    def cleanup_dataproto(self, ref: Any) -> None:
        """Removes every stage object of the DataProto."""
        ref = resolve_dataproto_ref(ref)
        for key in dict.fromkeys(r.manifest_key for r in ref.stage_refs.values()):
            self._bundles.remove({"manifest_key": key})

    def cleanup_dataproto_append(self, previous: Any, appended: Any) -> None:
        """Removes what an append wrote (a rejected one) and leaves ``previous`` intact."""
        old, new = resolve_dataproto_ref(previous), resolve_dataproto_ref(appended)
        for stage, stage_ref in new.stage_refs.items():
            before = old.stage_refs.get(stage)
            if before is None:
                self._bundles.remove(stage_ref)
            elif before.manifest_key != stage_ref.manifest_key:
                self._bundles.remove_own(stage_ref)

    # --- writing one stage ----------------------------------------------------------------

    def _put_stage(
        self,
        ref: MooncakeDataProtoRef | None,
        data: Any,
        namespace: str,
        partition: str,
        stage: str,
        opts: Any,
        overwrite: bool,
        schemas: Mapping[str, Any] | None = None,
    ) -> MooncakeDataProtoRef:
        batch, non_tensor, meta = S.split(data)
        if schemas:
            sections = {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": meta}
            SC.check_sections(sections, schemas)
        rows = S.batch_size(batch, non_tensor)
        if ref is not None and rows != ref.batch_size:
            raise ValueError(
                f"DataProto append batch size {rows} does not match ref batch size {ref.batch_size}"
            )
        overlap = sorted(set(batch) & set(non_tensor))
        if overlap:
            raise ValueError(f"DataProto batch and non_tensor_batch fields overlap: {overlap}")
        members, where, encoded = _members(batch, non_tensor, stage, schemas)
        if not members:
            return (
                _with_meta(ref, meta)
                if ref
                else MooncakeDataProtoRef(rows, {}, {}, dict(meta), namespace, partition)
            )
        _check_fields(ref, where, stage, overwrite)
        header = _header(namespace, partition, stage, rows)
        existing = ref.stage_refs.get(stage) if ref is not None else None
        if existing is not None and not overwrite:
            stage_ref = self._extend_stage(existing, header, members, partition, opts)
        else:
            stage_ref = self._objects.put(StructuredObjectPayload(header, members), partition, opts)
            if existing is not None and existing.manifest_key != stage_ref.manifest_key:
                self._bundles.remove(existing)
        return _next_ref(ref, rows, namespace, partition, stage, stage_ref, where, encoded, meta)

    def _extend_stage(
        self,
        existing: RemoteBundleRef,
        header: dict[str, Any],
        members: dict[str, Any],
        partition: str,
        opts: Any,
    ) -> RemoteBundleRef:
        old_manifest = self._bundles.resolve(existing)
        old_meta = self._objects.read_metadata(old_manifest)
        if old_meta.get("dataproto") != header["dataproto"]:
            raise ValueError("DataProto stage metadata mismatch during manifest merge")
        meta, payloads = F.encode_object(header, members)
        merged = {**old_meta, F.FIELD_SPECS_KEY: {**F.field_specs(old_meta), **F.field_specs(meta)}}
        blob = F.bytes_view(encode_json(merged, "structured metadata"), "meta")
        return self._bundles.put(blob, payloads, partition, opts, extends=old_manifest)


def _header(namespace: str, partition: str, stage: str, rows: int) -> dict[str, Any]:
    """A stage object's metadata (an append to the stage must carry the same)."""
    where = {"namespace": namespace, "partition": partition, "stage": stage, "batch_size": rows}
    return {"layout": "dataproto_stage", "dataproto": {"version": 1, **where}}


def _members(
    batch: Mapping[str, Any],
    non_tensor: Mapping[str, Any],
    stage: str,
    schemas: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, StructuredFieldLocation], dict[str, Any]]:
    members: dict[str, Any] = {}
    where: dict[str, StructuredFieldLocation] = {}
    encoded: dict[str, Any] = {}
    for name, value in batch.items():
        members[f"batch.{name}"] = value
        where[name] = StructuredFieldLocation(stage, f"batch.{name}", "batch")
    for name, value in non_tensor.items():
        member = f"non_tensor_batch.{name}"
        where[name] = StructuredFieldLocation(stage, member, "non_tensor_batch")
        schema = SC.for_non_tensor(schemas, name)
        enc = None if schema is None else SC.encode(name, value, schema)
        if enc is None:
            array = value if isinstance(value, np.ndarray) else C.object_array(list(value))
            if array.dtype != object:
                members[member] = array
                continue
            enc = C.encode(member, array)
        parts = {part: f"{member}.{part}" for part in enc.payload}
        members.update({parts[p]: v for p, v in enc.payload.items()})
        encoded[name] = {
            "codec": enc.codec,
            "rows": enc.rows,
            "metadata": enc.metadata,
            "payload_members": parts,
        }
    return members, where, encoded


def _check_fields(ref: Any, where: Mapping[str, Any], stage: str, overwrite: bool) -> None:
    if ref is None:
        return
    dups = sorted(set(ref.field_index) & set(where))
    if dups and not overwrite:
        raise ValueError(f"DataProto fields already exist: {dups}")
    left = sorted(n for n, loc in ref.field_index.items() if loc.stage == stage and n not in where)
    if overwrite and left:
        raise ValueError(
            f"DataProto overwrite for stage {stage!r} must include existing fields: {left}"
        )


def _with_meta(ref: MooncakeDataProtoRef, meta: Mapping[str, Any]) -> MooncakeDataProtoRef:
    return MooncakeDataProtoRef(
        ref.batch_size,
        dict(ref.stage_refs),
        dict(ref.field_index),
        {**ref.meta_info, **meta},
        ref.namespace,
        ref.partition,
        ref.global_indexes,
        dict(ref.encoded_non_tensor),
        ref._storage_group_id,
    )


def _next_ref(
    ref: MooncakeDataProtoRef | None,
    rows: int,
    namespace: str,
    partition: str,
    stage: str,
    stage_ref: RemoteBundleRef,
    where: Mapping[str, Any],
    encoded: Mapping[str, Any],
    meta: Mapping[str, Any],
) -> MooncakeDataProtoRef:
    if ref is None:
        return MooncakeDataProtoRef(
            rows,
            {stage: stage_ref},
            dict(where),
            dict(meta),
            namespace,
            partition,
            None,
            dict(encoded),
        )
    codecs = {n: e for n, e in ref.encoded_non_tensor.items() if n not in where}
    return MooncakeDataProtoRef(
        rows,
        {**ref.stage_refs, stage: stage_ref},
        {**ref.field_index, **where},
        {**ref.meta_info, **meta},
        namespace,
        partition,
        ref.global_indexes,
        {**codecs, **encoded},
        ref._storage_group_id,
    )
