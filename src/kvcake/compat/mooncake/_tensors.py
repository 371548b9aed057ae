"""The torch tensor methods: put/get/upsert/pub, their batch, ``_into`` / ``_from`` (caller
buffers laid out as [304-byte metadata][data]) and tensor-parallel (``_with_tp``) forms, and
safetensors export/import. Values use Mooncake's stored layout (:mod:`._tensor_meta`).

Tensor parallelism: ``put_tensor_with_tp(key, t, tp_size=n, split_dim=d)`` chunks ``t`` along
``d`` and stores shard *i* under ``f"{key}_tp_{i}"`` (all ranks, as the wheel does);
``get_tensor_with_tp(key, tp_rank=i)`` reads shard *i*."""

from __future__ import annotations

import logging
from typing import Any

from kvcake.compat.mooncake import _tensor_meta as M
from kvcake.compat.mooncake._base import FILE_ERROR, Conn, check_key, returns, view
from kvcake.compat.mooncake._types import ReplicateConfig
from kvcake.core.errors import StoreError
from kvcake.store import errors as E

log = logging.getLogger(__name__)


def tp_key(key: str, rank: int) -> str:
    return f"{key}_tp_{rank}"


def _encode(tensor: Any) -> memoryview:
    try:
        return memoryview(M.encode(tensor))
    except M.TensorFormatError as exc:
        raise E.InvalidParams(str(exc)) from exc


def _decode(blob: Any) -> Any:
    try:
        return M.decode(blob)
    except M.TensorFormatError as exc:
        log.error("%s", exc)
        return None


