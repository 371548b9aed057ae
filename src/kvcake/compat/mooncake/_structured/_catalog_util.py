"""Argument checks and handle normalization shared by the DataProto catalog and its client."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from kvcake.compat.mooncake._structured._handles import export_dataproto_ref, import_dataproto_ref
from kvcake.compat.mooncake._structured._types import MooncakeDataProtoRef

Location = tuple[str, int]  # (fragment id, row in that fragment)


def nonempty(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


def names(values: Any, label: str) -> tuple[str, ...]:
    """A non-empty sequence (not a str) of unique non-empty strings."""
    if isinstance(values, str):
        raise ValueError(f"{label} must be a sequence of non-empty strings")
    out = tuple(values)
    if not out or any(not isinstance(v, str) or not v for v in out):
        raise ValueError(f"{label} must be non-empty strings")
    if len(out) != len(set(out)):
        raise ValueError(f"{label} must be unique")
    return out


def tags(values: Sequence[Mapping[str, Any]] | None, count: int) -> list[dict[str, Any]] | None:
    if values is None:
        return None
    if len(values) != count:
        raise ValueError("tags must have the same length as keys")
    if any(not isinstance(t, Mapping) for t in values):
        raise TypeError("tags must be mappings")
    return [copy.deepcopy(dict(t)) for t in values]


def normalize(handle: Mapping[str, Any]) -> tuple[MooncakeDataProtoRef, dict[str, Any]]:
    """(the ref, the handle in canonical form): two handles naming the same data compare equal."""
    ref = import_dataproto_ref(handle)
    return ref, export_dataproto_ref(ref)


def fragment(handle: Mapping[str, Any], rows: int) -> tuple[str, dict[str, Any], tuple[str, ...]]:
    """(fragment id = its one stage's manifest key, canonical handle, field names)."""
    ref, canonical = normalize(handle)
    if len(ref.stage_refs) != 1:
        raise ValueError("catalog fragments must contain exactly one DataProto stage")
    fid = nonempty(next(iter(ref.stage_refs.values())).manifest_key, "manifest_key")
    if ref.batch_size != rows:
        raise ValueError(
            f"DataProto batch size {ref.batch_size!r} does not match {rows} logical keys"
        )
    fields = names(ref.field_index, "field names")
    return fid, canonical, fields


def field_union(entries: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(f for k in keys for f in entries[k].fields))
