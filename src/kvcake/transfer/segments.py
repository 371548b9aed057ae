"""This process's registered segments: name -> writable byte view.

Who owns memory: a segment made by ``register_memory`` views the caller's buffer (the caller
keeps owning it and must keep it alive until ``unregister``); one made by ``allocate_segment``
owns a ``/dev/shm`` region that ``unregister``/``close`` unlinks. The table holds only views, so
lookups from transfer-server threads are lock-free dict reads; mutations take the lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, cast

from numpy.typing import NDArray
from typing_extensions import Buffer

from kvcake.transfer.errors import InvalidRequest, OutOfRange, SegmentExists, UnknownSegment
from kvcake.transfer.shm import ShmRegion


@dataclass
class LocalSegment:
    name: str
    view: memoryview  # 1-D, format "B", writable
    region: ShmRegion | None = None
    keepalive: object = None  # the caller's buffer, held so its memory outlives the view

    @property
    def size(self) -> int:
        return self.view.nbytes


class TensorLike(Protocol):
    """A torch CPU tensor: ``numpy()`` returns an array that shares its storage."""

    def numpy(self) -> NDArray[Any]: ...


# What segments, writes and reads accept: a buffer-protocol object or a CPU tensor. numpy arrays
# are named because numpy's stubs give them ``__buffer__`` only for Python >= 3.12.
BufferLike: TypeAlias = Buffer | NDArray[Any] | TensorLike


def as_byte_view(buffer: BufferLike) -> memoryview:
    """A contiguous 1-D byte view of any buffer-protocol object, or of a torch CPU tensor's
    storage (through ``tensor.numpy()``, which shares it: no copy, no torch import here)."""
    try:
        # Buffer first even for a TensorLike: whatever exports memory is viewed directly.
        view = memoryview(cast(Buffer, buffer))
    except TypeError as exc:
        to_numpy = getattr(buffer, "numpy", None)
        if to_numpy is None:
            raise InvalidRequest(
                f"{type(buffer).__name__} does not support the buffer protocol"
            ) from exc
        try:
            view = memoryview(to_numpy())
        except (TypeError, RuntimeError) as exc2:  # e.g. a GPU tensor or one that needs grad
            raise InvalidRequest(f"cannot view {type(buffer).__name__} as bytes: {exc2}") from exc2
    if not view.c_contiguous:
        raise InvalidRequest("buffer must be C-contiguous")
    return view.cast("B") if (view.format != "B" or view.ndim != 1) else view


def check_range(name: str, size: int, offset: int, length: int) -> None:
    if length <= 0:
        raise InvalidRequest(f"length must be > 0, got {length}")
    if offset < 0:
        raise OutOfRange(f"negative offset {offset} in segment {name!r}")
    if offset + length > size:
        raise OutOfRange(
            f"range [{offset}, {offset + length}) exceeds segment {name!r} of {size} bytes"
        )


class SegmentTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._segs: dict[str, LocalSegment] = {}

    def add(self, seg: LocalSegment) -> None:
        with self._lock:
            if seg.name in self._segs:
                raise SegmentExists(f"segment {seg.name!r} is already registered here")
            self._segs[seg.name] = seg

    def pop(self, name: str) -> LocalSegment:
        with self._lock:
            seg = self._segs.pop(name, None)
        if seg is None:
            raise UnknownSegment(f"segment {name!r} is not registered here")
        return seg

    def get(self, name: str) -> LocalSegment:
        seg = self._segs.get(name)
        if seg is None:
            raise UnknownSegment(f"segment {name!r} is not registered here")
        return seg

    def resolve(self, name: str, offset: int, length: int) -> memoryview:
        """The view of ``[offset, offset+length)`` of a segment, range-checked (every single
        request a server answers: the typed error is worded only when the check fails)."""
        view = self.get(name).view
        if length <= 0 or offset < 0 or offset + length > view.nbytes:
            check_range(name, view.nbytes, offset, length)
        return view[offset : offset + length]

    def names(self) -> list[str]:
        return list(self._segs)

    def __contains__(self, name: str) -> bool:
        return name in self._segs
