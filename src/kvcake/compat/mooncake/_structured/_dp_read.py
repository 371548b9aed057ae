"""Reading DataProto fields back: plain members through structured reads (a row slice becomes
ranged reads of the rows' bytes; explicit row indices read the rows' covering range and pick),
codec-encoded ``non_tensor_batch`` fields by decoding their payload members."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured import _dp_codecs as C
from kvcake.compat.mooncake._structured import _nested as nested
from kvcake.compat.mooncake._structured import _tensorio as tio
from kvcake.compat.mooncake._structured._dp_shape import Rows
from kvcake.compat.mooncake._structured._members import ndarray_destination
from kvcake.compat.mooncake._structured._objects import StructuredObjects
from kvcake.compat.mooncake._structured._types import (
    MooncakeDataProtoRef,
    RawDestination,
    StructuredObjectReadSpec,
    TensorObjectBuffer,
)


class DataProtoReader:
    def __init__(self, objects: StructuredObjects) -> None:
        self.objects = objects

    def read(
        self,
        ref: MooncakeDataProtoRef,
        names: list[str],
        rows: Rows | None,
        dests: Mapping[str, Any],
    ) -> dict[str, Any]:
        """field name -> value (ndarray, tensor, or object array for encoded fields)."""
        out: dict[str, Any] = {}
        plain: dict[str, list[str]] = {}
        for name in names:
            loc = ref.field_index[name]
            if loc.section == "non_tensor_batch" and name in ref.encoded_non_tensor:
                out[name] = self._encoded(ref, name, rows)
            else:
                plain.setdefault(loc.stage, []).append(name)
        for stage, stage_names in plain.items():
            if rows is not None and rows.indices is not None:
                for name in stage_names:
                    out[name] = self._picked(ref, name, rows.indices, dests.get(name))
            else:
                out.update(self._stage(ref, stage, stage_names, rows, dests))
        return {name: out[name] for name in names}

    def _stage(
        self,
        ref: MooncakeDataProtoRef,
        stage: str,
        names: list[str],
        rows: Rows | None,
        dests: Mapping[str, Any],
    ) -> dict[str, Any]:
        members = {ref.field_index[n].member: n for n in names}
        spec = StructuredObjectReadSpec(ref.stage_refs[stage]).select_members(list(members))
        if rows is not None and rows.cut is not None:
            for member in members:
                c = rows.cut
                spec = spec.slice_member(member, 0, c.start, c.end, c.step)
        targets = {m: dests[n] for m, n in members.items() if n in dests}
        result = self.objects.materialize(spec, targets)
        return {n: result.objects[m] for m, n in members.items()}

    def _picked(
        self, ref: MooncakeDataProtoRef, name: str, indices: tuple[int, ...], dest: Any
    ) -> Any:
        """Rows ``indices`` (any order, repeats allowed): their covering range, then a pick."""
        loc = ref.field_index[name]
        lo, hi = (min(indices), max(indices) + 1) if indices else (0, 0)
        spec = StructuredObjectReadSpec(ref.stage_refs[loc.stage]).select_members([loc.member])
        cover = self.objects.materialize(spec.slice_member(loc.member, 0, lo, hi)).objects
        value = cover[loc.member]
        picks = [i - lo for i in indices]
        if isinstance(value, np.ndarray):
            picked = value[picks] if picks else value[:0]
            if dest is None:
                return picked
            target = ndarray_destination(name, dest, picked.dtype, picked.shape)
            target[...] = picked
            return target
        if getattr(value, "is_nested", False):
            if dest is not None:
                raise ValueError(
                    f"structured nested tensor member {name} does not support destinations"
                )
            return nested.select_rows(value, picks)
        picked = value[picks] if picks else value[:0]
        return picked if dest is None else _tensor_into(name, picked, dest)

    def _encoded(self, ref: MooncakeDataProtoRef, name: str, rows: Rows | None) -> np.ndarray:
        encoded = ref.encoded_non_tensor[name]
        members = dict(encoded["payload_members"])
        spec = StructuredObjectReadSpec(ref.stage_refs[ref.field_index[name].stage])
        objects = self.objects.materialize(spec.select_members(list(members.values()))).objects
        payload = {p: objects[m] for p, m in members.items()}
        values = C.decode(encoded, payload)
        if rows is not None and rows.indices is not None:
            values = [values[i] for i in rows.indices]
        elif rows is not None and rows.cut is not None:
            values = values[rows.cut.start : rows.cut.end : rows.cut.step]
        return C.object_array(values)


def _tensor_into(name: str, tensor: Any, dest: Any) -> Any:
    if not isinstance(dest, TensorObjectBuffer | RawDestination):
        raise ValueError(
            f"structured tensor member {name} only supports tensor_object_buffer or "
            "raw_destination destinations"
        )
    blob = tio.serialize(tensor)
    if dest.size < len(blob):
        raise ValueError(f"tensor destination has {dest.size} bytes, expected at least {len(blob)}")
    ctypes.memmove(dest.ptr, blob, len(blob))
    return dest
