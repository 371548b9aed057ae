"""The value types of ``mooncake.store`` 0.3.13: enums, ``ReplicateConfig`` and the replica
descriptors, with the wheel's attribute names, defaults, ``str()`` and typing behaviour (an
unknown attribute is an AttributeError, a wrongly typed value a TypeError, as pybind11 does)."""

from __future__ import annotations

import ctypes
from enum import IntEnum
from typing import Any


class _Enum(IntEnum):
    """pybind11 enums print as ``Type.NAME`` and compare equal to their int value."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {int(self)}>"


class SoftPinAction(_Enum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(_Enum):
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class ReplicaStatus(_Enum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class TaskStatus(_Enum):
    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


class TaskType(_Enum):
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class _Field:
    """A typed attribute: assigning a value of another type raises TypeError."""

    def __init__(self, kind: type | tuple[type, ...], default: Any, nullable: bool = False):
        self.kind, self.default, self.nullable = kind, default, nullable

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = getattr(obj, self.name, self.default)
        return list(value) if isinstance(value, list) else value

    def __set__(self, obj: Any, value: Any) -> None:
        if value is None and self.nullable:
            object.__setattr__(obj, self.name, None)
            return
        ok = isinstance(value, self.kind)
        if self.kind is list:
            ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
            value = list(value) if ok else value
        if not ok or (
            self.kind is int and isinstance(value, bool) and self.name != "_with_hard_pin"
        ):
            raise TypeError(
                f"incompatible type for {self.name[1:]}: {type(value).__name__} "
                f"(expected {getattr(self.kind, '__name__', self.kind)})"
            )
        if isinstance(self.default, IntEnum):
            value = type(self.default)(value)
        object.__setattr__(obj, self.name, value)


class _Slotted:
    """No attributes but the declared fields (pybind11 classes have no ``__dict__``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not isinstance(getattr(type(self), name, None), (_Field, property)):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        object.__setattr__(self, name, value)


class ReplicateConfig(_Slotted):
    replica_num = _Field(int, 1)
    nof_replica_num = _Field(int, 0)
    dfs_replica_num = _Field(int, 0)
    with_hard_pin = _Field(bool, False)
    soft_pin_action = _Field(int, SoftPinAction.PRESERVE)
    soft_pin_ttl_ms = _Field(int, None, nullable=True)
    preferred_segments = _Field(list, [])
    preferred_segment = _Field(str, "")
    preferred_nof_segments = _Field(list, [])
    prefer_alloc_in_same_node = _Field(bool, False)
    data_type = _Field(int, ObjectDataType.UNKNOWN)
    group_ids = _Field(list, None, nullable=True)  # Optional[list[str]], as the wheel's

    def __str__(self) -> str:
        ttl = "default" if self.soft_pin_ttl_ms is None else str(self.soft_pin_ttl_ms)
        ids = self.group_ids
        groups = "" if ids is None else f", group_ids: [{', '.join(ids)}]"
        return (
            f"ReplicateConfig: {{ replica_num: {self.replica_num}, nof_replica_num: "
            f"{self.nof_replica_num}, dfs_replica_num: {self.dfs_replica_num}, soft_pin_action: "
            f"{SoftPinAction(self.soft_pin_action).name}, soft_pin_ttl_ms: {ttl}, with_hard_pin: "
            f"{int(self.with_hard_pin)}, preferred_segments: [{', '.join(self.preferred_segments)}]"
            f", preferred_nof_segments: [{', '.join(self.preferred_nof_segments)}], "
            f"prefer_alloc_in_same_node: {int(self.prefer_alloc_in_same_node)}, data_type: "
            f"{ObjectDataType(self.data_type).name}{groups} }}"
        )


class Descriptor(_Slotted):
    """A memory replica's location. kvcake: ``buffer_address`` is the offset inside the segment
    (kvcake addresses segments by name and offset, not by the owner's virtual address) and
    ``transport_endpoint`` the segment's name, as Mooncake's (its owner's ``host:port``)."""

    buffer_address = _Field(int, 0)
    size = _Field(int, 0)
    transport_endpoint = _Field(str, "")

    def __repr__(self) -> str:
        return (
            f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
            f"transport_endpoint={self.transport_endpoint}>"
        )


class MemoryDescriptor:
    def __init__(self, desc: Descriptor):
        self.buffer_descriptor = desc


class DiskDescriptor:
    def __init__(self, file_path: str, object_size: int):
        self.file_path = file_path
        self.object_size = object_size


class ReplicaDescriptor:
    """One replica of an object. kvcake's SSD tier is a node's local disk, so its replicas are
    *local disk* replicas (``is_local_disk_replica()``); the file tier's (the master's
    ``--root_fs_dir``, ``shared``) are Mooncake's DISK replicas (``is_disk_replica()``)."""

    def __init__(
        self,
        status: ReplicaStatus,
        memory: MemoryDescriptor | None = None,
        disk: DiskDescriptor | None = None,
        shared: bool = False,
    ):
        self.status = status
        self._memory = memory
        self._disk = disk
        self._shared = shared

    def is_memory_replica(self) -> bool:
        return self._memory is not None

    def is_disk_replica(self) -> bool:
        return self._disk is not None and self._shared

    def is_local_disk_replica(self) -> bool:
        return self._disk is not None and not self._shared

    def get_memory_descriptor(self) -> MemoryDescriptor:
        if self._memory is None:
            raise RuntimeError("Expected MemoryDescriptor")
        return self._memory

    def get_disk_descriptor(self) -> DiskDescriptor:
        if self._disk is None:
            raise RuntimeError("Expected DiskDescriptor")
        return self._disk


class QueryTaskResponse:
    def __init__(self) -> None:
        self.id: tuple[int, int] = (0, 0)
        self.type = TaskType.REPLICA_COPY
        self.status = TaskStatus.PENDING
        self.created_at_ms_epoch = 0
        self.last_updated_at_ms_epoch = 0
        self.assigned_client: tuple[int, int] = (0, 0)
        self.message = ""

    def __repr__(self) -> str:
        def uuid(u: tuple[int, int]) -> str:
            return f"{u[0]}-{u[1]}"

        return (
            f"QueryTaskResponse(id={uuid(self.id)}, type={int(self.type)}, "
            f"status={int(self.status)}, created_at={self.created_at_ms_epoch}, "
            f"last_updated_at={self.last_updated_at_ms_epoch}, "
            f'assigned_client={uuid(self.assigned_client)}, message="{self.message}")'
        )


class BufferHandle(bytearray):
    """What ``get_buffer`` returns: ``ptr()`` / ``size()`` of the value's bytes, kept alive as
    long as the handle lives; also a buffer (``memoryview(handle)``), as Mooncake's is."""

    def ptr(self) -> int:
        return (
            ctypes.addressof((ctypes.c_char * max(len(self), 1)).from_buffer(self)) if self else 0
        )

    def size(self) -> int:
        return len(self)

    def __repr__(self) -> str:
        return f"<BufferHandle size={len(self)}>"