class Tensors:
    """The whole-tensor calls in Mooncake's stored layout; holds only the Conn. Tensors returned
    are fresh (the caller owns them) except the ``_into`` forms', which view the caller's
    buffer."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    def get_raw(self, key: str) -> bytearray | None:
        """The stored bytes (a tensor's header and data), None when the key holds nothing."""
        check_key(key)
        return self._conn.get_or_none(key)

    # --- whole tensors ------------------------------------------------------------------------

    @returns(int)
    def put_tensor(self, key: str, tensor: Any) -> int:
        check_key(key)
        return self._conn.put(key, _encode(tensor), None, upsert=False)

    @returns(int)
    def upsert_tensor(self, key: str, tensor: Any) -> int:
        check_key(key)
        return self._conn.put(key, _encode(tensor), None, upsert=True)

    @returns(int)
    def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        check_key(key)
        return self._conn.put(key, _encode(tensor), config, upsert=False)

    @returns(int)
    def upsert_pub_tensor(
        self, key: str, tensor: Any, config: ReplicateConfig | None = None
    ) -> int:
        check_key(key)
        return self._conn.put(key, _encode(tensor), config, upsert=True)

    @returns(None)
    def get_tensor(self, key: str) -> Any:
        raw = self.get_raw(key)
        return None if raw is None else _decode(raw)

    def _batch_put_t(self, keys: list[str], tensors: list[Any], config: Any, up: bool) -> list[int]:
        if len(keys) != len(tensors):
            return [E.INVALID_PARAMS] * len(keys)
        return self._conn.put_batch(keys, [_encode(t) for t in tensors], config, upsert=up)

    @returns([])
    def batch_put_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        return self._batch_put_t(keys, tensors_list, None, False)

    @returns([])
    def batch_upsert_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        return self._batch_put_t(keys, tensors_list, None, True)

    @returns([])
    def batch_pub_tensor(
        self, keys: list[str], tensors_list: list[Any], config: ReplicateConfig | None = None
    ) -> list[int]:
        return self._batch_put_t(keys, tensors_list, config, False)

    @returns([])
    def batch_upsert_pub_tensor(
        self, keys: list[str], tensors_list: list[Any], config: ReplicateConfig | None = None
    ) -> list[int]:
        return self._batch_put_t(keys, tensors_list, config, True)

    @returns([])
    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        if not keys:
            return []
        return [
            None if isinstance(g, StoreError) else _decode(g) for g in self._conn.c.batch_get(keys)
        ]

    # --- caller buffers: [metadata][data] -----------------------------------------------------

    @returns(None)
    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Read the stored bytes into the buffer; the tensor returned views the buffer."""
        check_key(key)
        dst = view(buffer_ptr, size)
        n = self._conn.c.get_into(key, dst)
        return M.decode(dst[:n], copy=False)

    @returns([])
    def batch_get_tensor_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[Any]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [E.INVALID_PARAMS] * len(keys)  # the wheel (probed 2026-12-05): -600 each
        return [
            self.get_tensor_into(k, p, s) for k, p, s in zip(keys, buffer_ptrs, sizes, strict=True)
        ]

    def _from(self, key: str, ptr: int, size: int, up: bool) -> int:
        check_key(key)
        data = view(ptr, size)
        try:
            M.parse(data)
        except M.TensorFormatError:
            return E.INVALID_PARAMS
        return self._conn.put(key, data, None, upsert=up)

    @returns(int)
    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._from(key, buffer_ptr, size, False)

    @returns(int)
    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._from(key, buffer_ptr, size, True)

    @returns([])
    def batch_put_tensor_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [E.INVALID_PARAMS] * len(keys)
        return [
            self._from(k, p, s, False) for k, p, s in zip(keys, buffer_ptrs, sizes, strict=True)
        ]

    @returns([])
    def batch_upsert_tensor_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [E.INVALID_PARAMS] * len(keys)
        return [self._from(k, p, s, True) for k, p, s in zip(keys, buffer_ptrs, sizes, strict=True)]

    # --- CUDA (left out: kvcake runs on CPU) --------------------------------------------------

    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        log.error("get_tensor_into_cuda: kvcake has no CUDA path")
        return E.INVALID_PARAMS

    def batch_get_tensor_into_cuda(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        log.error("batch_get_tensor_into_cuda: kvcake has no CUDA path")
        return [E.INVALID_PARAMS] * len(keys)

    # --- safetensors --------------------------------------------------------------------------

    def save_tensor_to_safetensor(self, key: str, file_name: str | None = None) -> int:
        if self._conn.client is None:
            return E.INTERNAL_ERROR
        tensor = self.get_tensor(key)
        if tensor is None:
            return FILE_ERROR
        try:
            # lazy: optional dependency (safetensors)
            from safetensors.torch import save_file

            save_file({key: tensor.contiguous()}, file_name or key)
        except Exception as exc:  # safetensors raises its own SafetensorError too
            # The wheel answers -600 when the file cannot be written (a missing directory)
            # or safetensors cannot be imported; -1100 only for a key that holds no tensor.
            log.error("save_tensor_to_safetensor %s: %s", file_name or key, exc)
            return E.INVALID_PARAMS
        return 0

    def load_tensor_from_safetensor(
        self, key: str | None = None, file_name: str | None = None
    ) -> Any:
        """Load ``key`` (or the file's first tensor) from the file and store it under ``key``
        (or ``file_name``); returns the tensor, None on failure. ``file_name`` is required (the
        wheel's signature: ``key=None, file_name``). The tensor is *put*, as the wheel does: a
        key that already exists keeps its value (and the loaded tensor is still returned)."""
        if file_name is None:
            raise TypeError("load_tensor_from_safetensor(): missing argument 'file_name'")
        if self._conn.client is None:
            return None
        try:
            # lazy: optional dependency (safetensors)
            from safetensors.torch import load_file

            tensors = load_file(file_name)
        except (OSError, ValueError, ImportError) as exc:
            log.error("Failed to load tensor from safetensor file: %s", exc)
            return None
        if not tensors:
            return None
        name = key if key in tensors else next(iter(tensors))
        target = key or file_name
        if self.put_tensor(target, tensors[name]) != 0:
            return None
        return tensors[name]
