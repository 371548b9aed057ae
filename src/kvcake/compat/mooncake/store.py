"""kvcake's ``mooncake.store``: the module surface of Mooncake 0.3.13's ``mooncake.store`` over
the kvcake store (``kvcake mooncake-shim install`` makes ``import mooncake.store`` resolve
here). Method-by-method status: docs/compat/mooncake.md."""

from __future__ import annotations

from typing import Any

from kvcake.compat.mooncake import _dummy_store
from kvcake.compat.mooncake import _tensor_meta as _meta
from kvcake.compat.mooncake._base import Conn, check_signature
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
from kvcake.compat.mooncake._kv import KvOps
from kvcake.compat.mooncake._par_types import ParallelAxis, ReadTarget, TensorParallelism
from kvcake.compat.mooncake._parallel import TpTensors
from kvcake.compat.mooncake._parallelism import ParTensors
from kvcake.compat.mooncake._parts import Parts, via
from kvcake.compat.mooncake._pointers import PointerOps
from kvcake.compat.mooncake._replicas import Replicas
from kvcake.compat.mooncake._segments import Segments
from kvcake.compat.mooncake._sessions import Sessions
from kvcake.compat.mooncake._setup import Lifecycle
from kvcake.compat.mooncake._tensors import Tensors
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


class MooncakeDistributedStore:
    """Mooncake's store client over :class:`kvcake.store.client.Client`, composed of parts
    (:class:`._parts.Parts`): ``life`` (setup, close, health), ``segments``, ``kv`` (bytes),
    ``ptr`` (caller buffers), ``sessions``, ``replicas`` (descriptors, copy / move tasks),
    ``tensors``, ``tp`` and ``par`` (tensor parallelism). Each public method is its part's
    method (``via``): same name, signature and return codes as the wheel's.

    The store owns the Conn (what setup made: the client, the segment name, the local buffer's
    size) and the registered-buffer table; the parts share them and own the rest (session
    tables, the task table). A dummy store (``setup_dummy``) runs on five dummy parts until
    it closes. Thread safety: as the kvcake client's (a store may be shared by threads);
    ``setup``, ``setup_dummy`` and ``close`` must not race other calls, as with the wheel. The
    caller owns the memory behind every address it passes and keeps it valid for the call."""

    def __init__(self) -> None:
        self._conn = Conn()
        self._registered: dict[int, int] = {}  # buffer address -> size (register_buffer)
        self._plain = Parts.plain(self._conn, self._registered)
        self._parts = self._plain

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Attach, as Mooncake's dummy client, to a running ``mooncake_client`` (kvcake's
        stand-in): 0, or -1 when none answers there. Then the store runs on the dummy's parts."""
        check_signature(mem_pool_size, local_buffer_size, server_address, kinds=(int, int, str))
        if self._conn.client is not None:
            return 0  # the wheel keeps its first setup (or attachment) and reports success

        rc = _dummy_store.attach(self._conn, mem_pool_size, local_buffer_size, server_address)
        if rc == 0:
            self._parts = _dummy_store.dummy_parts(self._plain, self._conn, self._registered)
        return rc

    def close(self) -> int:
        self._parts.replicas.close()  # running copy/move tasks use the client: they end first
        rc = self._parts.life.close()
        self._parts = self._plain  # a closed dummy is a plain store, not set up, again
        return rc

    def __del__(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None and conn.client is not None:
            try:  # noqa: SIM105 (at interpreter shutdown contextlib may be gone already)
                self.close()
            except Exception:
                pass

    # --- lifecycle and identity (setup_dummy and close: below) -------------------------------------
    setup = via("life", Lifecycle.setup)
    init_all = via("life", Lifecycle.init_all)
    health_check = via("life", Lifecycle.health_check)
    get_hostname = via("life", Lifecycle.get_hostname)
    get_offload_rpc_read_count = via("life", Lifecycle.get_offload_rpc_read_count)
    alloc_from_mem_pool = via("life", Lifecycle.alloc_from_mem_pool)

    # --- segments ----------------------------------------------------------------------------------
    allocate_and_mount_segment = via("segments", Segments.allocate_and_mount_segment)
    mount_segment = via("segments", Segments.mount_segment)
    unmount_segment = via("segments", Segments.unmount_segment)
    unmount_and_free_segment = via("segments", Segments.unmount_and_free_segment)
    unmount_local_disk_segment = via("segments", Segments.unmount_local_disk_segment)

    # --- bytes values ------------------------------------------------------------------------------
    put = via("kv", KvOps.put)
    upsert = via("kv", KvOps.upsert)
    put_parts = via("kv", KvOps.put_parts)
    upsert_parts = via("kv", KvOps.upsert_parts)
    put_batch = via("kv", KvOps.put_batch)
    upsert_batch = via("kv", KvOps.upsert_batch)
    get = via("kv", KvOps.get)
    get_batch = via("kv", KvOps.get_batch)
    get_buffer = via("kv", KvOps.get_buffer)
    batch_get_buffer = via("kv", KvOps.batch_get_buffer)
    get_size = via("kv", KvOps.get_size)
    is_exist = via("kv", KvOps.is_exist)
    batch_is_exist = via("kv", KvOps.batch_is_exist)
    remove = via("kv", KvOps.remove)
    batch_remove = via("kv", KvOps.batch_remove)
    remove_by_regex = via("kv", KvOps.remove_by_regex)
    remove_all = via("kv", KvOps.remove_all)

    # --- caller buffers (zero copy) ----------------------------------------------------------------
    register_buffer = via("ptr", PointerOps.register_buffer)
    unregister_buffer = via("ptr", PointerOps.unregister_buffer)
    put_from = via("ptr", PointerOps.put_from)
    upsert_from = via("ptr", PointerOps.upsert_from)
    put_from_with_metadata = via("ptr", PointerOps.put_from_with_metadata)
    get_into = via("ptr", PointerOps.get_into)
    batch_put_from = via("ptr", PointerOps.batch_put_from)
    batch_upsert_from = via("ptr", PointerOps.batch_upsert_from)
    batch_get_into = via("ptr", PointerOps.batch_get_into)
    batch_put_from_multi_buffers = via("ptr", PointerOps.batch_put_from_multi_buffers)
    batch_get_into_multi_buffers = via("ptr", PointerOps.batch_get_into_multi_buffers)
    get_into_ranges = via("ptr", PointerOps.get_into_ranges)

    # --- put and get sessions ----------------------------------------------------------------------
    batch_put_session_start = via("sessions", Sessions.batch_put_session_start)
    batch_put_from_multi_buffer_ranges = via(
        "sessions", Sessions.batch_put_from_multi_buffer_ranges
    )
    batch_put_session_end = via("sessions", Sessions.batch_put_session_end)
    batch_put_session_revoke = via("sessions", Sessions.batch_put_session_revoke)
    batch_get_session_start = via("sessions", Sessions.batch_get_session_start)
    batch_get_into_multi_buffer_ranges = via(
        "sessions", Sessions.batch_get_into_multi_buffer_ranges
    )
    batch_get_session_end = via("sessions", Sessions.batch_get_session_end)

    # --- replicas and copy / move tasks ------------------------------------------------------------
    get_replica_desc = via("replicas", Replicas.get_replica_desc)
    batch_get_replica_desc = via("replicas", Replicas.batch_get_replica_desc)
    batch_replica_clear = via("replicas", Replicas.batch_replica_clear)
    create_copy_task = via("replicas", Replicas.create_copy_task)
    create_move_task = via("replicas", Replicas.create_move_task)
    query_task = via("replicas", Replicas.query_task)

    # --- tensors -----------------------------------------------------------------------------------
    put_tensor = via("tensors", Tensors.put_tensor)
    upsert_tensor = via("tensors", Tensors.upsert_tensor)
    pub_tensor = via("tensors", Tensors.pub_tensor)
    upsert_pub_tensor = via("tensors", Tensors.upsert_pub_tensor)
    get_tensor = via("tensors", Tensors.get_tensor)
    batch_put_tensor = via("tensors", Tensors.batch_put_tensor)
    batch_upsert_tensor = via("tensors", Tensors.batch_upsert_tensor)
    batch_pub_tensor = via("tensors", Tensors.batch_pub_tensor)
    batch_upsert_pub_tensor = via("tensors", Tensors.batch_upsert_pub_tensor)
    batch_get_tensor = via("tensors", Tensors.batch_get_tensor)
    get_tensor_into = via("tensors", Tensors.get_tensor_into)
    batch_get_tensor_into = via("tensors", Tensors.batch_get_tensor_into)
    put_tensor_from = via("tensors", Tensors.put_tensor_from)
    upsert_tensor_from = via("tensors", Tensors.upsert_tensor_from)
    batch_put_tensor_from = via("tensors", Tensors.batch_put_tensor_from)
    batch_upsert_tensor_from = via("tensors", Tensors.batch_upsert_tensor_from)
    get_tensor_into_cuda = via("tensors", Tensors.get_tensor_into_cuda)
    batch_get_tensor_into_cuda = via("tensors", Tensors.batch_get_tensor_into_cuda)
    save_tensor_to_safetensor = via("tensors", Tensors.save_tensor_to_safetensor)
    load_tensor_from_safetensor = via("tensors", Tensors.load_tensor_from_safetensor)

    # --- tensor parallelism (_with_tp) -------------------------------------------------------------
    put_tensor_with_tp = via("tp", TpTensors.put_tensor_with_tp)
    pub_tensor_with_tp = via("tp", TpTensors.pub_tensor_with_tp)
    batch_put_tensor_with_tp = via("tp", TpTensors.batch_put_tensor_with_tp)
    batch_pub_tensor_with_tp = via("tp", TpTensors.batch_pub_tensor_with_tp)
    put_tensor_with_tp_from = via("tp", TpTensors.put_tensor_with_tp_from)
    batch_put_tensor_with_tp_from = via("tp", TpTensors.batch_put_tensor_with_tp_from)
    get_tensor_with_tp = via("tp", TpTensors.get_tensor_with_tp)
    batch_get_tensor_with_tp = via("tp", TpTensors.batch_get_tensor_with_tp)
    get_tensor_with_tp_into = via("tp", TpTensors.get_tensor_with_tp_into)
    batch_get_tensor_with_tp_into = via("tp", TpTensors.batch_get_tensor_with_tp_into)

    # --- parallelism (_with_parallelism) -----------------------------------------------------------
    put_tensor_with_parallelism = via("par", ParTensors.put_tensor_with_parallelism)
    upsert_tensor_with_parallelism = via("par", ParTensors.upsert_tensor_with_parallelism)
    batch_put_tensor_with_parallelism = via("par", ParTensors.batch_put_tensor_with_parallelism)
    batch_upsert_tensor_with_parallelism = via(
        "par", ParTensors.batch_upsert_tensor_with_parallelism
    )
    put_tensor_with_parallelism_from = via("par", ParTensors.put_tensor_with_parallelism_from)
    upsert_tensor_with_parallelism_from = via("par", ParTensors.upsert_tensor_with_parallelism_from)
    batch_put_tensor_with_parallelism_from = via(
        "par", ParTensors.batch_put_tensor_with_parallelism_from
    )
    batch_upsert_tensor_with_parallelism_from = via(
        "par", ParTensors.batch_upsert_tensor_with_parallelism_from
    )
    get_tensor_with_parallelism = via("par", ParTensors.get_tensor_with_parallelism)
    get_tensor_with_parallelism_into = via("par", ParTensors.get_tensor_with_parallelism_into)
    batch_get_tensor_with_parallelism = via("par", ParTensors.batch_get_tensor_with_parallelism)
    batch_get_tensor_with_parallelism_into = via(
        "par", ParTensors.batch_get_tensor_with_parallelism_into
    )


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
