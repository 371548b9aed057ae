"""kvcake's ``mooncake.store``: the module surface of Mooncake 0.3.13's ``mooncake.store`` over
the kvcake store (``kvcake mooncake-shim install`` makes ``import mooncake.store`` resolve
here). Method-by-method status: docs/compat/mooncake.md."""

from __future__ import annotations

from typing import Any

from kvcake.compat.mooncake import _tensor_meta as _meta
from kvcake.compat.mooncake._buffer_pool import (
    BufferLease,
    BufferPool,
    RegisteredBufferLease,
    RegisteredBufferPool,
)
from kvcake.compat.mooncake._buffers import (
    BufferLeaseView,
    MooncakeHostMemAllocator,
    RegisteredBufferLeaseView,
    bind_to_numa_node,
    get_alloc_func_addr,
    get_free_func_addr,
)
from kvcake.compat.mooncake._kv import KvMethods
from kvcake.compat.mooncake._par_types import ParallelAxis, ReadTarget, TensorParallelism
from kvcake.compat.mooncake._parallelism import ParallelismMethods
from kvcake.compat.mooncake._pointers import PointerMethods
from kvcake.compat.mooncake._replicas import ReplicaMethods
from kvcake.compat.mooncake._sessions import SessionMethods
from kvcake.compat.mooncake._setup import SetupMethods
from kvcake.compat.mooncake._types import (
    BufferHandle,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    ObjectDataType,
    QueryTaskResponse,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    TaskStatus,
    TaskType,
)

__kvcake__ = True  # lets callers (and tests) tell the shim from the wheel


class MooncakeDistributedStore(
    SetupMethods, KvMethods, PointerMethods, SessionMethods, ReplicaMethods, ParallelismMethods
):
    """Mooncake's store client over :class:`kvcake.store.client.Client`. Thread safety as the
    kvcake client's (one store may be shared by threads)."""

    def __del__(self) -> None:
        if getattr(self, "_client", None) is not None:
            try:  # noqa: SIM105 (at interpreter shutdown contextlib may be gone already)
                self.close()
            except Exception:
                pass


def _serialize_tensor(tensor: Any) -> tuple[bytes, int, int, Any]:
    """(metadata bytes, data address, data bytes, the contiguous tensor owning the data)."""
    t = tensor.detach().cpu().contiguous()
    try:
        head = _meta.header(t)
    except _meta.TensorFormatError as exc:
        raise ValueError(str(exc)) from None
    return head, int(t.data_ptr()), t.numel() * t.element_size(), t


def _deserialize_tensor(data: bytes) -> Any:
    return _meta.decode(data)


def _tensor_metadata_size() -> int:
    return _meta.HEADER


UNDEFINED, INITIALIZED, PROCESSING, COMPLETE, REMOVED, FAILED = (
    ReplicaStatus.UNDEFINED, ReplicaStatus.INITIALIZED, ReplicaStatus.PROCESSING,
    ReplicaStatus.COMPLETE, ReplicaStatus.REMOVED, ReplicaStatus.FAILED,
)  # fmt: skip
PENDING, SUCCESS = TaskStatus.PENDING, TaskStatus.SUCCESS
REPLICA_COPY, REPLICA_MOVE = TaskType.REPLICA_COPY, TaskType.REPLICA_MOVE
(UNKNOWN, KVCACHE, TENSOR, WEIGHT, SAMPLE, ACTIVATION, GRADIENT, OPTIMIZER_STATE, METADATA,
 GENERAL) = tuple(ObjectDataType)  # fmt: skip

__all__ = [
    "ACTIVATION", "COMPLETE", "FAILED", "GENERAL", "GRADIENT", "INITIALIZED", "KVCACHE",
    "METADATA", "OPTIMIZER_STATE", "PENDING", "PROCESSING", "REMOVED", "REPLICA_COPY",
    "REPLICA_MOVE", "SAMPLE", "SUCCESS", "TENSOR", "UNDEFINED", "UNKNOWN", "WEIGHT",
    "BufferHandle", "BufferLease", "BufferLeaseView", "BufferPool", "Descriptor",
    "DiskDescriptor", "MemoryDescriptor", "MooncakeDistributedStore",
    "MooncakeHostMemAllocator", "ObjectDataType", "ParallelAxis", "QueryTaskResponse",
    "ReadTarget", "RegisteredBufferLease", "RegisteredBufferLeaseView", "RegisteredBufferPool",
    "ReplicaDescriptor", "ReplicaStatus", "ReplicateConfig", "SoftPinAction", "TaskStatus",
    "TaskType", "TensorParallelism", "_deserialize_tensor", "_serialize_tensor",
    "_tensor_metadata_size", "bind_to_numa_node", "get_alloc_func_addr", "get_free_func_addr",
]  # fmt: skip
