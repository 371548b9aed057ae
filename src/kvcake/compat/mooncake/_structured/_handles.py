"""DataProto ref handles: a JSON-safe dict naming a DataProto's stage manifests and fields, to
pass a stored DataProto between processes (version 1 of Mooncake's handle, plus the optional
``storage_group_id``; version 2 requires it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured._types import (
    MooncakeDataProtoRef,
    RemoteBundleRef,
    StructuredFieldLocation,
)

HANDLE_TYPE = "mooncake_dataproto_ref"
HANDLE_VERSION = 1
STORAGE_GROUP_ID = "storage_group_id"
SECTIONS = ("batch", "non_tensor_batch")


def is_dataproto_ref_handle(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") == HANDLE_TYPE


def json_safe(value: Any) -> Any:
    """``value`` with numpy scalars and arrays turned into plain JSON values."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    raise TypeError(
        f"DataProto ref handles support only JSON-safe values, got {type(value).__name__}"
    )


def export_dataproto_ref(ref: MooncakeDataProtoRef) -> dict[str, Any]:
    if not isinstance(ref, MooncakeDataProtoRef):
        raise TypeError(f"expected MooncakeDataProtoRef, got {type(ref).__name__}")
    handle: dict[str, Any] = {
        "type": HANDLE_TYPE,
        "version": HANDLE_VERSION,
        "kind": "bundle_stages",
        "batch_size": int(ref.batch_size),
        "namespace": ref.namespace,
        "partition": ref.partition,
        "global_indexes": json_safe(ref.global_indexes),
        "stage_refs": {s: {"manifest_key": r.manifest_key} for s, r in ref.stage_refs.items()},
        "field_index": {
            name: {"stage": loc.stage, "member": loc.member, "section": loc.section}
            for name, loc in ref.field_index.items()
        },
        "meta_info": json_safe(ref.meta_info),
        "encoded_non_tensor": json_safe(ref.encoded_non_tensor),
    }
    if ref._storage_group_id is not None:
        handle[STORAGE_GROUP_ID] = ref._storage_group_id
    json.dumps(handle, ensure_ascii=False)  # proves the handle travels as JSON
    return handle


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"DataProto ref handle {name} must be a mapping")
    return value


def _nonempty(*values: Any) -> bool:
    return all(isinstance(v, str) and v for v in values)


def _stage_refs(handle: Mapping[str, Any]) -> dict[str, RemoteBundleRef]:
    out = {}
    for stage, raw in _mapping(handle.get("stage_refs"), "stage_refs").items():
        key = _mapping(raw, f"stage_refs[{stage!r}]").get("manifest_key")
        if not _nonempty(stage, key):
            raise ValueError(
                "DataProto ref handle stage refs must contain non-empty string names and "
                "manifest_key values"
            )
        out[stage] = RemoteBundleRef(manifest_key=str(key), manifest={})
    return out


def _field_index(handle: Mapping[str, Any], stages: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name, raw in _mapping(handle.get("field_index"), "field_index").items():
        loc = _mapping(raw, f"field_index[{name!r}]")
        section, stage, member = loc.get("section"), loc.get("stage"), loc.get("member")
        if section not in SECTIONS:
            raise ValueError(f"invalid DataProto field section: {section!r}")
        if not _nonempty(name, stage, member):
            raise ValueError("DataProto ref handle field locations must be non-empty strings")
        if stage not in stages:
            raise ValueError(
                f"DataProto ref handle field {name!r} references unknown stage {stage!r}"
            )
        out[name] = StructuredFieldLocation(stage=str(stage), member=str(member), section=section)
    return out


def _global_indexes(value: Any) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError("DataProto ref handle global_indexes must be a list or null")
    if any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        raise ValueError("DataProto ref handle global_indexes must contain integers")
    return list(value)


def import_dataproto_ref(handle: Mapping[str, Any]) -> MooncakeDataProtoRef:
    """The lazy ref a handle names (manifests are read when first needed)."""
    if not is_dataproto_ref_handle(handle):
        raise ValueError("not a Mooncake DataProto ref handle")
    version = int(handle.get("version", -1))
    if version not in (HANDLE_VERSION, 2):
        raise ValueError(f"unsupported DataProto ref handle version: {handle.get('version')!r}")
    if handle.get("kind") != "bundle_stages":
        raise ValueError(f"unsupported DataProto ref handle kind: {handle.get('kind')!r}")
    stages = _stage_refs(handle)
    fields = _field_index(handle, stages)
    group = handle.get(STORAGE_GROUP_ID)
    if (version == 2 and group is None) or (group is not None and not _nonempty(group)):
        raise ValueError("DataProto ref handle has invalid storage_group_id")
    return MooncakeDataProtoRef(
        batch_size=int(handle["batch_size"]),
        stage_refs=stages,
        field_index=fields,
        meta_info=dict(_mapping(handle.get("meta_info", {}), "meta_info")),
        namespace=str(handle.get("namespace", "default")),
        partition=str(handle.get("partition", "default")),
        global_indexes=_global_indexes(handle.get("global_indexes")),
        encoded_non_tensor=dict(
            _mapping(handle.get("encoded_non_tensor", {}), "encoded_non_tensor")
        ),
        _storage_group_id=group,
    )


def resolve_dataproto_ref(ref: Any) -> MooncakeDataProtoRef:
    if isinstance(ref, MooncakeDataProtoRef):
        return ref
    if is_dataproto_ref_handle(ref):
        return import_dataproto_ref(ref)
    raise TypeError(f"expected MooncakeDataProtoRef or DataProto handle, got {type(ref).__name__}")
