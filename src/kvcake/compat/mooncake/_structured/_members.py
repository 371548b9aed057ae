"""Materializing one member of a structured object, whole or a row slice (axis 0), into a new
value or into a caller's destination (an ndarray, a ``raw_destination``, a
``tensor_object_buffer``)."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured import _nested as nested
from kvcake.compat.mooncake._structured import _tensorio as tio
from kvcake.compat.mooncake._structured._port import Port
from kvcake.compat.mooncake._structured._reader import PayloadReader
from kvcake.compat.mooncake._structured._types import (
    RawDestination,
    StructuredMemberSlice,
    TensorObjectBuffer,
)

Spec = Mapping[str, Any]


@dataclass(frozen=True)
class RowPlan:
    """Rows ``start::step`` (``count`` of them) of an array of ``shape``; the read covers
    ``cover`` rows from ``start``."""

    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    row_bytes: int
    start: int
    step: int
    cover: int


def row_plan(shape: tuple[int, ...], itemsize: int, cut: StructuredMemberSlice | None) -> RowPlan:
    row_bytes = itemsize * int(np.prod(shape[1:], dtype=np.int64)) if shape else itemsize
    if cut is None:
        return RowPlan(shape, shape, row_bytes, 0, 1, shape[0] if shape else 1)
    if cut.axis != 0:
        raise ValueError("structured ndarray slicing currently supports axis=0 only")
    if not shape:
        raise ValueError("structured ndarray slicing requires at least one dimension")
    start, end, step = cut.bounds(shape[0])
    count = len(range(start, end, step))
    cover = (count - 1) * step + 1 if count else 0
    return RowPlan(shape, (count, *shape[1:]), row_bytes, start, step, cover)


def ndarray_destination(name: str, dest: Any, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
    if dest is None:
        return np.empty(shape, dtype=dtype)
    if isinstance(dest, RawDestination):
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if dest.size < nbytes:
            raise ValueError(f"raw destination has {dest.size} bytes, expected at least {nbytes}")
        raw = (ctypes.c_uint8 * nbytes).from_address(dest.ptr)
        return np.ctypeslib.as_array(raw).view(dtype).reshape(shape)
    if not isinstance(dest, np.ndarray):
        raise TypeError(
            f"structured ndarray field {name} destination must be a numpy.ndarray or "
            "raw_destination"
        )
    problem = None
    if dest.dtype != dtype:
        problem = f"dtype mismatch: expected {dtype.str}, got {dest.dtype.str}"
    elif tuple(dest.shape) != shape:
        problem = f"shape mismatch: expected {shape}, got {tuple(dest.shape)}"
    elif not dest.flags["C_CONTIGUOUS"]:
        problem = "must be C-contiguous"
    elif not dest.flags["WRITEABLE"]:
        problem = "must be writeable"
    if problem:
        raise ValueError(f"structured ndarray field {name} destination {problem}")
    return dest


class MemberReader:
    def __init__(self, port: Port) -> None:
        self.port = port
        self.reader = PayloadReader(port)

    def read(self, name: str, payload: Spec, field: Spec, cut: Any, dest: Any) -> Any:
        encoding = field.get("encoding", "bytes")
        if encoding == "bytes":
            if cut is not None:
                raise ValueError(f"structured bytes member {name} does not support slicing")
            if dest is not None:
                raise ValueError(
                    f"structured bytes member {name} does not support materialize_into"
                )
            return self.reader.read_all(payload)
        if encoding == "ndarray":
            return self.read_ndarray(name, payload, field, cut, dest)
        if encoding == "torch_tensor" and field.get("nested"):
            return self.read_nested(name, payload, field, cut, dest)
        if encoding == "torch_tensor":
            if cut is not None:
                return self.read_tensor_rows(name, payload, field, cut, dest)
            return self.read_tensor(name, payload, dest)
        raise ValueError(f"unsupported structured field encoding: {encoding}")

    def read_nested(self, name: str, payload: Spec, field: Spec, cut: Any, dest: Any) -> Any:
        if dest is not None:
            raise ValueError(
                f"structured nested tensor member {name} does not support destinations"
            )
        value = nested.decode(self.reader.read_all(payload), field)
        if cut is None:
            return value
        if cut.axis != 0:
            raise ValueError("structured nested tensor slicing currently supports axis=0 only")
        return nested.select_rows(value, range(*cut.bounds(len(value))))

    def read_ndarray(self, name: str, payload: Spec, field: Spec, cut: Any, dest: Any) -> Any:
        dtype, shape = field.get("dtype"), field.get("shape")
        if not isinstance(dtype, str) or not isinstance(shape, list):
            raise ValueError(f"structured ndarray field {name} is missing dtype or shape")
        dt = np.dtype(dtype)
        plan = row_plan(tuple(int(d) for d in shape), dt.itemsize, cut)
        target = ndarray_destination(name, dest, dt, plan.out_shape)
        if target.nbytes == 0:
            return target
        offset = plan.start * plan.row_bytes if cut is not None else 0
        if plan.step == 1:
            self._into(payload, target, offset, dest)
            return target
        cover = np.empty((plan.cover, *plan.shape[1:]), dtype=dt)
        self.reader.read_range_into(payload, cover.view(np.uint8).reshape(-1), offset)
        target[...] = cover[:: plan.step]
        return target

    def _into(self, payload: Spec, target: np.ndarray, offset: int, dest: Any) -> None:
        if isinstance(dest, RawDestination) and dest.pre_registered:
            self.reader.read_raw(payload, dest.ptr, offset, target.nbytes)
        else:
            self.reader.read_range_into(payload, target.view(np.uint8).reshape(-1), offset)

    def read_tensor(self, name: str, payload: Spec, dest: Any) -> Any:
        if dest is not None:
            return self._tensor_into(name, payload, dest)
        if payload.get("kind") == "tensor":
            get_tensor = self.port.fn("get_tensor")
            if get_tensor is None:
                raise RuntimeError("structured tensor payload does not support get_tensor")
            return get_tensor(payload["key"])
        blob = self.reader.read_all(payload)
        if payload.get("format") == "torch_save":
            return tio.torch_load(blob)
        return tio.deserialize(blob)

    def _tensor_into(self, name: str, payload: Spec, dest: Any) -> Any:
        _check_tensor_dest(name, dest)
        if payload.get("kind") == "tensor":
            get_tensor_into = self.port.fn("get_tensor_into")
            if get_tensor_into is None:
                raise RuntimeError("structured tensor payload does not support get_tensor_into")
            return get_tensor_into(payload["key"], dest.ptr, dest.size)
        total = int(payload["bytes"])
        if dest.size < total:
            raise ValueError(f"tensor destination has {dest.size} bytes, expected at least {total}")
        self.reader.read_raw(payload, dest.ptr, 0, total)
        return dest

    def read_tensor_rows(self, name: str, payload: Spec, field: Spec, cut: Any, dest: Any) -> Any:
        """Rows ``[a, b)`` of a stored tensor: its header (shape rewritten) and the rows' bytes,
        each read as a range."""
        if payload.get("format") == "torch_save":
            raise ValueError(f"structured tensor member {name} (a scalar) does not support slicing")
        head_bytes, shape = int(payload.get("metadata_bytes", -1)), field.get("shape")
        itemsize = int(field.get("element_size", 0))
        if head_bytes < 0 or not isinstance(shape, list) or itemsize <= 0:
            raise ValueError(f"structured tensor field {name} is missing slice metadata")
        plan = row_plan(tuple(int(d) for d in shape), itemsize, cut)
        if plan.step != 1:
            raise ValueError("structured tensor slicing currently requires step=1")
        length = plan.cover * plan.row_bytes
        offset = head_bytes + plan.start * plan.row_bytes
        head = tio.sliced_header(
            self.reader.read_range(payload, 0, head_bytes), plan.out_shape, length
        )
        if dest is None:
            return tio.deserialize(head + self.reader.read_range(payload, offset, length))
        _check_tensor_dest(name, dest)
        if dest.size < head_bytes + length:
            raise ValueError(
                f"tensor destination has {dest.size} bytes, expected at least {head_bytes + length}"
            )
        ctypes.memmove(dest.ptr, head, head_bytes)
        data = self.reader.read_range(payload, offset, length)
        ctypes.memmove(dest.ptr + head_bytes, data, length)
        return dest


def _check_tensor_dest(name: str, dest: Any) -> None:
    if not isinstance(dest, TensorObjectBuffer | RawDestination):
        raise ValueError(
            f"structured tensor member {name} only supports tensor_object_buffer or "
            "raw_destination destinations"
        )
